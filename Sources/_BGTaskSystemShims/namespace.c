// The launch's own PID namespace (see bgtask_clone_parent_namespaced in the header).
//
// Three processes, because no single one can be both what the host waits for and the app:
//
//   outer (the host's child, what it supervises and reaps; outside the namespace)
//     └─ init (pid 1 of the namespace: reaps, and kills what is left when the app ends)
//          └─ app (pid 2: the zygote's spare, or the spawned runner, carrying on)
//
// The app cannot be pid 1: a namespace's init ignores every signal it sends itself whose action
// is the default (abort()'s SIGABRT, raise(SIGTERM)), so a crash would not end it as it ends
// any other process. The outer process mirrors the app's end instead: it exits with the app's
// code, or dies of the app's signal, so the host reads the app's wait status and rusage
// (wait4 counts the children each process reaped) exactly as if it had spawned the app.
//
// A fork costs this machine 300-500 µs (page tables copied), so only the app is one. The outer
// process and the init share the memory of the process that makes them (CLONE_VM: tens of
// µs) and run on small stacks of their own, in C, with raw system calls only (errno is that
// process's thread-local variable; they must not write it) and every signal blocked. The app is
// forked by the init while the maker waits: its memory is the maker's, stopped in
// `enter`, and it resumes there (siglongjmp to the maker's frame) as if the maker had
// returned from a fork.
//
// A mount namespace comes with it, private (nothing propagates back to the host's), with a /proc
// of the new PID namespace: libdispatch opens /proc/TID/stat with the thread ids of the
// namespace, which the host's /proc would resolve to other processes, or none (and trap).
//
// After the clone (docs/isolation.md, "After fork"): each function says whether it is
// async-signal-safe. The outer process and the init need more than that: they share the maker's
// memory *and its thread-local storage* (no CLONE_SETTLS), so they touch no errno, no heap, no
// lock, no stdio: raw system calls, and glibc's clone() stub, only. The app is a fork of the
// maker, which is single-threaded (checked: `maker_is_single_threaded`) and waits in `read`, so
// no lock is held in its copy; it runs only close and munmap before `enter` returns 0, and is an
// ordinary process from there.
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE /* siglongjmp from the init's stack to the maker's */
#include "bgtask_system_shims.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#endif
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// MARK: Raw system calls (no errno: -error on failure)

/* Async-signal-safe: yes (one system call instruction: no errno, no thread-local storage) */
static inline long raw6(long n, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
#else
#error "namespace.c: raw system calls are written for x86_64 and aarch64"
#endif
}
/* Async-signal-safe: yes */
static inline long raw0(long n) { return raw6(n, 0, 0, 0, 0, 0, 0); }
/* Async-signal-safe: yes */
static inline long raw1(long n, long a) { return raw6(n, a, 0, 0, 0, 0, 0); }
/* Async-signal-safe: yes */
static inline long raw2(long n, long a, long b) { return raw6(n, a, b, 0, 0, 0, 0); }
/* Async-signal-safe: yes */
static inline long raw3(long n, long a, long b, long c) { return raw6(n, a, b, c, 0, 0, 0); }
/* Async-signal-safe: yes */
static inline long raw4(long n, long a, long b, long c, long d) { return raw6(n, a, b, c, d, 0, 0); }

/* Async-signal-safe: yes */
static _Noreturn void raw_exit(int code) {
    for (;;) raw1(SYS_exit, code);
}

// MARK: The context the three share

enum { STEP_UNSHARE = 1, STEP_PRIVATE, STEP_INIT, STEP_PROC, STEP_APP };

struct message {
    int32_t step;  /* 0: the app is forked; else the step that failed */
    int32_t error; /* its errno */
};

struct context {
    sigjmp_buf resume;         /* the maker's frame, where the app resumes */
    int ready[2];              /* init (or outer) → maker: a struct message */
    int status[2];             /* init → outer: the app's wait status */
    volatile pid_t init_pid;   /* as the outer process sees it (written by the kernel) */
    int outer_pidfd;           /* the outer process, for the init to see it is still there */
    int original_mounts;       /* the mount namespace the outer process goes back to */
    char *outer_stack_top;
    char *init_stack_top;
};

#define STACK_SIZE (32 * 1024)
#define REGION_SIZE (sizeof(struct context) + 2 * STACK_SIZE + 4096)

