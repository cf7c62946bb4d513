import ArgumentParser
import BGTaskHost
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
            }
            if findings.contains(where: { !$0.available }) { throw ExitCode.failure }
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
