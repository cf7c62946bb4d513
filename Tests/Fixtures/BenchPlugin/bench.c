/*
 * BenchPlugin: the tasks bgtask-bench measures the launch path with (Sources/bgtask-bench).
 *
 *  - bench.noop    completes at once: launch latency and throughput.
 *  - bench.expire  never completes on its own; its expiration handler completes it
 *                  (unsuccessfully) and returns true: expiration lateness.
 *  - bench.block   claims its expiration (returns true) but never completes, and blocks in
 *                  pause() forever: the watchdog must kill it.
 *  - bench.alloc   touches memory as fast as it can (1 MiB blocks, malloc + memset) until it
 *                  is killed: jetsam overshoot.
 *  - bench.stamp   stamps the time at handler entry (see stamp below), then completes: the
 *                  end-to-end figures through a running host.
 *  - bench.sleep   stamps, then stays open until its expiration handler, which stamps again
 *                  and completes it: 1,000 launches supervised at once, expiry lateness.
 *  - bench.hang    stamps, claims its expiration and never completes (as bench.block): the
 *                  watchdog at scale.
 * A launch for a background push (reason "remote-notification") stamps at the launch entry
 * and calls the push's completion handler at once.
 */
#include "bench.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const bgtask_host_api *api;
static bgtask_host *host;

/* What a stamp says: where (1 handler entered, 2 expiration handler entered, 3 push launch
 * entry), CLOCK_MONOTONIC (the same clock in every PID namespace: the bench compares it with
 * its own) and CLOCK_REALTIME, in ns. 24 bytes: one write of it to a FIFO is atomic. */
struct stamp {
    uint64_t what;
    uint64_t monotonic_ns;
    uint64_t realtime_ns;
};

/* The bench makes DATA_DIRECTORY/bench-stamp (a FIFO it reads, or a file) before it submits;
 * without it, nothing is stamped. Opened when the launch starts, written at the moment. */
static int stamp_fd = -1;

static void stamp(uint64_t what) {
    struct timespec m, r;
    clock_gettime(CLOCK_MONOTONIC, &m);
    clock_gettime(CLOCK_REALTIME, &r);
    if (stamp_fd < 0) return;
    struct stamp s = {what, (uint64_t)m.tv_sec * 1000000000u + (uint64_t)m.tv_nsec,
                      (uint64_t)r.tv_sec * 1000000000u + (uint64_t)r.tv_nsec};
    ssize_t written = write(stamp_fd, &s, sizeof s);
    (void)written;
}

static void stamp_noop(void *context, const bgtask_task_info *task) {
    (void)context;
    stamp(1);
    api->set_task_completed(host, task->task, true);
}

static bool sleep_expired(void *context, bgtask_task_id task) {
    (void)context;
    stamp(2);
    api->set_task_completed(host, task, false);
    return true;
}

static void sleep_until_expired(void *context, const bgtask_task_info *task) {
    (void)context;
    stamp(1);
    api->set_expiration_handler(host, task->task, sleep_expired, NULL);
}

static void noop(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_task_completed(host, task->task, true);
}

static bool expire_completes(void *context, bgtask_task_id task) {
    (void)context;
    api->set_task_completed(host, task, false);
    return true;
}

static void expire(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_expiration_handler(host, task->task, expire_completes, NULL);
}

static bool expire_ignored(void *context, bgtask_task_id task) {
    (void)context;
    (void)task;
    return true; /* "I will complete it" — and never does */
}

static void block(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_expiration_handler(host, task->task, expire_ignored, NULL);
    for (;;) pause();
}

static void hang(void *context, const bgtask_task_info *task) {
    (void)context;
    stamp(1);
    api->set_expiration_handler(host, task->task, expire_ignored, NULL);
    for (;;) pause();
}

/* The blocks stay reachable (a list through their first bytes): an allocation nobody can
 * see is one the compiler may delete, loop and all. */
static void *volatile blocks;

static void alloc(void *context, const bgtask_task_info *task) {
    (void)context;
    (void)task;
    enum { block_size = 1 << 20 };
    for (;;) {
        char *p = malloc(block_size);
        if (p == NULL) {
            for (;;) pause(); /* the RLIMIT_DATA backstop: wait for the kill */
        }
        memset(p, 0xa5, block_size);
        *(void **)p = blocks;
        blocks = p;
    }
}

static int32_t launch(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *info,
                      char *error, size_t error_size) {
    (void)error;
    (void)error_size;
    api = a;
    host = h;
    if (info->data_directory != NULL) {
        char path[4096];
        size_t length = strlen(info->data_directory);
        if (length + sizeof "/bench-stamp" <= sizeof path) {
            memcpy(path, info->data_directory, length);
            memcpy(path + length, "/bench-stamp", sizeof "/bench-stamp");
            stamp_fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
        }
    }
    if (info->size > offsetof(bgtask_launch_info, reason) && info->reason != NULL &&
        strcmp(info->reason, "remote-notification") == 0) {
        stamp(3);
        if (BGTASK_HAS(api, remote_notification_completed)) api->remote_notification_completed(host, BGTASK_FETCH_RESULT_NO_DATA);
    }
    api->register_handler(host, "bench.noop", noop, NULL);
    api->register_handler(host, "bench.expire", expire, NULL);
    api->register_handler(host, "bench.block", block, NULL);
    api->register_handler(host, "bench.alloc", alloc, NULL);
    api->register_handler(host, "bench.stamp", stamp_noop, NULL);
    api->register_handler(host, "bench.sleep", sleep_until_expired, NULL);
    api->register_handler(host, "bench.hang", hang, NULL);
    return 0;
}

BGTASK_PLUGIN("BenchPlugin", launch)
