// Misbehaving: a plugin that breaks the rules on purpose, one way per identifier (or, selected by
// BGTASK_FIXTURE_MODE, one way per launch), so the host's handling of each can be tested.
//
//   (unset) / normal      registers every com.example.misbehaving.* handler below
//   register-twice        registers com.example.misbehaving.ok twice in the entry
//   throw-in-entry        the entry throws "Misbehaving: entry refused to launch"
//   register-unpermitted  registers com.example.not.permitted (prints what register returned),
//                         then com.example.misbehaving.ok
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "Misbehaving") { _ in
        let mode = ProcessInfo.processInfo.environment["BGTASK_FIXTURE_MODE"] ?? "normal"
        switch mode {
        case "", "normal":
            Misbehaving.registerAll()
        case "register-twice":
            Misbehaving.registerOK()
            Misbehaving.registerOK()
        case "throw-in-entry":
            throw EntryRefused()
        case "register-unpermitted":
            let registered = BGTaskScheduler.shared.register(
                forTaskWithIdentifier: "com.example.not.permitted", using: nil
            ) { task in task.setTaskCompleted(success: true) }
            print("misbehaving: register(com.example.not.permitted) returned \(registered)")
            Misbehaving.registerOK()
        default:
            throw UnknownMode(mode: mode)
        }
    }
}

struct EntryRefused: Error, CustomStringConvertible, LocalizedError {
    var description: String { "Misbehaving: entry refused to launch" }
    var errorDescription: String? { description }
}

struct UnknownMode: Error, CustomStringConvertible, LocalizedError {
    var mode: String
    var description: String { "Misbehaving: unknown BGTASK_FIXTURE_MODE '\(mode)'" }
    var errorDescription: String? { description }
}

enum Misbehaving {
    static let prefix = "com.example.misbehaving."

    static func register(_ name: String, _ handler: @escaping (BGTask) -> Void) {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: prefix + name, using: nil, launchHandler: handler)
    }

    static func registerOK() {
        register("ok") { task in
            print("misbehaving: ok completes with success")
            task.setTaskCompleted(success: true)
        }
    }

    static func registerAll() {
        registerOK()

        // Never completes; completes unsuccessfully only when expired.
        register("never") { task in
            print("misbehaving: never will not complete until expired")
            task.expirationHandler = {
                print("misbehaving: never expired, completing with false")
                task.setTaskCompleted(success: false)
            }
        }

        // Never completes and sets no expiration handler: the host has to end it.
        register("noexpiry") { _ in
            print("misbehaving: noexpiry will never complete and has no expiration handler")
        }

        register("fail") { task in
            print("misbehaving: fail completes with success false")
            task.setTaskCompleted(success: false)
        }

        // Only the first completion counts.
        register("twice") { task in
            print("misbehaving: twice completes true, true, then false")
            task.setTaskCompleted(success: true)
            task.setTaskCompleted(success: true)
            task.setTaskCompleted(success: false)
        }

        // Registering after launch ends the launch, as on iOS: register does not return.
        register("late-register") { task in
            print("misbehaving: late-register registers \(prefix)late after launch")
            let registered = BGTaskScheduler.shared.register(
                forTaskWithIdentifier: prefix + "late", using: nil
            ) { late in late.setTaskCompleted(success: true) }
            print("misbehaving: late-register: register returned \(registered) (the launch should have ended)")
            task.setTaskCompleted(success: true)
        }
    }
}
