/* Linux calls Swift's Glibc module does not expose (they need _GNU_SOURCE or have no libc
 * wrapper on glibc 2.36). Not API: used by BGTaskHost and the runner only.
 *
 * Every function here says whether it is async-signal-safe (`Async-signal-safe: yes`, or
 * `Async-signal-safe: no — why, and why that is fine where it is called`): what may run in a
 * child between fork and the point where it is an ordinary process, see docs/isolation.md,
 * "After fork". AsyncSignalSafetyTests fails when a declaration here has no such line. */
#ifndef BGTASK_SYSTEM_SHIMS_H
#define BGTASK_SYSTEM_SHIMS_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/resource.h>
#include <poll.h>

/* Spawns `path` as the leader of a new process group with `channel_fd` as fd 3 (none when
 * negative), `stdin_fd`, `out_fd` and `err_fd` as 0/1/2 and every other descriptor closed;
 * signal mask cleared and all signals at their default. Returns 0 and sets *pid, or an errno
 * value.
 * Async-signal-safe: no — posix_spawn's file actions allocate; the host calls it from its
 * threads (glibc's posix_spawn does the child's side itself, with nothing of ours after the
 * clone). */
int bgtask_spawn(const char *path, char *const argv[], char *const envp[],
                 int channel_fd, int stdin_fd, int out_fd, int err_fd, pid_t *pid);

/* pidfd_open(2); -1 and errno on failure.
 * Async-signal-safe: yes */
int bgtask_pidfd_open(pid_t pid);

/* waitid(P_PIDFD) is not needed: wait4 gives rusage. Returns wait4's result.
 * Async-signal-safe: yes */
pid_t bgtask_wait4(pid_t pid, int *status, int options, struct rusage *usage);

/* True once `pid` (a child) has exited and can be reaped; does not reap it. For kernels
 * without pidfd.
 * Async-signal-safe: yes */
int bgtask_has_exited(pid_t pid);

/* WIFEXITED & co. are macros Swift cannot call. */
/* Async-signal-safe: yes */
int bgtask_wifexited(int status);
/* Async-signal-safe: yes */
int bgtask_wexitstatus(int status);
/* Async-signal-safe: yes */
int bgtask_wifsignaled(int status);
/* Async-signal-safe: yes */
int bgtask_wtermsig(int status);

/* Makes the caller a child subreaper (prctl PR_SET_CHILD_SUBREAPER).
 * Async-signal-safe: yes */
int bgtask_set_child_subreaper(void);
/* Asks for SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG).
 * Async-signal-safe: yes */
int bgtask_set_parent_death_signal(int sig);

/* SO_PEERCRED of a connected Unix socket. 0, or -1 and errno.
 * Async-signal-safe: yes */
int bgtask_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* accept4(fd, NULL, NULL, SOCK_CLOEXEC).
 * Async-signal-safe: yes */
int bgtask_accept_cloexec(int fd);

/* pipe2(fds, O_CLOEXEC).
 * Async-signal-safe: yes */
int bgtask_pipe_cloexec(int fds[2]);

/* ppoll with a timeout in nanoseconds (negative: none).
 * Async-signal-safe: yes */
int bgtask_poll_ns(struct pollfd *fds, unsigned long count, int64_t timeout_ns);

/* The calling thread's id (gettid(2)).
 * Async-signal-safe: yes */
int bgtask_thread_id(void);

/* CLOCK_MONOTONIC in nanoseconds: the same clock in every process of the machine.
 * Async-signal-safe: yes */
uint64_t bgtask_monotonic_ns(void);

/* Rewrites this process's argument area (argv[0] through the end of argv[argc - 1], as the
 * kernel laid it out), so /proc/PID/cmdline (and ps) shows `title`, truncated to the area's
 * size. 0, or -1. Reads nothing from /proc: every /proc/PID entry a process's life creates
 * makes its reaping slower (see docs/decisions/no-proc-on-the-launch-path.md).
 * Async-signal-safe: yes */
