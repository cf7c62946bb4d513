#define _GNU_SOURCE
#include <ftw.h>
#include "bgtask_system_shims.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sched.h>
#include <sys/prctl.h>
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#endif
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int bgtask_spawn(const char *path, char *const argv[], char *const envp[],
                 int channel_fd, int stdin_fd, int out_fd, int err_fd, pid_t *pid) {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    int rc = posix_spawn_file_actions_init(&actions);
    if (rc != 0) return rc;
    rc = posix_spawnattr_init(&attr);
    if (rc != 0) { posix_spawn_file_actions_destroy(&actions); return rc; }

    /* dup2 onto the low numbers clears FD_CLOEXEC on the copies; a source that already sits at
     * its target would keep the flag, so the parent never passes one that does. */
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, stdin_fd, 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
    if (rc == 0 && channel_fd >= 0) rc = posix_spawn_file_actions_adddup2(&actions, channel_fd, 3);
    if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&actions, channel_fd >= 0 ? 4 : 3);

    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (rc == 0) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                   POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_USEVFORK);
    if (rc == 0) rc = posix_spawnattr_setpgroup(&attr, 0);
    if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
    if (rc == 0) rc = posix_spawn(pid, path, &actions, &attr, argv, envp);

    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    return rc;
}

/* Async-signal-safe: yes */
int bgtask_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

pid_t bgtask_wait4(pid_t pid, int *status, int options, struct rusage *usage) {
    return wait4(pid, status, options, usage);
}

int bgtask_wifexited(int status) { return WIFEXITED(status); }
int bgtask_wexitstatus(int status) { return WEXITSTATUS(status); }
int bgtask_wifsignaled(int status) { return WIFSIGNALED(status); }
int bgtask_wtermsig(int status) { return WTERMSIG(status); }

int bgtask_set_child_subreaper(void) { return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }
int bgtask_set_parent_death_signal(int sig) { return prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0); }

/* The calling thread's id (gettid(2); glibc's wrapper is not declared under every feature set). */
int bgtask_thread_id(void) { return (int)syscall(SYS_gettid); }

/* Async-signal-safe: yes */
uint64_t bgtask_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int bgtask_has_exited(pid_t pid) {
    siginfo_t info;
    info.si_pid = 0;
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
    return info.si_pid == pid;
}

int bgtask_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int bgtask_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

int bgtask_accept_cloexec(int fd) { return accept4(fd, NULL, NULL, SOCK_CLOEXEC); }

/* ---- The zygote (a pre-warmed, single-threaded launcher; see Zygote.swift) ---- */

/* Async-signal-safe: no — fflush(NULL) before the clone, in the caller: the zygote, whose
 * single thread is checked here (__libc_single_threaded: a byte read, nothing measurable; glibc
 * clears it at the first pthread_create and never sets it again). The child runs nothing of
 * this but the return from syscall(). */
pid_t bgtask_clone_parent(void) {
#if __has_include(<sys/single_threaded.h>)
    if (!__libc_single_threaded) {
        /* A second thread could hold a lock (malloc's, stdio's, the runtime's) that the child,
         * made without fork's handlers, would find held for good. */
        errno = EDEADLK;
        return -1;
    }
#endif
    fflush(NULL);
    /* CLONE_PARENT: the child is the caller's *parent's* child, so the host can wait4 it, get
     * its rusage and watch it with a pidfd as if it had spawned it. Raw clone: the caller is
     * single-threaded, so nothing fork()'s atfork handlers would fix can be inconsistent. */
    return (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, NULL, NULL, 0);
}

/* Async-signal-safe: no — opendir allocates; the zygote, once, before its first fork. */
int bgtask_thread_count(void) {
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] != '.') count++;
    }
    closedir(dir);
    return count;
}

/* Signals whose action was not SIG_DFL at bgtask_note_signal_actions: bit sig - 1 for signal
 * sig (Linux has 64, NSIG is 65). */
static uint64_t noted_signals;
static bool signals_noted;

