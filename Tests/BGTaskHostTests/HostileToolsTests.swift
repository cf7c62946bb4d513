import Foundation
import Testing

/// Keeps the hostile tools of `Tests/Hostile/` runnable: each one, in its `--quick` mode (under
/// about 20 s), against this build's `bgtask`, must exit 0 with a last line `PASS ...`. Their
/// full modes (minutes) are run by hand; see docs/isolation.md, "Hostile tools". Serialized: each tool
/// starts a host and loads the machine on its own.
@Suite(.serialized) struct HostileToolsTests {
    static let directory = Products.packageRoot.appendingPathComponent("Tests/Hostile")

    func runTool(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let script = Self.directory.appendingPathComponent(name).path
        let result = try runCommand(["/usr/bin/env", "python3", script, "--quick", "--bgtask", Products.cli],
                                    timeout: .seconds(120))
        let lines = result.stdout.split(separator: "\n").map(String.init)
        let last = lines.last ?? ""
        #expect(result.status == 0, "\(name) --quick exited \(result.status):\n\(result.stdout)\n\(result.stderr)", sourceLocation: sourceLocation)
        #expect(last.hasPrefix("PASS "), "\(name) --quick did not end with a PASS line:\n\(result.stdout)\n\(result.stderr)", sourceLocation: sourceLocation)
    }

    /// Mutated frames on a real host's control socket; it stays alive and answering, and a
    /// request pending from the start stays pending.
    @Test func controlSocketFuzzerPasses() throws {
        try runTool("control_fuzz.py")
    }

    /// Mutated Info.plists and bundle layouts through `bgtask validate` and a host's plugin scan.
    @Test func bundleFuzzerPasses() throws {
        try runTool("bundle_fuzz.py")
    }

    /// A host SIGKILLed under load and restarted: nothing acknowledged lost or doubled, nothing
    /// of a dead host left running.
    @Test func crashLoopPasses() throws {
        try runTool("crash_loop.py")
    }
}