int bgtask_set_process_title(char *const *argv, int argc, const char *title);

/* Copy-on-write faults taken ahead of time, in a zygote's spare while it waits: each page of
 * the argument and environment strings the kernel laid out together is written once (its
 * first byte, back to itself). The launch writes there first thing: its process title, and
 * its container paths in place (AppContainer.setInPlace).
 * Async-signal-safe: yes */
void bgtask_prefault_arguments_and_environment(char *const *argv, int argc);

/* 1 when this process has a child (running, stopped or a zombie, of any of its threads), 0
 * when it has none: waitid(P_ALL, WNOHANG | WNOWAIT), which reaps nothing and reads no /proc
 * entry. A child subreaper with no child has no descendant.
 * Async-signal-safe: yes */
int bgtask_has_children(void);

/* Makes `path` this process's executable as CoreFoundation sees it, so that the main bundle
 * (`Bundle.main`, CFBundleGetMainBundle) is the bundle holding `path`: CoreFoundation takes the
 * process path from /proc/self/exe once and keeps it behind the pointer _CFGetProcessPath()
 * returns, which this overwrites. Call it before anything asks for the main bundle (it is built
 * once, on first use). 0, or -1 when this Foundation does not export _CFGetProcessPath.
 * Async-signal-safe: no — strdup, and dlsym (the loader's lock) unless the zygote resolved it;
 * called by a launch on its main thread, an ordinary process by then. */
int bgtask_set_main_executable(const char *path);

/* Writes every UserDefaults change this process made that CoreFoundation has not written yet
 * (CFPreferencesFlushCaches): Linux's Foundation writes preferences only on synchronize(),
 * while iOS code expects them kept without it. Cheap when preferences were never used. 0, or -1
 * when this Foundation does not export the function.
 * Async-signal-safe: no — CoreFoundation's preferences (locks, allocation, file writes); called
 * as a launch ends, by an ordinary process. */
int bgtask_flush_preferences(void);
/* Finds the two functions above in the loaded Foundation (dlsym), once; the zygote calls it so
 * that no launch pays for the lookups.
 * Async-signal-safe: no — dlsym takes the loader's lock; the zygote calls it before it forks. */
void bgtask_resolve_foundation_hooks(void);

/* The launch's confinement (sandbox.c), applied by the runner to itself on its main thread while
 * it is the process's only thread, before the plugin is loaded: in an ordinary process (a fork
 * of the single-threaded zygote, or a spawned runner), so none of them needs to be
 * async-signal-safe; those that are say so.
 * bgtask_landlock_abi: the kernel's Landlock ABI version, 0 without Landlock.
 * bgtask_landlock_create: a ruleset handling every file access right of this ABI and, from ABI
 * 6, scoping signals and abstract sockets to the domain; its descriptor (-1 without Landlock),
 * and the ABI in *abi. bgtask_landlock_allow: grants `kind` beneath each path (read and execute;
 * read and write a character device; everything); missing read and device paths are skipped,
 * a missing read-write path is an error (-1 and `error`). bgtask_landlock_restrict: confines
 * this thread and everything it starts from now on, and closes the ruleset. A ruleset may be
 * made ahead (a zygote spare makes the system's part while it waits).
 * bgtask_apply_syscall_filter: seccomp-bpf for every thread (TSYNC): another architecture's
 * system calls kill the process; new namespaces, CLONE_PARENT, giving up being a subreaper,
 * ptrace and cross-process memory access, mounts, modules, kexec, bpf, keyrings, io_uring,
 * perf, userfaultfd, file handles, clock setting and raw I/O ports fail with EPERM; clone3 with
 * ENOSYS (libc falls back to clone, whose flags the filter can read). 0, or -1 with `error`.
 * bgtask_set_no_new_privs: prctl(PR_SET_NO_NEW_PRIVS) (required for both as non-root). */
