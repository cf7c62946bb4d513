import ArgumentParser
import BGTaskHost
import BGTaskLaunch
import Foundation

extension BGTaskCommand {
    struct Doctor: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Say which confinement layers this machine gives launches, and how to get the rest.",
            discussion: """
                Each launch's record lists the layers it had (`sandbox`); this says what the \
                kernel and the privileges at hand allow, before any launch. Exit status 0 when \
                every layer is available, 1 otherwise.
                """)

        @Flag(name: .long, help: "Print the findings as one JSON array.")
        var json = false

        func run() throws {
            let findings = ConfinementProbe.findings()
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                FileHandle.standardOutput.write(try encoder.encode(findings) + Data("\n".utf8))
            } else {
                print(Self.header())
                for finding in findings {
                    print("\(finding.available ? "yes" : "no ")  \(finding.layer): \(finding.detail)")
                    if let remedy = finding.remedy { print("     to get it: \(remedy)") }
                }
                // Not a confinement layer (it does not change the exit status): how the hosts'
                // per-app disk quotas are enforced on the default state directory's filesystem.
                print("disk quotas: \(ProjectQuotas.enforcement(Self.defaultStateDirectory()))")
                // Nor is this: what a host's app lifecycle (suspended apps) has to work with.
                print("app lifecycle: \(AppLifecycleProbe.summary())")
            }
            if findings.contains(where: { !$0.available }) { throw ExitCode.failure }
        }

        /// The default state directory (`StateOptions.stateDirectory` without --state), or its
        /// nearest existing ancestor: where a host would keep the apps' containers.
        static func defaultStateDirectory() -> String {
            let environment = ProcessInfo.processInfo.environment
            var path = environment["BGTASK_STATE"].flatMap { $0.isEmpty ? nil : $0 }
                ?? environment["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 + "/bgtask" }
                ?? FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".local/state/bgtask").path
            while !FileManager.default.fileExists(atPath: path), path.count > 1 {
                path = (path as NSString).deletingLastPathComponent
            }
            return path
        }

        /// `bgtask 0.1.0 on Linux 6.1.0-18-amd64 (x86_64), uid 1000`: what a bug report needs first.
        static func header() -> String {
            var names = utsname()
            uname(&names)
            func text<T>(_ field: T) -> String {
                withUnsafeBytes(of: field) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            }
            return "bgtask \(BGTaskVersion.current) on \(text(names.sysname)) \(text(names.release)) (\(text(names.machine))), uid \(geteuid())"
        }
    }
}
