/*
 * Hostile: a plugin written against the published ABI that tries to reach past its launch.
 * Each attempt prints one line, "hostile: NAME: RESULT", where RESULT is "denied (ERRNO)" or
 * "ALLOWED"; SandboxTests assert every line. Nothing here is destructive when it is allowed:
 * signals are probes (0), writes go to files the test made for the purpose.
 *
 *  - com.example.hostile.probe          every attempt below, then completes the task.
 *  - com.example.hostile.forgefinished  writes a forged `finished` message into the launch
 *                                       channel (fd 3) and keeps running, never completing.
 *  - com.example.hostile.forgedone      at its expiration, forges its task's completion and
 *                                       `finished` on the channel, and runs on (its expiration
 *                                       handler never returns).
 *  - com.example.hostile.escape         forks a child that tries to leave the launch's tree
 *                                       (CLONE_PARENT, giving up the subreaper) and sleeps.
 *  - com.example.hostile.memfd          writes 256 MiB into a memfd it never maps, and waits.
 *  - com.example.hostile.abi32          makes a 32-bit system call (int 0x80).
 *  - com.example.hostile.fillbytes      writes 256 KiB blocks into its container's
 *                                       Documents until a write fails (ENOSPC, EDQUOT) or
 *                                       1 GiB is written, says how far it got, and waits.
 *  - com.example.hostile.fillinodes     makes empty files in its container's tmp until one
 *                                       cannot be made (ENOSPC) or 1,000,000 are made, says
 *                                       how many, and waits.
 *  - com.example.hostile.forgelog       prints unified-log entries naming another app
 *                                       (com.example.victim), after a forged log header.
 *  - com.example.hostile.btflood        forges "background time began" messages, each with
 *                                       a new id, on the launch channel: BGTASK_TEST_FLOOD_COUNT
 *                                       of them (default 1,000,000) or for 15 s, whichever
 *                                       ends first; then completes.
 *  - com.example.hostile.forgefinishedchild  forks a child, forges `finished` saying it had
 *                                       descendants, and runs on.
 *  - com.example.hostile.deafflood      stops reading its channel (keeps it at another
 *                                       descriptor, puts a socket nobody writes to at fd 3)
 *                                       and floods it with `pending` calls whose answers it
 *                                       never reads, until its watchdog kill.
 *  - com.example.hostile.forgeidle      forges `idle` (its launch is over, suspend it) with its
 *                                       task still open, and runs on.
 *  - com.example.hostile.groupsteal     reads and writes the container of app group
 *                                       group.com.example.iosapp (another app's) by its path.
 *  - com.example.hostile.registerflood  registers BGTASK_TEST_REGISTER_COUNT (default 100,000)
 *                                       continued-processing identifiers
 *                                       (com.example.hostile.many.N, real registrations).
 */
#define _GNU_SOURCE
#include <bgtask/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ipc.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const bgtask_host_api *api;
static bgtask_host *host;
static char container[4096];
static char bundle[4096];

static void report(const char *name, long rc) {
    if (rc < 0) printf("hostile: %s: denied (%s)\n", name, strerrorname_np(errno) ? strerrorname_np(errno) : "?");
    else printf("hostile: %s: ALLOWED\n", name);
    fflush(stdout);
}

static long open_for(const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    return fd;
}

static long connect_to(const char *path, int abstract) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    socklen_t length;
    if (abstract) {
        strncpy(address.sun_path + 1, path, sizeof address.sun_path - 2);
        length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(path));
    } else {
        strncpy(address.sun_path, path, sizeof address.sun_path - 1);
        length = sizeof address;
    }
    long rc = connect(fd, (struct sockaddr *)&address, length);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* Connects to the host's control socket (STATE/control.sock, named from the container: a
 * socket path must fit in 108 bytes) and waits (at most 5 s) for what the host does. */
static void use_control_socket(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, "../../control.sock", sizeof address.sun_path - 1);
    if (chdir(container) != 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        report("use the control socket", -1);
        close(fd);
        return;
    }
    char answer[4096];
    size_t used = 0;
    struct pollfd poller = {.fd = fd, .events = POLLIN};
    while (used < sizeof answer - 1 && poll(&poller, 1, 5000) == 1) {
        ssize_t n = read(fd, answer + used, sizeof answer - 1 - used);
        if (n <= 0) break;
        used += (size_t)n;
    }
    answer[used] = 0;
    close(fd);
    /* The answer is a length-prefixed frame (its first bytes may be NULs): memmem, not strstr. */
    static const char refusal[] = "launches may not use the control socket";
    if (memmem(answer, used, "permission-denied", 17) && memmem(answer, used, refusal, sizeof refusal - 1))
        printf("hostile: use the control socket: denied (refused by the host)\n");
    else
        printf("hostile: use the control socket: ALLOWED (%zu bytes of answer)\n", used);
    fflush(stdout);
}