/* Async-signal-safe: yes */
void bgtask_note_signal_actions(void) {
    noted_signals = 0;
    for (int sig = 1; sig < NSIG && sig <= 64; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        struct sigaction current;
        if (sigaction(sig, NULL, &current) != 0) continue;
        bool is_default = !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL;
        if (!is_default) noted_signals |= (uint64_t)1 << (sig - 1);
    }
    signals_noted = true;
}

/* Async-signal-safe: yes (sigaction and sigprocmask: a zygote's child calls it at once) */
void bgtask_reset_signals(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        if (signals_noted && sig <= 64 && !(noted_signals & ((uint64_t)1 << (sig - 1)))) continue;
        sigaction(sig, &action, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Async-signal-safe: yes */
void bgtask_close_from(int lowest) {
    if (syscall(SYS_close_range, (unsigned)lowest, ~0u, 0) == 0) return;
    for (int fd = lowest; fd < 65536; fd++) close(fd);
}

/* Async-signal-safe: yes */
void bgtask_close_from_except(int lowest, const int *keep, int count) {
    int next = lowest;
    for (int i = 0; i < count; i++) {
        if (keep[i] < next) continue;
        if (keep[i] > next && syscall(SYS_close_range, (unsigned)next, (unsigned)(keep[i] - 1), 0) != 0) {
            for (int fd = next; fd < keep[i]; fd++) close(fd);
        }
        next = keep[i] + 1;
    }
    bgtask_close_from(next);
}

/* Async-signal-safe: yes (open, getdents64, fcntl and close; no allocation) */
int bgtask_open_descriptors(int lowest, int highest, int *out, int capacity) {
    int count = 0;
    int directory = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (directory < 0) {
        /* No /proc: every number in the range is asked. */
        for (int fd = lowest; fd < highest; fd++) {
            if (fcntl(fd, F_GETFD) == -1) continue;
            if (count < capacity) out[count] = fd;
            count++;
        }
        return count;
    }
    /* The kernel's entries: inode, offset, length, type, name. */
    struct entry {
        uint64_t inode;
        int64_t offset;
        unsigned short length;
        unsigned char type;
        char name[];
    };
    _Alignas(8) char buffer[4096];
    for (;;) {
        long n = syscall(SYS_getdents64, directory, buffer, sizeof buffer);
        if (n <= 0) break;
        for (long at = 0; at < n;) {
            struct entry *entry = (struct entry *)(buffer + at);
            at += entry->length;
            if (entry->name[0] < '0' || entry->name[0] > '9') continue;
            long fd = 0;
            for (const char *c = entry->name; *c >= '0' && *c <= '9' && fd <= 0x7fffffff; c++) fd = fd * 10 + (*c - '0');
            if (fd == directory || fd < lowest || fd >= highest) continue;
            if (count < capacity) {
                /* Ascending: /proc lists them so, but nothing promises it. */
                int i = count;
                while (i > 0 && out[i - 1] > fd) { out[i] = out[i - 1]; i--; }
                out[i] = (int)fd;
            }
            count++;
        }
    }
    close(directory);
    return count;
}

/* Async-signal-safe: yes */
int bgtask_send_fds(int socket, const int *fds, int count, const void *payload, size_t length) {
    struct iovec io = {.iov_base = (void *)payload, .iov_len = length};
    char control[CMSG_SPACE(sizeof(int) * 8)];
    memset(control, 0, sizeof control);
    struct msghdr message = {.msg_iov = &io, .msg_iovlen = 1};
    if (count > 0) {
        if (count > 8) { errno = EINVAL; return -1; }
        message.msg_control = control;
        message.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count);
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
        memcpy(CMSG_DATA(header), fds, sizeof(int) * (size_t)count);
    }
    ssize_t sent;
    do { sent = sendmsg(socket, &message, MSG_NOSIGNAL); } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -1 : 0;
}

/* Async-signal-safe: yes */
ssize_t bgtask_recv_fds(int socket, int *fds, int *count, void *buffer, size_t length) {
    struct iovec io = {.iov_base = buffer, .iov_len = length};
    char control[CMSG_SPACE(sizeof(int) * 8)];
    struct msghdr message = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t received;
    do { received = recvmsg(socket, &message, MSG_CMSG_CLOEXEC); } while (received < 0 && errno == EINTR);
    int found = 0;
    if (received >= 0) {
        for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
            if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
            int n = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(header) + sizeof(int) * (size_t)i, sizeof fd);
                if (found < *count) fds[found++] = fd; else close(fd);
            }
        }
    }
    *count = found;
    return received;
}

