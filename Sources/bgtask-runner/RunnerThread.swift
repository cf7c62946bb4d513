import BGTaskModel
import BGTaskWire
import Glibc

/// Starts a detached POSIX thread running `body`.
///
/// Not Foundation's `Thread`: its start names the new thread from `Thread.name` (a String
/// built and validated in every launch) and registers it with Foundation; a launch's parent
/// reader needs none of that, and its start is on the launch's path.
func startThread(_ body: @escaping () -> Void) {
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    var thread = pthread_t()
    let started = pthread_create(&thread, &attributes, { raw in
        let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
        body.run()
        return nil
    }, box)
    guard started == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
        var text = "bgtask-runner: cannot start a thread: \(String(cString: strerror(started)))\n"
        text.withUTF8 { _ = write(STDERR_FILENO, $0.baseAddress, $0.count) }
        _exit(RunnerExitStatus.launchFailed)
    }
}

private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}