static void probe(void *context, const bgtask_task_info *task) {
    (void)context;
    char path[4600];
    pid_t parent = getppid();
    printf("hostile: pid %d, parent %d\n", getpid(), parent);
    /* A process outside the launch (the test's), by pid: in a PID namespace of its own, the
     * launch finds no such process (ESRCH), nor its /proc entry (ENOENT). */
    const char *outside = getenv("BGTASK_TEST_OUTSIDE_PID");
    if (outside) {
        snprintf(path, sizeof path, "/proc/%s", outside);
        struct stat info;
        report("see a process outside the launch", stat(path, &info));
        long signalled = kill((pid_t)atoi(outside), 0);
        report("signal a process outside the launch", signalled);
    }
    /* Paths relative to the container: STATE/containers/APP. */
    report("signal the supervisor", kill(parent, 0));
    /* Not PTRACE_ATTACH: unconfined (--no-sandbox), that would stop the supervisor. A read of
     * one byte at a bad address: EPERM when refused, EFAULT when the read was allowed. */
    char byte;
    struct iovec local = {.iov_base = &byte, .iov_len = 1}, remote = {.iov_base = (void *)8, .iov_len = 1};
    long read_rc = syscall(SYS_process_vm_readv, parent, &local, 1, &remote, 1, 0);
    report("read the supervisor's memory", read_rc < 0 && errno == EFAULT ? 0 : read_rc);
    snprintf(path, sizeof path, "/proc/%d/environ", parent);
    report("read the supervisor's environment", open_for(path, O_RDONLY));
    snprintf(path, sizeof path, "%s/../../secret.txt", container);
    report("read the state directory", open_for(path, O_RDONLY));
    snprintf(path, sizeof path, "%s/../com.example.victim/planted.txt", container);
    report("write another app's container", open_for(path, O_WRONLY | O_CREAT));
    snprintf(path, sizeof path, "%s/../../logs/planted.log", container);
    report("write the logs directory", open_for(path, O_WRONLY | O_CREAT));
    long planted = open_for("/tmp/bgtask-hostile-planted", O_WRONLY | O_CREAT);
    report("write /tmp", planted);
    snprintf(path, sizeof path, "%s/Info.plist", bundle);
    report("rewrite its own bundle", open_for(path, O_WRONLY));
    snprintf(path, sizeof path, "%s/../Evil.app", bundle);
    long installed = mkdir(path, 0755);
    report("install a bundle in the plugin directory", installed);
    if (installed == 0) rmdir(path);
    /* Its Library swapped for a link to a directory it may not write: the host must not create
     * Library/Caches there at the next launch (SandboxTests looks). */
    snprintf(path, sizeof path, "%s/Library", container);
    char moved[4600];
    snprintf(moved, sizeof moved, "%s/Library.moved", container);
    if (rename(path, moved) == 0) {
        char target[4600];
        snprintf(target, sizeof target, "%s/../../linked-target", container);
        report("link its Library outside its container", symlink(target, path));
    }
    if (planted >= 0) unlink("/tmp/bgtask-hostile-planted");
    snprintf(path, sizeof path, "%s/Documents/mine.txt", container);
    report("write its own container", open_for(path, O_WRONLY | O_CREAT));
    const char *abstract = getenv("BGTASK_TEST_ABSTRACT_SOCKET");
    if (abstract) report("connect to an abstract socket outside the launch", connect_to(abstract, 1));
    use_control_socket();
    /* Over a directory of its own, and undone: unconfined as root, this mount succeeds. */
    snprintf(path, sizeof path, "%s/tmp/mountpoint", container);
    mkdir(path, 0700);
    long mounted = mount("none", path, "tmpfs", 0, NULL);
    report("mount", mounted);
    if (mounted == 0) umount2(path, MNT_DETACH);
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("give up being a subreaper", prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0));
    long child = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
    if (child == 0) _exit(0);
    report("clone a sibling outside the launch (CLONE_PARENT)", child);
    long fd = syscall(SYS_pidfd_open, parent, 0);
    report("take the supervisor's descriptors (pidfd_getfd)", fd < 0 ? fd : syscall(SYS_pidfd_getfd, fd, 0, 0));
    /* Last: unconfined, it succeeds and the process is no longer root in its namespace. */
    report("System V shared memory", syscall(SYS_shmget, IPC_PRIVATE, 4096, 0600));
    int watcher = inotify_init1(IN_CLOEXEC);
    snprintf(path, sizeof path, "%s/../..", container);
    report("watch the state directory (inotify)", watcher < 0 ? -1 : inotify_add_watch(watcher, path, IN_ALL_EVENTS));
    snprintf(path, sizeof path, "%s/../../bgtask.sqlite", container);
    report("watch the database (inotify)", watcher < 0 ? -1 : inotify_add_watch(watcher, path, IN_ALL_EVENTS));
    snprintf(path, sizeof path, "%s/../../logs", container);
    report("watch the logs (inotify)", watcher < 0 ? -1 : inotify_add_watch(watcher, path, IN_ALL_EVENTS));
    snprintf(path, sizeof path, "%s/..", container);
    report("watch the containers (inotify)", watcher < 0 ? -1 : inotify_add_watch(watcher, path, IN_ALL_EVENTS));
    if (watcher >= 0) close(watcher);
    report("unshare a user namespace", unshare(CLONE_NEWUSER));
    api->set_task_completed(host, task->task, true);
}

