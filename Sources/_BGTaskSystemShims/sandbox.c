// The confinement a launch applies to itself before any plugin code runs: Landlock (what it may
// read, write and execute; whom it may signal; which abstract sockets it may reach) and a
// seccomp-bpf filter (system calls no app needs, that would let it reach past its launch).
// Called by the runner on its main thread while it is the process's only thread, after
// no_new_privs. Linux only; constants are spelled out so that older kernel headers build it.
// A zygote's spare makes the ruleset's system part; the spare, like the launch, is an ordinary
// process by then (docs/isolation.md, "After fork"), so nothing here has to be
// async-signal-safe; the marker above each function says which are.
#define _GNU_SOURCE
#include "bgtask_system_shims.h"

#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <grp.h>
#include <sys/syscall.h>
#include <unistd.h>

// MARK: Landlock (uapi values: include/uapi/linux/landlock.h)

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1

#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)    /* ABI 2 */
#define LL_FS_TRUNCATE (1ULL << 14) /* ABI 3 */
#define LL_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */

#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define LL_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI 4 */
    uint64_t scoped;             /* ABI 6 */
};

struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* Async-signal-safe: yes */
int bgtask_landlock_abi(void) {
    /* The kernel's answer cannot change while it runs: asked once (by the zygote, for all its
     * children), not at every rule a launch adds. */
    static int abi = -1;
    if (abi < 0) {
        long answer = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
        abi = answer < 0 ? 0 : (int)answer;
    }
    return abi;
}

static uint64_t handled_fs(int abi) {
    uint64_t access = LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_REMOVE_DIR |
                      LL_FS_REMOVE_FILE | LL_FS_MAKE_CHAR | LL_FS_MAKE_DIR | LL_FS_MAKE_REG | LL_FS_MAKE_SOCK |
                      LL_FS_MAKE_FIFO | LL_FS_MAKE_BLOCK | LL_FS_MAKE_SYM;
    if (abi >= 2) access |= LL_FS_REFER;
    if (abi >= 3) access |= LL_FS_TRUNCATE;
    if (abi >= 5) access |= LL_FS_IOCTL_DEV;
    return access;
}

/* The rights a rule may grant on a file that is not a directory. */
#define LL_FILE_RIGHTS (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

/* Async-signal-safe: no — snprintf and strerror for its error; the spare and the launch. */
static int add_rule(int ruleset, const char *path, uint64_t access, uint64_t handled, int optional,
                    char *error, size_t error_size) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (optional) return 0;
        snprintf(error, error_size, "landlock: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat info;
    if (fstat(fd, &info) == 0 && !S_ISDIR(info.st_mode)) access &= LL_FILE_RIGHTS;
    struct ll_path_beneath_attr rule = {.allowed_access = access & handled, .parent_fd = fd};
    long rc = syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0);
    int saved = errno;
    close(fd);
    if (rc != 0) {
        snprintf(error, error_size, "landlock: rule for %s: %s", path, strerror(saved));
        return -1;
    }
    return 0;
}