/* Async-signal-safe: yes */
int bgtask_landlock_abi(void);
enum { BGTASK_LANDLOCK_READ_EXECUTE = 0, BGTASK_LANDLOCK_DEVICE = 1, BGTASK_LANDLOCK_READ_WRITE = 2 };
/* Async-signal-safe: yes */
int bgtask_landlock_create(int *abi);
/* Async-signal-safe: no — snprintf and strerror (locale) for its error; called by the spare
 * and the launch, ordinary processes. */
int bgtask_landlock_allow(int ruleset, const char *const *paths, int count, int kind, char *error, size_t error_size);
/* Async-signal-safe: no — snprintf and strerror for its error; called by the launch, an
 * ordinary process. */
int bgtask_landlock_restrict(int ruleset, char *error, size_t error_size);
/* Async-signal-safe: no — snprintf and strerror for its error; called by the launch, an
 * ordinary process. */
int bgtask_apply_syscall_filter(char *error, size_t error_size);
/* Async-signal-safe: yes */
int bgtask_set_no_new_privs(void);
/* Becomes `uid`:`gid` with exactly `groups` as supplementary groups (at most 64), for good
 * (setres*id), with RLIMIT_NPROC `process_limit` first (0: unchanged) and umask 007. 0, or -1
 * and errno; checks that every id took.
 * Async-signal-safe: no — glibc's setgroups and setres*id take its thread list's lock to apply
 * the change to every thread; called by the launch on its main thread, an ordinary process. */
int bgtask_become_user(uint32_t uid, uint32_t gid, const uint32_t *groups, int group_count, uint32_t process_limit);
/* prctl(PR_GET_SECCOMP): 0 (none yet), 2 (filtered), or -1 without seccomp.
 * Async-signal-safe: yes */
int bgtask_seccomp_mode(void);
/* The launch's own PID namespace, with a private mount namespace and a /proc of its own
 * (namespace.c): three processes, an outer one (what the host waits for: it ends as the app
 * ends, by its exit code or its signal), the namespace's init (pid 1: reaps, and kills all that
 * is left once the app is gone) and the app (pid 2). Callers are single-threaded and root.
 * bgtask_clone_parent_namespaced: in a zygote, instead of bgtask_clone_parent: returns the
 * outer process's pid (a child of the caller's parent, in its own process group) in the
 * caller, 0 in the app, or -1 and `error`. bgtask_enter_pid_namespace: in a spawned runner:
 * the caller becomes the outer process; returns 0 in the app, or -1 and `error` (nothing made:
 * the caller carries on without). bgtask_namespaces_available: 1 when this process may make
 * them (a throwaway child tries), else 0 and `error`. bgtask_release_namespace_stacks: frees
 * the stacks of outer and init processes that have exited (bgtask_clone_parent_namespaced
 * calls it; their stacks are in the zygote's memory, which they share).
 * The first two refuse (-1 and `error`) a caller that glibc says has ever had a second thread
 * (__libc_single_threaded): the app is a copy of the caller's memory, made without fork's
 * handlers, and the outer and init processes run in that memory. */
/* Async-signal-safe: no — the zygote's side fflushes stdio, grows its list of stacks (realloc)
 * and formats errors (snprintf, strerror); it runs in the single-threaded zygote. The outer and
 * init processes run only raw system calls and glibc's clone stub, the app only close and
 * munmap before it returns 0 (namespace.c). */
pid_t bgtask_clone_parent_namespaced(char *error, size_t error_size);
/* Async-signal-safe: no — stdio (fflush, and fprintf on a failure it cannot return from) and
 * snprintf/strerror; the spawned runner calls it first thing, while it is single-threaded. The
 * init and the app's side are as in bgtask_clone_parent_namespaced. */
int bgtask_enter_pid_namespace(char *error, size_t error_size);
/* Async-signal-safe: no — snprintf and strerror for its error, in the caller (the zygote, or the
 * host's threads). Its throwaway child runs raw system calls only, so the host may call it. */