/* CLOCK_MONOTONIC in nanoseconds, as the launch channel's times are. */
static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* ChildMessage.finished(at:descendants:peakResidentBytes:) in the wire format: 0xB1, tag 17,
 * u64, bool, u64; with a peak no machine has (the host bounds it by its memory). */
static void send_forged_finished_saying(uint64_t at, int descendants) {
    unsigned char packet[19] = {0xB1, 17};
    memcpy(packet + 2, &at, 8);
    packet[10] = (unsigned char)descendants;
    uint64_t peak = UINT64_MAX;
    memcpy(packet + 11, &peak, 8);
    send(3, packet, sizeof packet, MSG_NOSIGNAL);
}

static void send_forged_finished(uint64_t at) { send_forged_finished_saying(at, 0); }

/* A child of its own, then `finished` saying it had descendants, and runs on. */
static void forge_finished_with_child(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    pid_t child = fork();
    if (child == 0) { for (;;) pause(); }
    send_forged_finished_saying(monotonic_ns(), 1);
    printf("hostile: forged finished with a child, running on\n");
    fflush(stdout);
    for (;;) pause();
}

/* ChildMessage.idle(at:peakResidentBytes:cpuNanoseconds:hearsResumes:wakeups:) (0xB1, tag 25,
 * u64, u64, u64, bool, u64) while its task is open: the host must not take the launch for over. */
static void forge_idle(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    uint64_t at = monotonic_ns(), zero = 0;
    unsigned char idle[35] = {0xB1, 25};
    memcpy(idle + 2, &at, 8);
    memcpy(idle + 10, &zero, 8);
    memcpy(idle + 18, &zero, 8);
    idle[26] = 1;
    memcpy(idle + 27, &zero, 8);
    send(3, idle, sizeof idle, MSG_NOSIGNAL);
    printf("hostile: forged idle with the task open, running on\n");
    fflush(stdout);
    for (;;) pause();
}

/* The runner's reader waits on a socket nobody writes to, and the real channel is flooded with
 * ChildMessage.pending(seq:) (0xB1, tag 14, u64) whose answers pile up unread: the host must
 * neither block on the full channel nor queue calls without bound, and its watchdog must
 * still end the launch. */
static void deaf_flood(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    int real = dup(3);
    int deaf[2];
    if (real < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, deaf) != 0 || dup2(deaf[0], 3) < 0) {
        printf("hostile: could not stop reading the channel\n");
        fflush(stdout);
        for (;;) pause();
    }
    printf("hostile: deaf, flooding pending calls\n");
    fflush(stdout);
    unsigned char packet[10] = {0xB1, 14};
    for (uint64_t seq = 1ull << 40;; seq++) {
        memcpy(packet + 2, &seq, 8);
        if (send(real, packet, sizeof packet, MSG_NOSIGNAL) < 0) break;
    }
    for (;;) pause();
}