/* Async-signal-safe: yes */
static void report(struct context *context, int step, long error) {
    struct message message = {step, (int32_t)-error};
    raw3(SYS_write, context->ready[1], (long)&message, sizeof message);
}

/* Async-signal-safe: yes */
static void block_signals(void) {
    uint64_t all = ~(uint64_t)0;
    raw4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, 0, 8);
}

// MARK: init (pid 1)

/* Reaps every process of the namespace; once the app is gone, kills the rest (nothing outlives
 * the launch), reaps them, and tells the outer process how the app ended.
 * Async-signal-safe: yes (raw system calls only: it runs in the maker's memory) */
static _Noreturn void serve_as_init(pid_t app, int status_fd) {
    int app_status = 0;
    int app_ended = 0;
    for (;;) {
        int status = 0;
        long reaped = raw4(SYS_wait4, -1, (long)&status, __WALL, 0);
        if (reaped == -EINTR) continue;
        if (reaped < 0) break; /* ECHILD: the namespace is empty */
        if (reaped == app) {
            app_status = status;
            app_ended = 1;
        }
        /* The namespace's init may signal all of it but itself. Again after every reap: a
         * process may have forked while the previous kill was on its way. */
        if (app_ended) raw2(SYS_kill, -1, SIGKILL);
    }
    int message[2] = {app_ended, app_status};
    raw3(SYS_write, status_fd, (long)message, sizeof message);
    raw_exit(0);
}

/* The init (pid 1), on its own stack in the maker's memory: /proc, then the app.
 * Async-signal-safe: yes (raw system calls only; the app, a private copy of that memory,
 * leaves through siglongjmp, async-signal-safe since POSIX.1-2016, built without
 * _FORTIFY_SOURCE's stack check, which would refuse the jump to another stack) */
static int init_main(void *argument) {
    struct context *context = argument;
    block_signals();
    /* Dies with the outer process (the host kills a launch by its process group, and the
     * outer process is its leader), and then so does the whole namespace. */
    raw2(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);
    /* Gone before that took (killed with its group a moment after it made this one)? */
    struct pollfd outer = {.fd = context->outer_pidfd, .events = POLLIN};
    if (context->outer_pidfd >= 0 && raw3(SYS_poll, (long)&outer, 1, 0) != 0) raw_exit(0);
    long rc = raw6(SYS_mount, (long)"proc", (long)"/proc", (long)"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0, 0);
    if (rc < 0) {
        report(context, STEP_PROC, rc);
        raw_exit(127);
    }
    /* The app: a real fork, of the maker's memory as it waits in `enter`. */
    long app = raw6(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0);
    if (app == 0) siglongjmp(context->resume, 1);
    if (app < 0) {
        report(context, STEP_APP, app);
        raw_exit(127);
    }
    report(context, 0, 0);
    /* Nothing of the maker's but the status pipe's write end (as descriptor 1000). */
    raw3(SYS_dup3, context->status[1], 1000, 0);
    raw3(SYS_close_range, 0, 999, 0);
    raw3(SYS_close_range, 1001, ~0U, 0);
    serve_as_init((pid_t)app, 1000);
}

// MARK: outer

/* Waits for the namespace to end and ends as the app did.
 * Async-signal-safe: yes (raw system calls only) */
static _Noreturn void mirror(pid_t init, int status_fd) {
    int message[2] = {0, 0};
    size_t used = 0;
    while (used < sizeof message) {
        long n = raw3(SYS_read, status_fd, (long)message + (long)used, (long)(sizeof message - used));
        if (n == -EINTR) continue;
        if (n <= 0) break;
        used += (size_t)n;
    }
    int init_status = 0;
    while (raw4(SYS_wait4, init, (long)&init_status, __WALL, 0) == -EINTR) {}
    int status = used == sizeof message && message[0] ? message[1] : init_status;
    if (WIFEXITED(status)) raw_exit(WEXITSTATUS(status));
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    struct rlimit no_core = {0, 0};
    raw4(SYS_prlimit64, 0, RLIMIT_CORE, (long)&no_core, 0);
    /* The kernel's sigaction: handler, flags, restorer, mask. */
    struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } action = {SIG_DFL, 0, 0, 0};
    raw4(SYS_rt_sigaction, sig, (long)&action, 0, 8);
    uint64_t none = 0;
    raw4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, 8);
    raw2(SYS_kill, raw0(SYS_getpid), sig);
    raw_exit(128 + sig);
}