int bgtask_namespaces_available(char *error, size_t error_size);
/* Async-signal-safe: no — edits the zygote's list of stacks, which bgtask_clone_parent_namespaced
 * grows with realloc; the zygote calls it between forks. */
void bgtask_release_namespace_stacks(void);
/* The directories of every shared object loaded in this process (dl_iterate_phdr), each once,
 * NUL-separated into `buffer`; returns the bytes written.
 * Async-signal-safe: no — dl_iterate_phdr takes the loader's lock; the zygote calls it before it
 * forks (a spare, after, in an ordinary process). */
size_t bgtask_loaded_library_directories(char *buffer, size_t size);

/* The zygote. bgtask_clone_parent: fork whose child is the caller's parent's child (returns 0 in
 * the child); only for a single-threaded caller: -1 and EDEADLK for one that glibc says has ever
 * had a second thread (__libc_single_threaded).
 * Async-signal-safe: no — fflush(NULL) before the clone, in the single-threaded zygote; the
 * child runs nothing of it but the return. */
pid_t bgtask_clone_parent(void);
/* Threads of this process (from /proc/self/task), or -1.
 * Async-signal-safe: no — opendir allocates; the zygote calls it once, before its first fork
 * (never on a launch's path: /proc entries slow a process's reaping). */
int bgtask_thread_count(void);
/* Every signal to its default action, none blocked. After bgtask_note_signal_actions, only
 * the signals that were not at their default then are reset (one syscall each instead of 64):
 * for a process that changes no disposition afterwards (the zygote) and its forks.
 * Async-signal-safe: yes */
void bgtask_reset_signals(void);
/* Async-signal-safe: yes */
void bgtask_note_signal_actions(void);
/* Closes every descriptor >= lowest.
 * Async-signal-safe: yes */
void bgtask_close_from(int lowest);
/* Closes every descriptor >= lowest except the `count` in `keep` (ascending).
 * Async-signal-safe: yes */
void bgtask_close_from_except(int lowest, const int *keep, int count);
/* Writes the open descriptors in [lowest, highest) to `out` (the lowest `capacity` of them
 * when /proc lists them in order, as it does; ascending) and returns how many there are: read
 * from /proc/self/fd, or without /proc by asking every number in the range.
 * Async-signal-safe: yes */
int bgtask_open_descriptors(int lowest, int highest, int *out, int capacity);
/* Bytes allocated to everything beneath `path` (st_blocks), symbolic links not followed and
 * other filesystems not entered, stopping after `max_entries`; -1 when `path` cannot be read.
 * Async-signal-safe: no — nftw allocates and opens directories; the host's threads only. */
int64_t bgtask_directory_usage(const char *path, int64_t max_entries);
/* `bgtask_directory_usage`, and the entries (inodes: files, directories, links) beneath
 * `path`, the directory itself included, into *entries; *complete is 0 when the walk stopped at
 * `max_entries` (what is beneath is then more than it says). -1 when `path` cannot be read.
 * Async-signal-safe: no — the host's threads only (a disk quota's accounting). */
int64_t bgtask_directory_usage_entries(const char *path, int64_t max_entries, int64_t *entries, int *complete);
/* fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length): blocks for a file's later writes, its
 * size unchanged. 0, or -1 and errno.
 * Async-signal-safe: yes */
int bgtask_allocate_keeping_size(int fd, int64_t offset, int64_t length);
/* renameat2(..., RENAME_NOREPLACE): moves a name without replacing what is at the new one (EEXIST
 * then), and without a new inode (tmpfs counts a hard link as one). 0, or -1 and errno.
 * Async-signal-safe: yes */
int bgtask_rename_noreplace(int from_directory, const char *from, int to_directory, const char *to);
/* sendmsg with up to 8 descriptors (SCM_RIGHTS). 0, or -1 and errno.
 * Async-signal-safe: yes */
int bgtask_send_fds(int socket, const int *fds, int count, const void *payload, size_t length);
/* recvmsg; *count in: capacity of fds, out: descriptors received (close-on-exec). Returns the
 * payload length, 0 at end of stream, -1 and errno.
 * Async-signal-safe: yes */