/* Async-signal-safe: yes */
int bgtask_set_process_title(char *const *argv, int argc, const char *title) {
    /* setproctitle, as PostgreSQL does: /proc/PID/cmdline shows the process's argument area,
     * so rewriting that memory in place renames the process for ps and for the host. The
     * kernel lays the arguments out one after another, so the area runs from argv[0] to the
     * end of the last one (the same bounds as fields 48 and 49 of /proc/PID/stat). */
    if (argc < 1 || argv == NULL || argv[0] == NULL) return -1;
    char *start = argv[0];
    char *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    for (int i = 1; i < argc; i++) {
        if (argv[i] != argv[i - 1] + strlen(argv[i - 1]) + 1) return -1; /* not the kernel's layout */
    }
    size_t length = (size_t)(end - start);
    if (length < 2) return -1;
    memset(start, 0, length);
    strncpy(start, title, length - 1);
    return 0;
}

/* Writes the first byte of each page [start, start + length) touches back to itself. */
static void prefault(char *start, size_t length) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t end = (uintptr_t)start + length;
    for (uintptr_t at = (uintptr_t)start; at < end; at = (at & ~(page - 1)) + page) {
        volatile char *byte = (volatile char *)at;
        *byte = *byte;
    }
}

void bgtask_prefault_arguments_and_environment(char *const *argv, int argc) {
    if (argc < 1 || argv == NULL || argv[0] == NULL) return;
    char *start = argv[0];
    char *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    /* The kernel's environment strings follow the arguments; setenv's own live in the heap. */
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        if (*entry >= end && *entry < end + (1 << 20)) {
            char *stop = *entry + strlen(*entry) + 1;
            if (stop > end) end = stop;
        }
    }
    prefault(start, (size_t)(end - start));
}

int bgtask_has_children(void) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    int rc;
    do {
        rc = waitid(P_ALL, 0, &info, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT | __WALL);
    } while (rc == -1 && errno == EINTR);
    return rc == -1 && errno == ECHILD ? 0 : 1;
}

int bgtask_poll_ns(struct pollfd *fds, unsigned long count, int64_t timeout_ns) {
    /* ppoll: deadlines to the microsecond, where poll rounds them up to whole milliseconds. */
    if (timeout_ns < 0) return ppoll(fds, (nfds_t)count, NULL, NULL);
    struct timespec timeout = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    return ppoll(fds, (nfds_t)count, &timeout, NULL);
}

/* CoreFoundation's functions the runner calls, found once (in the zygote, before it forks). */
static const char **(*get_process_path)(void);
static void (*flush_preferences)(void);

/* Async-signal-safe: no — dlsym (the loader's lock); the zygote calls it before it forks. */
void bgtask_resolve_foundation_hooks(void) {
    /* Looked up, not linked: the shims do not link Foundation, and a Foundation without these
     * should cost the app its Bundle.main or its unsynchronized defaults, not its launch. */
    if (get_process_path == NULL) get_process_path = (const char **(*)(void))dlsym(RTLD_DEFAULT, "_CFGetProcessPath");
    if (flush_preferences == NULL) flush_preferences = (void (*)(void))dlsym(RTLD_DEFAULT, "CFPreferencesFlushCaches");
}

/* Async-signal-safe: no — strdup; a launch's main thread, in an ordinary process. */
int bgtask_set_main_executable(const char *path) {
    bgtask_resolve_foundation_hooks();
    if (get_process_path == NULL) return -1;
    const char *copy = strdup(path);
    if (copy == NULL) return -1;
    /* Filled from /proc/self/exe when CoreFoundation loaded (the runner's path), replaced here. */
    *get_process_path() = copy;
    return 0;
}

int bgtask_flush_preferences(void) {
    bgtask_resolve_foundation_hooks();
    if (flush_preferences == NULL) return -1;
    flush_preferences();
    return 0;
}