/* glibc's clone: the init runs init_main on its own stack, touching no thread state; the
 * kernel writes its pid (as the outer process sees it) into the context before either runs.
 * Called by the outer process. Returns the init's pid, or -errno.
 * Async-signal-safe: yes (a raw pidfd_open and glibc's clone(), a system-call stub whose child
 * side touches no thread state; only on failure does it write errno, which in the outer process
 * is the maker's, and which nothing reads then: the failure goes through the ready pipe) */
static long start_init(struct context *context) {
    context->outer_pidfd = (int)raw2(SYS_pidfd_open, raw0(SYS_getpid), 0);
    int init = clone(init_main, context->init_stack_top, CLONE_VM | CLONE_PARENT_SETTID | SIGCHLD, context,
                     (pid_t *)&context->init_pid);
    return init < 0 ? -ENOMEM : init;
}

/* The outer process once the app exists: keeps nothing but the status pipe's read end.
 * Async-signal-safe: yes (raw system calls only) */
static _Noreturn void outer_mirror(struct context *context) {
    block_signals();
    raw3(SYS_dup3, context->status[0], 1000, 0);
    raw3(SYS_close_range, 0, 999, 0);
    raw3(SYS_close_range, 1001, ~0U, 0);
    mirror(context->init_pid, 1000);
}

/* The outer process leaves the launch's mount namespace once the init is in it: the last
 * process to leave a mount namespace tears it down (every mount it copied, and its /proc), and
 * that must not be the outer process, whose reap is the launch's end (a watchdog kill is
 * measured to it). The init's exit pays instead, after the outer process has read its report. */
