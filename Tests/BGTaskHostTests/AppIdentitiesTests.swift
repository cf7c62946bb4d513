@testable import BGTaskHost
import BGTaskLaunch
import Foundation
import Testing

/// The app identity table (`STATE/app-ids`) that a host and a `bgtask run` on the same state
/// directory share: each reads again only when the other has appended, and both agree.
@Suite struct AppIdentitiesTests {
    @Test func twoTablesOnOneFileAgreeAndNeverReuseAnID() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        let host = AppIdentities(stateDirectory: scratch.state)
        let other = AppIdentities(stateDirectory: scratch.state)
        let a = try host.uid(forApp: "com.example.a")
        let b = try other.uid(forApp: "com.example.b")
        #expect(a != b, "the second table read the first's allocation")
        #expect(try other.uid(forApp: "com.example.a") == a)
        // The host's own appends do not make it read again; the other's do.
        var seen = Set([a, b])
        for index in 0..<50 {
            let table = index % 3 == 0 ? other : host
            let id = try table.uid(forApp: "com.example.app\(index)")
            #expect(seen.insert(id).inserted, "id \(id) given twice")
        }
        #expect(try host.uid(forApp: "com.example.b") == b)
        #expect(try host.gid(forGroup: "group.example") != (try host.uid(forApp: "com.example.a")))
        // A third table reads everything the two wrote.
        let third = AppIdentities(stateDirectory: scratch.state)
        #expect(try third.uid(forApp: "com.example.app49") == (try host.uid(forApp: "com.example.app49")))
    }
}
