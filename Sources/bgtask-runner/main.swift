import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import _BGTaskSystemShims

// bgtask-runner: started by the host (or `bgtask run`) with its launch channel on fd 3.
// It is not meant to be run by hand.

nonisolated(unsafe) var hostTable: UnsafeMutablePointer<bgtask_host_api>!

// A zygote serves fork requests until its host goes away; the children it forks return here and
// carry on as ordinary runners.
if CommandLine.arguments.dropFirst().first == "--zygote" {
    ZygoteServer.serve()
} else {
    // A spawned runner: its PID namespace first, while it is the only thread (no thread may
    // start before this line: bgtask_enter_pid_namespace refuses a process that has had one).
    Sandbox.enterPidNamespace()
}
// From here on every launch is an ordinary process (docs/isolation.md, "After fork"): a fork of
// the single-threaded zygote, or the spawned runner itself, pid 2 of its namespace or not.
// Nothing below has to be async-signal-safe.

// Named for ps and for the host, which finds a launch's processes by it (a runner forked by the
// zygote has the zygote's original environment in /proc/PID/environ, not its own).
if let launchID = getenv("BGTASK_LAUNCH_ID") {
    _ = bgtask_set_process_title(CommandLine.unsafeArgv, CommandLine.argc, "bgtask-launch \(String(cString: launchID)) \(getenv("BGTASK_BUNDLE_ID").map { String(cString: $0) } ?? "")")
}

/// A plugin crash must not write a core file into someone's working directory.
var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &noCore)
signal(SIGPIPE, SIG_IGN)
// Orphaned descendants of the plugin (even ones that call setsid) are re-parented to the runner,
// so the supervisor finds every one of them under the runner's pid.
_ = bgtask_set_child_subreaper()
// stdout goes to the launch log, a file: line-buffer it so nothing printed is lost when the
// launch ends abruptly (fatal registration errors, _exit on failure).
setvbuf(stdout, nil, _IOLBF, 0)

let channel = LaunchChannel(fd: 3)

let assignment: LaunchAssignment
do {
    guard let first = try channel.receive(ParentMessage.self) else { _exit(RunnerExitStatus.protocolError) }
    guard case let .start(received) = first else {
        try? channel.send(ChildMessage.launchFailed(error: "protocol: first message was not start"))
        _exit(RunnerExitStatus.protocolError)
    }
    assignment = received
} catch {
    try? channel.send(ChildMessage.launchFailed(error: "protocol: \(error)"))
    _exit(RunnerExitStatus.protocolError)
}

if let backstop = assignment.memoryBackstopBytes {
    var limit = rlimit(rlim_cur: rlim_t(backstop), rlim_max: rlim_t(backstop))
    setrlimit(__rlimit_resource_t(RLIMIT_DATA.rawValue), &limit)
}

runner = Runner(assignment: assignment, channel: channel)
hostTable = makeHostTable()
// What the launch needs of paths it may not reach as its own uid, opened while it is still the
// host's: its Landlock rules and its library (loaded through this descriptor below).
Sandbox.grantLaunchPaths(assignment)
PluginLibrary.open(assignment)
// The app's own user first (what the launch makes is the app's), then the app process, then
// confined: before any other thread exists and before any plugin code runs.
let identityLayer = Sandbox.becomeApp(assignment)
let executablePath = PluginLibrary.executablePath(assignment)
AppProcess.prepare(assignment, executablePath: executablePath)
// In a function, not at top level: Swift 6.3's optimizer (SIL CopyPropagation) crashed on the
// tuple held in a top-level `let` of this file in release builds.
func applyConfinement() {
    var (layers, failure) = Sandbox.apply(assignment)
    layers["uid"] = identityLayer
    runner.report(.sandbox(layers))
    if let failure { launchFailed(failure) }
}
applyConfinement()

// Expiration's thread is made now, not at the deadline (see SerialThread), and its alarm is
// the launch's deadline (see Runner.armDeadline).
runner.expirationQueue.onAlarm = { runner.expireAtDeadline() }
runner.expirationQueue.start()
runner.endTimer.start()
runner.armDeadline()
// Parent messages arrive on their own thread so that expiration reaches a launch whose main
// and handler threads are blocked.
startThread {
    while true {
        let message: ParentMessage?
        do {
            message = try channel.receive(ParentMessage.self)
        } catch let error as ChannelError where error.code == .malformed || error.code == .oversized {
            runner.report(.log(level: BGTASK_LOG_ERROR, message: "runner: ignoring parent frame: \(error)"))
            continue
        } catch {
            runner.channelLost("receive: \(error)")
        }
        guard let message else { runner.parentLost() }
        switch message {
        case .start: continue
        case let .resume(next):
            if !runner.resume(next) {
                runner.report(.log(level: BGTASK_LOG_ERROR, message: "runner: ignoring a resume: the launch is not over"))
            }
        case let .expire(task, _):
            runner.expirationQueue.async { runner.expire(only: task) }
        case let .reply(seq, status, text, requests):
            runner.resolve(seq: seq, status: status, message: text, requests: requests)
        case let .notificationReply(seq, status, text, authorization, notifications):
            runner.resolveNotifications(seq: seq, status: status, message: text, authorization: authorization, notifications: notifications)
        case let .transferReply(seq, status, text, json):
            runner.resolveTransfers(seq: seq, status: status, message: text, json: json)
        case let .transferEvent(json):
            runner.transferEvent(json)
        case let .startTask(task):
            runner.add(task)
        case .close:
            runner.close()
        case .probeChildren:
            runner.report(.children(bgtask_has_children() != 0))
        case let .deadline(expiresAtNs):
            runner.setDeadline(expiresAtNs)
        case let .device(thermalState, lowPowerMode):
            runner.deviceChanged(thermalState: thermalState, lowPowerMode: lowPowerMode)
        case let .notificationDelivered(entry):
            runner.notificationDelivered(entry)
        }
    }
}

