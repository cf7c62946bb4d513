#define _GNU_SOURCE
#include "bgtask_system_shims.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, channel_fd, 3);
    if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&actions, 4);

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