/* nftw has no context argument: the walk's state, per thread. */
static _Thread_local int64_t usage_total, usage_left;

static int add_usage(const char *path, const struct stat *info, int type, struct FTW *position) {
    (void)path;
    (void)type;
    (void)position;
    usage_total += (int64_t)info->st_blocks * 512;
    return --usage_left > 0 ? FTW_CONTINUE : FTW_STOP;
}

int64_t bgtask_directory_usage(const char *path, int64_t max_entries) {
    usage_total = 0;
    usage_left = max_entries > 0 ? max_entries : 1;
    if (nftw(path, add_usage, 16, FTW_PHYS | FTW_MOUNT | FTW_ACTIONRETVAL) == -1) return -1;
    return usage_total;
}

int bgtask_getrandom(void *buffer, size_t length) {
    size_t done = 0;
    while (done < length) {
        long n = syscall(SYS_getrandom, (char *)buffer + done, length - done, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

int bgtask_rename_noreplace(int from_directory, const char *from, int to_directory, const char *to) {
    return (int)syscall(SYS_renameat2, from_directory, from, to_directory, to, RENAME_NOREPLACE);
}

int bgtask_allocate_keeping_size(int fd, int64_t offset, int64_t length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
}

int64_t bgtask_directory_usage_entries(const char *path, int64_t max_entries, int64_t *entries, int *complete) {
    int64_t limit = max_entries > 0 ? max_entries : 1;
    usage_total = 0;
    usage_left = limit;
    int result = nftw(path, add_usage, 16, FTW_PHYS | FTW_MOUNT | FTW_ACTIONRETVAL);
    if (result == -1) return -1;
    /* add_usage counts down once per entry and stops the walk at 0. */
    if (entries) *entries = limit - (usage_left > 0 ? usage_left : 0);
    if (complete) *complete = result != FTW_STOP;
    return usage_total;
}

int bgtask_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

static int epoll_control(int epfd, int op, int fd, uint32_t events, uint64_t token) {
    struct epoll_event event = {.events = events, .data.u64 = token};
    return epoll_ctl(epfd, op, fd, &event);
}

int bgtask_epoll_add(int epfd, int fd, uint32_t events, uint64_t token) { return epoll_control(epfd, EPOLL_CTL_ADD, fd, events, token); }
int bgtask_epoll_modify(int epfd, int fd, uint32_t events, uint64_t token) { return epoll_control(epfd, EPOLL_CTL_MOD, fd, events, token); }
int bgtask_epoll_remove(int epfd, int fd) { return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL); }

int bgtask_epoll_wait(int epfd, uint64_t *tokens, uint32_t *events, int capacity, int64_t timeout_ns) {
    struct epoll_event ready[256];
    if (capacity > 256) capacity = 256;
    static int no_pwait2 = 0;
    int n = -1;
    if (!no_pwait2) {
        struct timespec timeout = {.tv_sec = (time_t)(timeout_ns / 1000000000), .tv_nsec = (long)(timeout_ns % 1000000000)};
        n = epoll_pwait2(epfd, ready, capacity, timeout_ns < 0 ? NULL : &timeout, NULL);
        if (n < 0 && errno == ENOSYS) no_pwait2 = 1;
    }
    if (no_pwait2) {
        int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
        n = epoll_wait(epfd, ready, capacity, ms);
    }
    for (int i = 0; i < n; i++) {
        tokens[i] = ready[i].data.u64;
        events[i] = ready[i].events;
    }
    return n;
}

int bgtask_eventfd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
void bgtask_eventfd_signal(int fd) { uint64_t one = 1; (void)!write(fd, &one, sizeof one); }
void bgtask_eventfd_clear(int fd) { uint64_t value; (void)!read(fd, &value, sizeof value); }

long bgtask_send_nonblocking(int fd, const void *bytes, unsigned long count) {
    long sent;
    do { sent = send(fd, bytes, count, MSG_DONTWAIT | MSG_NOSIGNAL); } while (sent < 0 && errno == EINTR);
    return sent;
}

void bgtask_name_thread(const char *name) { (void)prctl(PR_SET_NAME, name, 0, 0, 0); }