func launchFailed(_ error: String) -> Never {
    runner.report(.launchFailed(error: error))
    fflush(stdout)
    _exit(RunnerExitStatus.launchFailed)
}

/// The executable's file name, for errors (not a URL: building one is Foundation work on every
/// launch's path, for a name only a failure needs).
var library: String { String(assignment.executablePath.split(separator: "/").last ?? Substring(assignment.executablePath)) }
runner.report(.loading(path: assignment.executablePath, at: bgtask_monotonic_ns()))
guard let handle = PluginLibrary.load(executablePath) else {
    let reason = dlerror().map { String(cString: $0) } ?? "unknown error"
    launchFailed("dlopen \(assignment.executablePath): \(reason)")
}
guard let entrySymbol = dlsym(handle, BGTASK_ENTRY_SYMBOL) else {
    launchFailed("\(library) does not export the entry symbol '\(BGTASK_ENTRY_SYMBOL)' (see bgtask/plugin.h, or the Swift boilerplate in the README)")
}
let entry = unsafeBitCast(entrySymbol, to: bgtask_plugin_entry_fn.self)
guard let returned = entry() else {
    launchFailed("\(library): \(BGTASK_ENTRY_SYMBOL)() returned NULL instead of a plugin descriptor")
}
// magic, abi_version and size never move (bgtask/plugin.h); the rest is read only as far as the
// plugin says its descriptor goes.
guard returned.pointee.magic == BGTASK_PLUGIN_MAGIC else {
    launchFailed("\(library): \(BGTASK_ENTRY_SYMBOL)() returned a descriptor with magic 0x\(String(returned.pointee.magic, radix: 16)), expected 0x\(String(BGTASK_PLUGIN_MAGIC, radix: 16))")
}
guard returned.pointee.abi_version == BGTASK_ABI_VERSION else {
    launchFailed("ABI version mismatch: \(library) was built for bgtask ABI \(returned.pointee.abi_version), this runner provides ABI \(BGTASK_ABI_VERSION)")
}
let descriptor: bgtask_plugin
do {
    descriptor = try bgtask_plugin.read(from: returned)
} catch {
    launchFailed("\(library): the plugin descriptor is refused: \(error)")
}
guard let launch = descriptor.launch else {
    launchFailed("\(library): the plugin descriptor has no launch function")
}

for mapping in assignment.mappedHandlers {
    guard let function = dlsym(handle, mapping.symbol) else {
        launchFailed("Info.plist BGTaskHandlers maps '\(mapping.identifier)' to '\(mapping.symbol)', which \(library) does not export")
    }
    do {
        let call = try MappedHandlerCall(mapping: mapping, function: function)
        _ = runner.register(mapping.identifier, .mapped(call))
    } catch {
        launchFailed("Info.plist BGTaskHandlers '\(mapping.identifier)': \(error)")
    }
}

var errorBuffer = [CChar](repeating: 0, count: 1024)
/// Lives as long as the process, as the launch info's other strings are read during the call only.
let launchReason = UnsafePointer(strdup(assignment.reason))
let status: Int32 = assignment.withLaunchInfo(reason: launchReason) { info in
    launch(hostTable, nil, &info, &errorBuffer, errorBuffer.count)
}
guard status == 0 else {
    let text = String(decoding: errorBuffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    launchFailed("the launch entry of \(library) returned \(status)\(text.isEmpty ? "" : ": \(text)")")
}

// The launch ends when its work is over and the app has gone quiet (Runner.settle), even if a
// handler is still blocked in app code on another thread.
runner.end = {
    // A process that is not kept ends here: the app hears it first (its delegate may save).
    if !runner.assignment.suspendable { runner.willTerminate() }
    // Nothing the app started outlives its launch. The runner is their subreaper, so even those
    // that called setsid are still in its tree.
    let hadDescendants = killDescendants()
    // UserDefaults changes the app did not synchronize: iOS keeps them (cfprefsd has them).
    _ = bgtask_flush_preferences()
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let peak = UInt64(max(usage.ru_maxrss, 0)) * 1024
    if runner.assignment.suspendable {
        // The process stays: the host suspends it, and the app's next launch resumes it. Idle
        // first, so that the resume the host may send at once is taken.
        runner.becameIdle()
        let cpu = UInt64(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000
        runner.report(.idle(at: bgtask_monotonic_ns(), peakResidentBytes: peak, cpuNanoseconds: cpu, hearsResumes: runner.hearsResumes,
                            wakeups: UInt64(max(usage.ru_nvcsw, 0))))
        fflush(stdout)
        fflush(stderr)
        return
    }
    runner.report(.finished(at: bgtask_monotonic_ns(), descendants: hadDescendants, peakResidentBytes: peak))
    fflush(stdout)
    fflush(stderr)
    // Not exit(): handler threads may still be running app code, and tearing down globals under
    // them could crash a launch that has, in fact, ended well. iOS does not run exit handlers of
    // a background app either.
    _exit(0)
}
runner.startTasks()
AppProcess.runMainThread()