ssize_t bgtask_recv_fds(int socket, int *fds, int *count, void *buffer, size_t length);
/* getrandom(2) into `buffer`, whole (short reads and EINTR retried): 0, or -1 and errno. Needs
 * no descriptor (unlike /dev/urandom, which Foundation's UUID() reads and which yields an
 * all-zero UUID when the process is out of descriptors).
 * Async-signal-safe: yes */
int bgtask_getrandom(void *buffer, size_t length);

/* The supervision loops' reactor (SupervisionLoop.swift): an epoll set and its wake-up, without
 * depending on what Swift's Glibc module happens to expose. Events are BGTASK_EPOLL_IN/PRI/OUT
 * (level-triggered); ERR and HUP are always reported. */
#define BGTASK_EPOLL_IN 0x001u
#define BGTASK_EPOLL_PRI 0x002u
#define BGTASK_EPOLL_OUT 0x004u
#define BGTASK_EPOLL_ERR 0x008u
#define BGTASK_EPOLL_HUP 0x010u
/* epoll_create1(EPOLL_CLOEXEC).
 * Async-signal-safe: yes */
int bgtask_epoll_create(void);
/* epoll_ctl(EPOLL_CTL_ADD) of `fd` for `events`, with `token` as the event's data.
 * Async-signal-safe: yes */
int bgtask_epoll_add(int epfd, int fd, uint32_t events, uint64_t token);
/* epoll_ctl(EPOLL_CTL_MOD).
 * Async-signal-safe: yes */
int bgtask_epoll_modify(int epfd, int fd, uint32_t events, uint64_t token);
/* epoll_ctl(EPOLL_CTL_DEL).
 * Async-signal-safe: yes */
int bgtask_epoll_remove(int epfd, int fd);
/* epoll_pwait2: up to `capacity` (at most 256) ready, their tokens and events into the two
 * arrays, waiting at most `timeout_ns` (to the nanosecond; forever when negative). Where the
 * kernel has no epoll_pwait2 (before 5.11), epoll_wait with the timeout rounded up to a
 * millisecond. -1 and errno (EINTR included) on failure.
 * Async-signal-safe: yes */
int bgtask_epoll_wait(int epfd, uint64_t *tokens, uint32_t *events, int capacity, int64_t timeout_ns);
/* An eventfd, non-blocking and close-on-exec.
 * Async-signal-safe: yes */
int bgtask_eventfd_create(void);
/* Adds one to the eventfd (a wake-up).
 * Async-signal-safe: yes */
void bgtask_eventfd_signal(int fd);
/* Reads the eventfd back to zero.
 * Async-signal-safe: yes */
void bgtask_eventfd_clear(int fd);
/* Names the calling thread for the kernel (prctl PR_SET_NAME: `ps -L`, /proc/PID/task/TID/comm;
 * at most 15 bytes kept). Foundation's `Thread.name` does not on Linux.
 * Async-signal-safe: yes */
void bgtask_name_thread(const char *name);
/* send(2) of one packet with MSG_DONTWAIT | MSG_NOSIGNAL: the bytes sent, or -1 and errno
 * (EAGAIN when the peer's buffer is full).
 * Async-signal-safe: yes */
long bgtask_send_nonblocking(int fd, const void *bytes, unsigned long count);

/* One TCP socket of a process: its inode and the payload bytes it sent and received. */
struct bgtask_socket_bytes {
    uint64_t inode;
    uint64_t sent;
    uint64_t received;
};

/* The TCP sockets open in process `pid` (at most `capacity`), each read through a duplicate of
 * its descriptor (pidfd_getfd, TCP_INFO; sockets.c). How many, or -errno.
 * Async-signal-safe: no — opendir allocates; called by the host's supervision loops only. */
int bgtask_process_tcp_bytes(pid_t pid, struct bgtask_socket_bytes *out, int capacity);

#endif
