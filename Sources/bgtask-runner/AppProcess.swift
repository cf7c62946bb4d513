import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import _BGTaskSystemShims

/// What makes a runner an iOS app process as far as app code can tell, set up before any plugin
/// code runs (its constructors included): `Bundle.main` is the app's (or the extension's)
/// bundle, `UserDefaults(suiteName:)` of an app group lives in the group's container, and the
/// main thread serves the main dispatch queue and the main run loop. The container's paths come
/// from the environment the host gave the launch (`AppContainer.environment`).
enum AppProcess {
    /// Called on the main thread once the launch is known, before the plugin is loaded.
    /// `executablePath` is the one the launch reaches its executable by (`PluginLibrary`).
    static func prepare(_ assignment: LaunchAssignment, executablePath: String) {
        // Bundle.main is built on first use from the process's executable path: the bundle's
        // executable instead of the runner's. The zygote never asks for the main bundle, so no
        // child inherits one built for the runner (LaunchTests checks both launch paths).
        if bgtask_set_main_executable(executablePath) != 0 {
            runner.report(.log(level: BGTASK_LOG_ERROR, message: "runner: this Foundation does not export _CFGetProcessPath; Bundle.main is the runner's, not \(assignment.bundleIdentifier)'s"))
        }
        for group in assignment.appGroups {
            linkGroupPreferences(group, container: assignment.dataDirectory)
        }
        runner.scheduleHandler = { DispatchQueue.main.async(execute: $0) }
    }

    /// The main thread's life once the launch entry has returned: the main run loop, which on
    /// the main thread also drains the main dispatch queue (and with it the main actor's jobs,
    /// `OperationQueue.main`, timers and `perform`). It never returns: the launch ends in
    /// `Runner.finish`, on whichever thread ends the last task.
    static func runMainThread() -> Never {
        while true {
            _ = RunLoop.main.run(mode: .default, before: .distantFuture)
        }
    }

    /// CoreFoundation keeps `UserDefaults(suiteName: "group.x")` in the process's preferences
    /// directory (the app's `Library/Preferences/group.x.plist`); iOS keeps it in the group's
    /// container, where the app and its extensions share it. A symbolic link from the first to
    /// the second makes them one file: CoreFoundation on Linux writes preferences in place
    /// (open with O_TRUNC, which follows the link), not by rename. A plain file already there
    /// (written before the app had the entitlement) moves into the group when the group has none.
    static func linkGroupPreferences(_ group: AppGroup, container: String) {
        let link = AppContainer.preferencesFile(in: container, domain: group.identifier)
        let target = AppContainer.preferencesFile(in: group.directory, domain: group.identifier)
        var info = stat()
        if lstat(link, &info) == 0 {
            if info.st_mode & S_IFMT == S_IFLNK, destination(of: link) == target { return }
            if info.st_mode & S_IFMT == S_IFREG, access(target, F_OK) != 0, rename(link, target) == 0 {
                // moved: the link takes its place below
            } else {
                unlink(link)
            }
        }
        if symlink(target, link) != 0 {
            runner.report(.log(level: BGTASK_LOG_ERROR, message: "runner: cannot link \(link) to the app group's preferences (\(String(cString: strerror(errno)))); UserDefaults(suiteName: \"\(group.identifier)\") stays private to \(runner.assignment.bundleIdentifier)"))
        }
    }

    private static func destination(of link: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink(link, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