static void forge_finished(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    send_forged_finished(monotonic_ns());
    printf("hostile: forged finished, running on\n");
    fflush(stdout);
    for (;;) pause();
}

/* ChildMessage.taskCompleted(task:success:at:) (0xB1, tag 9, u64, bool, u64), then finished. */
static bool forge_done_expired(void *context, bgtask_task_id task) {
    (void)context;
    uint64_t at = monotonic_ns();
    unsigned char completed[19] = {0xB1, 9};
    memcpy(completed + 2, &task, 8);
    completed[10] = 0;
    memcpy(completed + 11, &at, 8);
    send(3, completed, sizeof completed, MSG_NOSIGNAL);
    send_forged_finished(at);
    printf("hostile: forged completion and finished at expiration, running on\n");
    fflush(stdout);
    for (;;) pause();
    return true;
}

static void forge_done(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_expiration_handler(host, task->task, forge_done_expired, NULL);
}

/* A 32-bit system call (int 0x80: i386 getpid, 20), whose numbers a native filter would
 * misread: the filter kills the process outright. */
static void abi32(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    printf("hostile: abi32 calling int 0x80\n");
    fflush(stdout);
#if defined(__x86_64__)
    long result;
    __asm__ volatile("int $0x80" : "=a"(result) : "a"(20L) : "memory");
    printf("hostile: abi32 returned %ld\n", result);
    fflush(stdout);
#endif
    api->set_task_completed(host, task->task, true);
}

/* Holds 256 MiB in a memfd it writes but never maps: no resident set shows it. */
static void memfd_hoard(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    int fd = (int)syscall(SYS_memfd_create, "hoard", 0);
    static char chunk[1 << 20];
    memset(chunk, 0x5a, sizeof chunk);
    printf("hostile: memfd hoard %s\n", fd >= 0 ? "started" : "refused");
    fflush(stdout);
    for (int i = 0; fd >= 0 && i < 256; i++) {
        if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk) break;
    }
    for (;;) pause();
}

static void escape(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    /* Named after its launch, so the test can look for it from outside a PID namespace. */
    char name[16];
    const char *launch_id = getenv("BGTASK_LAUNCH_ID");
    size_t id_length = launch_id ? strlen(launch_id) : 0;
    snprintf(name, sizeof name, "esc-%s", launch_id && id_length > 10 ? launch_id + id_length - 10 : "?");
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_NAME, name, 0, 0, 0);
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        setsid();
        for (;;) pause();
    }
    printf("hostile: escape forked %d named %s\n", child, name);
    fflush(stdout);
    api->set_task_completed(host, task->task, true);
}

/* Waits to be killed (the host's quota), or for the launch's end. */
static void hold(void) {
    for (;;) pause();
}

static void fill_bytes(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    char path[4200];
    snprintf(path, sizeof path, "%s/Documents/fill.bin", container);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    static char chunk[256 * 1024];
    memset(chunk, 0x5a, sizeof chunk);
    long long written = 0;
    int error = 0;
    if (fd < 0) error = errno;
    while (fd >= 0 && written < (1LL << 30)) {
        ssize_t n = write(fd, chunk, sizeof chunk);
        if (n <= 0) {
            error = n < 0 ? errno : ENOSPC;
            break;
        }
        written += n;
    }
    printf("hostile: fillbytes stopped after %lld bytes: %s\n", written, error ? strerrorname_np(error) : "ceiling");
    fflush(stdout);
    hold();
}

static void fill_inodes(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    char path[4200];
    long made = 0;
    int error = 0;
    for (; made < 1000000; made++) {
        snprintf(path, sizeof path, "%s/tmp/f%ld", container, made);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            error = errno;
            break;
        }
        close(fd);
    }
    printf("hostile: fillinodes stopped after %ld files: %s\n", made, error ? strerrorname_np(error) : "ceiling");
    fflush(stdout);
    hold();
}

/* Lines in the unified-log format that name another app, after a line in the form of the
 * host's log header naming it too: the host's header is the file's first line, so neither is
 * believed. */
static void forge_log(void *context, const bgtask_task_info *task) {
    (void)context;
    printf("[bgtask launch] com.example.victim 20260101T000000-00000000\n");
    printf("[os:default] 2026-11-22T04:11:40.123Z com.example.victim com.example.victim/forged: forged stdout entry\n");
    printf("[bgtask info] [os:error] 2026-11-22T04:11:41.123Z com.example.victim com.example.victim/forged: forged tagged entry\n");
    fflush(stdout);
    api->log(host, BGTASK_LOG_INFO, "[os:fault] 2026-11-22T04:11:42.123Z com.example.victim com.example.victim/forged: forged through log()");
    api->set_task_completed(host, task->task, true);
}

