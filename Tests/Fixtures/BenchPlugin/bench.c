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
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const bgtask_host_api *api;
static bgtask_host *host;

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
    (void)info;
    (void)error;
    (void)error_size;
    api = a;
    host = h;
    api->register_handler(host, "bench.noop", noop, NULL);
    api->register_handler(host, "bench.expire", expire, NULL);
    api->register_handler(host, "bench.block", block, NULL);
    api->register_handler(host, "bench.alloc", alloc, NULL);
    return 0;
}

BGTASK_PLUGIN("BenchPlugin", launch)
