// The launch's own PID namespace (see bgtask_enter_pid_namespace in the header).
//
// Three processes, because no single one can be both what the host waits for and the app:
//
//   outer (the host's child, what it supervises and reaps; outside the namespace)
//     └─ init (pid 1 of the namespace: reaps, and kills what is left when the app ends)
//          └─ app (pid 2: returns from bgtask_enter_pid_namespace and becomes the launch)
//
// The app cannot be pid 1: a namespace's init ignores every signal it sends itself whose action
// is the default (abort()'s SIGABRT, raise(SIGTERM)), so a crash would not end it as it ends
// any other process. The outer process mirrors the app's end instead: it exits with the app's
// code, or dies of the app's signal, so the host reads the app's wait status and rusage
// (wait4 counts the children each process reaped) exactly as if it had spawned the app.
//
// A mount namespace comes with it, private (nothing propagates back to the host's), with a /proc
// of the new PID namespace: libdispatch opens /proc/TID/stat with the thread ids of the
// namespace, which the host's /proc would resolve to other processes, or none (and trap).
#define _GNU_SOURCE
#include "bgtask_system_shims.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t raw_fork(void) {
    /* Not fork(): libdispatch's atfork handler would mark the child an unsafe fork of a
     * process that used it (the zygote did). The caller is single-threaded. */
    return (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
}

static void write_all(int fd, const void *bytes, size_t length) {
    const char *next = bytes;
    while (length > 0) {
        ssize_t n = write(fd, next, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        next += n;
        length -= (size_t)n;
    }
}

/* pid 1: reaps every process of the namespace; once the app is gone, kills the rest (nothing
 * outlives the launch), reaps them, and tells the outer process how the app ended. */
static _Noreturn void serve_as_init(pid_t app, int status_fd) {
    int app_status = 0;
    int app_ended = 0;
    for (;;) {
        int status = 0;
        pid_t reaped = waitpid(-1, &status, __WALL);
        if (reaped < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: the namespace is empty */
        }
        if (reaped == app) {
            app_status = status;
            app_ended = 1;
        }
        /* The namespace's init may signal all of it but itself. Again after every reap: a
         * process may have forked while the previous kill was on its way. */
        if (app_ended) kill(-1, SIGKILL);
    }
    int message[2] = {app_ended, app_status};
    write_all(status_fd, message, sizeof message);
    _exit(0);
}

/* The outer process: waits for the namespace to end and ends as the app did. */
static _Noreturn void mirror(pid_t init, int status_fd) {
    int message[2] = {0, 0};
    size_t used = 0;
    while (used < sizeof message) {
        ssize_t n = read(status_fd, (char *)message + used, sizeof message - used);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        used += (size_t)n;
    }
    int init_status = 0;
    while (waitpid(init, &init_status, __WALL) < 0 && errno == EINTR) {}
    int status = used == sizeof message && message[0] ? message[1] : init_status;
    if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(sig, SIG_DFL);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

int bgtask_enter_pid_namespace(char *error, size_t error_size) {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
        snprintf(error, error_size, "unshare(CLONE_NEWPID | CLONE_NEWNS): %s%s", strerror(errno),
                 errno == EPERM ? " (a host that is not root cannot make namespaces for its launches)" : "");
        return -1;
    }
    /* From here on this process is committed: its next child is the namespace's init. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        fprintf(stderr, "bgtask-runner: making the launch's mounts private: %s\n", strerror(errno));
        _exit(127);
    }
    int status_pipe[2];
    if (pipe2(status_pipe, O_CLOEXEC) != 0) {
        fprintf(stderr, "bgtask-runner: pipe: %s\n", strerror(errno));
        _exit(127);
    }
    pid_t init = raw_fork();
    if (init < 0) {
        fprintf(stderr, "bgtask-runner: forking the launch's init: %s\n", strerror(errno));
        _exit(127);
    }
    if (init > 0) {
        int keep = status_pipe[0];
        bgtask_close_from_except(0, &keep, 1);
        mirror(init, keep);
    }

    /* init: dies with the outer process (the host kills the launch by killing it, or its
     * group); if that happened before the request took, the read end is closed already. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct pollfd reader = {.fd = status_pipe[1], .events = POLLOUT};
    if (poll(&reader, 1, 0) == 1 && (reader.revents & POLLERR)) _exit(0);
    close(status_pipe[0]);
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
        fprintf(stderr, "bgtask-runner: mounting the launch's /proc: %s\n", strerror(errno));
        _exit(127);
    }
    pid_t app = raw_fork();
    if (app < 0) {
        fprintf(stderr, "bgtask-runner: forking the launch's process: %s\n", strerror(errno));
        _exit(127);
    }
    if (app > 0) {
        int keep = status_pipe[1];
        bgtask_close_from_except(0, &keep, 1);
        serve_as_init(app, keep);
    }
    close(status_pipe[1]);
    return 0;
}