/* Async-signal-safe: yes */
int bgtask_landlock_create(int *abi_out) {
    int abi = bgtask_landlock_abi();
    if (abi_out) *abi_out = abi;
    if (abi <= 0) return -1;
    struct ll_ruleset_attr attr = {.handled_access_fs = handled_fs(abi)};
    size_t attr_size = offsetof(struct ll_ruleset_attr, handled_access_net);
    if (abi >= 6) {
        attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
        attr_size = sizeof attr;
    }
    return (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
}

/* Async-signal-safe: no — add_rule's error; the spare and the launch, ordinary processes. */
int bgtask_landlock_allow(int ruleset, const char *const *paths, int count, int kind, char *error, size_t error_size) {
    int abi = bgtask_landlock_abi();
    uint64_t handled = handled_fs(abi);
    uint64_t rights;
    switch (kind) {
    case BGTASK_LANDLOCK_READ_EXECUTE: rights = LL_FS_EXECUTE | LL_FS_READ_FILE | LL_FS_READ_DIR; break;
    case BGTASK_LANDLOCK_DEVICE: rights = LL_FS_READ_FILE | LL_FS_WRITE_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV; break;
    default: rights = handled; break;
    }
    /* Read and device paths that do not exist here are skipped; a writable one must exist. */
    int optional = kind != BGTASK_LANDLOCK_READ_WRITE;
    for (int i = 0; i < count; i++) {
        if (add_rule(ruleset, paths[i], rights, handled, optional, error, error_size) != 0) return -1;
    }
    return 0;
}

int bgtask_landlock_restrict(int ruleset, char *error, size_t error_size) {
    int rc = (int)syscall(SYS_landlock_restrict_self, ruleset, 0);
    int saved = errno;
    close(ruleset);
    if (rc != 0) {
        snprintf(error, error_size, "landlock: restrict_self: %s", strerror(saved));
        return -1;
    }
    return 0;
}

// MARK: seccomp-bpf

#if defined(__x86_64__)
#define BGTASK_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define BGTASK_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#ifndef SECCOMP_FILTER_FLAG_TSYNC
#define SECCOMP_FILTER_FLAG_TSYNC (1UL << 0)
#endif
#ifndef __X32_SYSCALL_BIT
#define __X32_SYSCALL_BIT 0x40000000
#endif

#define DENY(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)

/* Namespace flags and CLONE_PARENT (a sibling of the runner outside its tree) in clone(2)'s
 * flags; the low byte is the exit signal. */
#define DENIED_CLONE_FLAGS (CLONE_PARENT | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | \
                            CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

int bgtask_apply_syscall_filter(char *error, size_t error_size) {
#ifndef BGTASK_AUDIT_ARCH
    snprintf(error, error_size, "seccomp: no filter for this architecture");
    return -1;
#else
    struct sock_filter filter[] = {
        /* Only this architecture's native system call ABI: no 32-bit (int 0x80) or x32 calls,
         * whose numbers would slip past the checks below. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, BGTASK_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        /* System V shared memory: outside every file rule, and memory the supervisor could not
         * count. (POSIX shared memory lives in /dev/shm, which Landlock keeps out of reach.) */
        DENY(SYS_shmget), DENY(SYS_shmat),
        /* Every call a launch makes runs this program: the common ones (read, write, mmap,
         * poll, ...) are numbered below the first one it refuses (ptrace, 101), clone aside. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, SYS_ptrace, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
#endif
        /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        /* clone: no new namespaces, no CLONE_PARENT. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, DENIED_CLONE_FLAGS, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* prctl: the runner is its processes' subreaper, and stays it. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_CHILD_SUBREAPER, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* Reaching other processes, the kernel, the machine's mounts and clocks. */
        DENY(SYS_ptrace), DENY(SYS_process_vm_readv), DENY(SYS_process_vm_writev), DENY(SYS_kcmp),
        DENY(SYS_pidfd_getfd), DENY(SYS_mount), DENY(SYS_umount2), DENY(SYS_pivot_root), DENY(SYS_chroot),
        DENY(SYS_open_tree), DENY(SYS_move_mount), DENY(SYS_fsopen), DENY(SYS_fsconfig), DENY(SYS_fsmount),
        DENY(SYS_fspick), DENY(SYS_mount_setattr), DENY(SYS_unshare), DENY(SYS_setns),
        DENY(SYS_kexec_load), DENY(SYS_kexec_file_load), DENY(SYS_init_module), DENY(SYS_finit_module),
        DENY(SYS_delete_module), DENY(SYS_reboot), DENY(SYS_swapon), DENY(SYS_swapoff), DENY(SYS_acct),
        DENY(SYS_quotactl), DENY(SYS_bpf), DENY(SYS_perf_event_open), DENY(SYS_userfaultfd),
        DENY(SYS_keyctl), DENY(SYS_add_key), DENY(SYS_request_key),
        DENY(SYS_io_uring_setup), DENY(SYS_io_uring_enter), DENY(SYS_io_uring_register),
        DENY(SYS_open_by_handle_at), DENY(SYS_name_to_handle_at), DENY(SYS_fanotify_init),
        DENY(SYS_clock_settime), DENY(SYS_clock_adjtime), DENY(SYS_settimeofday), DENY(SYS_adjtimex),
        DENY(SYS_syslog), DENY(SYS_vhangup),
#if defined(__x86_64__)
        DENY(SYS_iopl), DENY(SYS_ioperm),
#endif
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = (unsigned short)(sizeof filter / sizeof filter[0]), .filter = filter};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) != 0) {
        snprintf(error, error_size, "seccomp: %s", strerror(errno));
        return -1;
    }
    return 0;
#endif
}

int bgtask_set_no_new_privs(void) {
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

struct library_directories {
    char *buffer;
    size_t size;
    size_t used;
};

static int add_library_directory(struct dl_phdr_info *info, size_t info_size, void *context) {
    (void)info_size;
    struct library_directories *directories = context;
    const char *path = info->dlpi_name;
    if (path == NULL || path[0] != '/') return 0;
    const char *slash = strrchr(path, '/');
    size_t length = (size_t)(slash - path);
    if (length == 0) length = 1;
    for (size_t at = 0; at < directories->used; at += strlen(directories->buffer + at) + 1) {
        if (strlen(directories->buffer + at) == length && strncmp(directories->buffer + at, path, length) == 0) return 0;
    }
    if (directories->used + length + 1 > directories->size) return 0;
    memcpy(directories->buffer + directories->used, path, length);
    directories->buffer[directories->used + length] = 0;
    directories->used += length + 1;
    return 0;
}

/* Async-signal-safe: no — dl_iterate_phdr takes the loader's lock; the zygote, before it forks. */
size_t bgtask_loaded_library_directories(char *buffer, size_t size) {
    struct library_directories directories = {.buffer = buffer, .size = size, .used = 0};
    dl_iterate_phdr(add_library_directory, &directories);
    return directories.used;
}

int bgtask_seccomp_mode(void) {
    return prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
}

int bgtask_become_user(uint32_t uid, uint32_t gid, const uint32_t *groups, int group_count, uint32_t process_limit) {
    if (process_limit > 0) {
        struct rlimit processes = {.rlim_cur = process_limit, .rlim_max = process_limit};
        setrlimit(RLIMIT_NPROC, &processes);
    }
    gid_t list[64];
    if (group_count < 0 || group_count > 64) { errno = EINVAL; return -1; }
    for (int i = 0; i < group_count; i++) list[i] = (gid_t)groups[i];
    if (setgroups((size_t)group_count, list) != 0) return -1;
    if (setresgid(gid, gid, gid) != 0) return -1;
    if (setresuid(uid, uid, uid) != 0) return -1;
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid) { errno = EPERM; return -1; }
    umask(0007);
    return 0;
}