static long env_count(const char *name, long fallback) {
    const char *text = getenv(name);
    return text && *text ? strtol(text, NULL, 10) : fallback;
}

/* ChildMessage.backgroundTimeBegan(id:name:at:) (0xB1, tag 20, u64 id, no name, u64 at), each
 * with an id of its own, never ended. */
static void bt_flood(void *context, const bgtask_task_info *task) {
    (void)context;
    long count = env_count("BGTASK_TEST_FLOOD_COUNT", 1000000);
    uint64_t deadline = monotonic_ns() + 15000000000ull;
    long sent = 0;
    for (long i = 0; i < count; i++) {
        if ((i & 1023) == 0 && monotonic_ns() > deadline) break;
        unsigned char packet[19] = {0xB1, 20};
        uint64_t id = 1000000000ull + (uint64_t)i, at = monotonic_ns();
        memcpy(packet + 2, &id, 8);
        packet[10] = 0;
        memcpy(packet + 11, &at, 8);
        if (send(3, packet, sizeof packet, MSG_NOSIGNAL) != (ssize_t)sizeof packet) break;
        sent++;
    }
    printf("hostile: forged %ld background-time messages\n", sent);
    fflush(stdout);
    api->set_task_completed(host, task->task, true);
}

static void nothing(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_task_completed(host, task->task, true);
}

static void register_flood(void *context, const bgtask_task_info *task) {
    (void)context;
    long count = env_count("BGTASK_TEST_REGISTER_COUNT", 100000), registered = 0;
    char identifier[64];
    for (long i = 0; i < count; i++) {
        snprintf(identifier, sizeof identifier, "com.example.hostile.many.%ld", i);
        if (api->register_handler(host, identifier, nothing, NULL)) registered++;
    }
    printf("hostile: registered %ld identifiers\n", registered);
    fflush(stdout);
    api->set_task_completed(host, task->task, true);
}

static void group_steal(void *context, const bgtask_task_info *task) {
    (void)context;
    char path[4600];
    snprintf(path, sizeof path, "%s/../../groups/group.com.example.iosapp/secret.txt", container);
    report("read another app's group container", open_for(path, O_RDONLY));
    snprintf(path, sizeof path, "%s/../../groups/group.com.example.iosapp/stolen.txt", container);
    report("write another app's group container", open_for(path, O_WRONLY | O_CREAT));
    api->set_task_completed(host, task->task, true);
}

static int32_t launch(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *info,
                      char *error, size_t error_size) {
    (void)error;
    (void)error_size;
    api = a;
    host = h;
    snprintf(container, sizeof container, "%s", info->data_directory);
    snprintf(bundle, sizeof bundle, "%s", info->bundle_path);
    api->register_handler(host, "com.example.hostile.probe", probe, NULL);
    api->register_handler(host, "com.example.hostile.forgefinished", forge_finished, NULL);
    api->register_handler(host, "com.example.hostile.forgedone", forge_done, NULL);
    api->register_handler(host, "com.example.hostile.escape", escape, NULL);
    api->register_handler(host, "com.example.hostile.memfd", memfd_hoard, NULL);
    api->register_handler(host, "com.example.hostile.abi32", abi32, NULL);
    api->register_handler(host, "com.example.hostile.fillbytes", fill_bytes, NULL);
    api->register_handler(host, "com.example.hostile.fillinodes", fill_inodes, NULL);
    api->register_handler(host, "com.example.hostile.forgelog", forge_log, NULL);
    api->register_handler(host, "com.example.hostile.btflood", bt_flood, NULL);
    api->register_handler(host, "com.example.hostile.registerflood", register_flood, NULL);
    api->register_handler(host, "com.example.hostile.groupsteal", group_steal, NULL);
    api->register_handler(host, "com.example.hostile.forgefinishedchild", forge_finished_with_child, NULL);
    api->register_handler(host, "com.example.hostile.forgeidle", forge_idle, NULL);
    api->register_handler(host, "com.example.hostile.deafflood", deaf_flood, NULL);
    return 0;
}

BGTASK_PLUGIN("Hostile", launch)