/* Async-signal-safe: yes (raw system calls only) */
static void remember_mounts(struct context *context) {
    context->original_mounts = (int)raw4(SYS_openat, AT_FDCWD, (long)"/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC, 0);
}

/* Async-signal-safe: yes (raw system calls only) */
static void leave_mounts(struct context *context) {
    if (context->original_mounts < 0) return;
    raw2(SYS_setns, context->original_mounts, CLONE_NEWNS);
    raw1(SYS_close, context->original_mounts);
}

/* The namespaces, then the init: by the outer process (a zygote's spare: a CLONE_VM child of
 * the zygote, on its own stack), or by a spawned runner itself. 0, or -errno and the step.
 * Async-signal-safe: yes (raw system calls only) */
static long make_namespaces(int *step) {
    long rc = raw1(SYS_unshare, CLONE_NEWPID | CLONE_NEWNS);
    if (rc < 0) {
        *step = STEP_UNSHARE;
        return rc;
    }
    rc = raw6(SYS_mount, 0, (long)"/", 0, MS_REC | MS_PRIVATE, 0, 0);
    if (rc < 0) *step = STEP_PRIVATE;
    return rc;
}

/* The outer process of a zygote's launch, on its own stack in the zygote's memory.
 * Async-signal-safe: yes (raw system calls and start_init only) */
static int outer_main(void *argument) {
    struct context *context = argument;
    block_signals();
    raw2(SYS_setpgid, 0, 0);
    remember_mounts(context);
    int step = 0;
    long rc = make_namespaces(&step);
    if (rc < 0) {
        report(context, step, rc);
        raw_exit(127);
    }
    rc = start_init(context);
    if (rc < 0) {
        report(context, STEP_INIT, rc);
        raw_exit(127);
    }
    leave_mounts(context);
    outer_mirror(context);
}

// MARK: The maker

/* Async-signal-safe: yes (the maker's, for its error) */
static const char *step_name(int step) {
    switch (step) {
    case STEP_UNSHARE: return "unshare(CLONE_NEWPID | CLONE_NEWNS)";
    case STEP_PRIVATE: return "making the launch's mounts private";
    case STEP_INIT: return "starting the namespace's init";
    case STEP_PROC: return "mounting the namespace's /proc";
    case STEP_APP: return "forking the app";
    default: return "?";
    }
}

/* Regions (a context and two stacks) of outer and init processes that share this process's
 * memory and may still run: freed once both have exited (their pidfds are readable). */
struct region {
    void *region;
    int outer_fd, init_fd;
};
static struct region *regions;
static int region_count, region_capacity;

/* 1 once the process behind `pidfd` has exited; never for a missing pidfd (its stack may be
 * in use: better kept mapped than freed under a running process).
 * Async-signal-safe: yes */
static int has_exited(int pidfd) {
    if (pidfd < 0) return 0;
    struct pollfd poller = {.fd = pidfd, .events = POLLIN};
    return poll(&poller, 1, 0) == 1;
}

/* Async-signal-safe: no — edits `regions`, which `enter` grows with realloc; the zygote calls
 * it between forks, never in a child. */
void bgtask_release_namespace_stacks(void) {
    for (int i = 0; i < region_count;) {
        if (has_exited(regions[i].outer_fd) && has_exited(regions[i].init_fd)) {
            if (regions[i].outer_fd >= 0) close(regions[i].outer_fd);
            if (regions[i].init_fd >= 0) close(regions[i].init_fd);
            munmap(regions[i].region, REGION_SIZE);
            regions[i] = regions[--region_count];
        } else {
            i++;
        }
    }
}

/* Async-signal-safe: yes (the app runs it as it resumes) */
static void close_pipes(struct context *context) {
    close(context->ready[0]);
    close(context->ready[1]);
    close(context->status[0]);
    close(context->status[1]);
}

/* 1 unless glibc says this process has ever had a second thread (it clears the flag at the
 * first pthread_create and does not set it again when threads exit): a byte read, no /proc. The
 * app is the maker's memory copied by a raw clone, without fork's handlers (glibc's own, and
 * every library's pthread_atfork), and the outer and init processes run in that memory: a lock
 * another thread held there would be held for good.
 * Async-signal-safe: yes */
static int maker_is_single_threaded(void) {
#if __has_include(<sys/single_threaded.h>)
    return __libc_single_threaded != 0;
#else
    return 1; /* glibc before 2.32: the host's thread count at the zygote's start is the check */
#endif
}

/* Makes the three processes; returns in the maker (the outer pid, or -1 and `error`) and, as
 * 0, in the app. `outer_is_maker` (a spawned runner): the maker makes the namespaces itself and
 * becomes the outer process (it never returns, but with -1 when it could not unshare).
 * Async-signal-safe: no — the maker's side fflushes stdio, formats errors (snprintf, strerror,
 * fprintf) and grows `regions` (realloc): it runs in a single-threaded maker (checked first).
 * The app's side, from sigsetjmp's second return, is close and munmap only. */
static pid_t enter(int outer_is_maker, char *error, size_t error_size) {
    if (!maker_is_single_threaded()) {
        snprintf(error, error_size, "this process has had a second thread: its memory cannot be copied into a "
                                    "launch's namespace without fork's handlers");
        return -1;
    }
    if (!outer_is_maker) bgtask_release_namespace_stacks();
    fflush(NULL);
    char *region = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (region == MAP_FAILED) {
        snprintf(error, error_size, "mmap: %s", strerror(errno));
        return -1;
    }
    struct context *context = (struct context *)region;
    memset(context, 0, sizeof *context);
    uintptr_t stacks = ((uintptr_t)region + sizeof *context + 15) & ~(uintptr_t)15;
    context->outer_stack_top = (char *)(stacks + STACK_SIZE);
    context->init_stack_top = (char *)(stacks + 2 * STACK_SIZE);
    if (pipe2(context->ready, O_CLOEXEC) != 0) {
        snprintf(error, error_size, "pipe2: %s", strerror(errno));
        munmap(region, REGION_SIZE);
        return -1;
    }
    if (pipe2(context->status, O_CLOEXEC) != 0) {
        snprintf(error, error_size, "pipe2: %s", strerror(errno));
        close(context->ready[0]);
        close(context->ready[1]);
        munmap(region, REGION_SIZE);
        return -1;
    }
    if (sigsetjmp(context->resume, 1) != 0) {
        /* The app, in its own copy of the maker's memory: nothing of the machinery is its. */
        close_pipes((struct context *)region);
        if (((struct context *)region)->outer_pidfd >= 0) close(((struct context *)region)->outer_pidfd);
        if (((struct context *)region)->original_mounts >= 0) close(((struct context *)region)->original_mounts);
        munmap(region, REGION_SIZE);
        return 0;
    }
    pid_t outer;
    context->original_mounts = -1;
    if (outer_is_maker) {
        remember_mounts(context);
        int step = 0;
        long rc = make_namespaces(&step);
        if (rc < 0 && step == STEP_UNSHARE) {
            snprintf(error, error_size, "%s: %s%s", step_name(step), strerror((int)-rc),
                     rc == -EPERM ? " (a host that is not root cannot make namespaces for its launches)" : "");
            close_pipes(context);
            if (context->original_mounts >= 0) close(context->original_mounts);
            munmap(region, REGION_SIZE);
            return -1;
        }
        if (rc < 0) {
            /* Committed: the next child of this process would be the namespace's init. */
            fprintf(stderr, "bgtask-runner: %s: %s\n", step_name(step), strerror((int)-rc));
            _exit(127);
        }
        /* The init shares this process's memory and forks the app from it while this waits. */
        if (start_init(context) < 0) {
            fprintf(stderr, "bgtask-runner: starting the launch's init: %s\n", strerror(errno));
            _exit(127);
        }
        outer = getpid();
    } else {
        outer = clone(outer_main, context->outer_stack_top, CLONE_PARENT | CLONE_VM | SIGCHLD, context);
        if (outer < 0) {
            snprintf(error, error_size, "clone: %s", strerror(errno));
            close_pipes(context);
            munmap(region, REGION_SIZE);
            return -1;
        }
    }
    /* The write end stays with the machinery only: end of stream if it died before saying.
     * Nothing but the read and the close until the app is forked: the app is a copy of this
     * process's memory as it is now. */
    close(context->ready[1]);
    struct message message = {-1, 0};
    ssize_t n;
    do {
        n = read(context->ready[0], &message, sizeof message);
    } while (n < 0 && errno == EINTR);
    close(context->ready[0]);
    if (n != (ssize_t)sizeof message || message.step != 0) {
        if (n == (ssize_t)sizeof message)
            snprintf(error, error_size, "%s: %s", step_name(message.step), strerror(message.error));
        else
            snprintf(error, error_size, "the launch's namespace machinery died before it said why");
        if (outer_is_maker) {
            fprintf(stderr, "bgtask-runner: %s\n", error);
            _exit(127);
        }
        close(context->status[0]);
        close(context->status[1]);
        /* The outer process is the host's child (CLONE_PARENT): the host reaps it. The stacks
         * stay mapped: the init may still be running on its way out. */
        return -1;
    }
    if (outer_is_maker) {
        leave_mounts(context);
        outer_mirror(context);
    }
    close(context->status[0]);
    close(context->status[1]);
    if (region_count == region_capacity) {
        int capacity = region_capacity ? 2 * region_capacity : 64;
        struct region *grown = realloc(regions, (size_t)capacity * sizeof *grown);
        if (grown) {
            regions = grown;
            region_capacity = capacity;
        }
    }
    if (region_count < region_capacity) {
        regions[region_count].region = region;
        regions[region_count].outer_fd = bgtask_pidfd_open(outer);
        regions[region_count].init_fd = bgtask_pidfd_open(context->init_pid);
        region_count++;
    } /* else (no memory): left mapped */
    return outer;
}

/* Async-signal-safe: no — see `enter`: called first thing by a spawned runner, single-threaded. */
int bgtask_enter_pid_namespace(char *error, size_t error_size) {
    return enter(1, error, error_size) == 0 ? 0 : -1;
}

/* Async-signal-safe: no — see `enter`: called by the single-threaded zygote. */
pid_t bgtask_clone_parent_namespaced(char *error, size_t error_size) {
    return enter(0, error, error_size);
}

/* Async-signal-safe: no — snprintf and strerror in the caller (the zygote, or the host's
 * threads: `bgtask doctor`); the throwaway child runs raw system calls only, so a multi-threaded
 * caller is fine. */
int bgtask_namespaces_available(char *error, size_t error_size) {
    /* A throwaway child tries; the caller's own namespaces stay as they are. */
    pid_t child = (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
    if (child == 0) {
        long rc = raw1(SYS_unshare, CLONE_NEWPID | CLONE_NEWNS);
        raw_exit(rc < 0 ? (int)-rc : 0);
    }
    if (child < 0) {
        snprintf(error, error_size, "fork: %s", strerror(errno));
        return 0;
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : EINVAL;
    if (code == 0) return 1;
    snprintf(error, error_size, "unshare(CLONE_NEWPID | CLONE_NEWNS): %s%s", strerror(code),
             code == EPERM ? " (a host that is not root cannot make namespaces for its launches)" : "");
    return 0;
}
