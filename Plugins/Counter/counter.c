/*
 * Counter: a bgtask plugin written in C against bgtask/plugin.h, proving the ABI needs no Swift.
 *
 *  - com.example.counter.tick    registered from the launch function through the host table;
 *                                increments count.txt in the app's data directory.
 *  - com.example.counter.report  mapped in Info.plist (BGTaskHandlers) to counter_report, which
 *                                the runner calls through libffi; its bool result completes it.
 *  - com.example.counter.slow    mapped to counter_slow, which finishes on another thread by
 *                                calling `complete`, a libffi closure bound to its task.
 */
#include <bgtask/plugin.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const bgtask_host_api *api;
static bgtask_host *host;
static char count_path[4096];

static long read_count(void) {
    FILE *f = fopen(count_path, "r");
    long n = 0;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1) n = 0;
        fclose(f);
    }
    return n;
}

static bool write_count(long n) {
    FILE *f = fopen(count_path, "w");
    if (!f) return false;
    fprintf(f, "%ld\n", n);
    return fclose(f) == 0;
}

static bool tick_expired(void *context, bgtask_task_id task) {
    (void)context;
    api->set_task_completed(host, task, false);
    return true;
}

static void tick(void *context, const bgtask_task_info *task) {
    (void)context;
    api->set_expiration_handler(host, task->task, tick_expired, NULL);
    long n = read_count() + 1;
    bool ok = write_count(n);
    printf("counter: tick %ld\n", n);
    fflush(stdout);
    api->set_task_completed(host, task->task, ok);
}

/* Mapped: "counter_report(identifier, data_directory) -> bool" */
__attribute__((visibility("default"))) bool counter_report(const char *identifier, const char *data_directory) {
    printf("counter: %s in %s: count is %ld\n", identifier, data_directory, read_count());
    fflush(stdout);
    return true;
}

struct slow_job {
    void (*complete)(bool);
    uint64_t task;
};

static void *slow_worker(void *arg) {
    struct slow_job *job = arg;
    usleep(50 * 1000);
    printf("counter: slow task %llu done\n", (unsigned long long)job->task);
    fflush(stdout);
    job->complete(true);
    free(job);
    return NULL;
}

/* Mapped: "counter_slow(task_id, complete)" — returns at once, completes later. */
__attribute__((visibility("default"))) void counter_slow(uint64_t task, void (*complete)(bool)) {
    struct slow_job *job = malloc(sizeof *job);
    job->complete = complete;
    job->task = task;
    pthread_t thread;
    if (pthread_create(&thread, NULL, slow_worker, job) != 0) {
        free(job);
        complete(false);
        return;
    }
    pthread_detach(thread);
}

static int32_t counter_launch(const bgtask_host_api *host_api, bgtask_host *host_handle,
                              const bgtask_launch_info *launch, char *error, size_t error_size) {
    api = host_api;
    host = host_handle;
    snprintf(count_path, sizeof count_path, "%s/count.txt", launch->data_directory);
    if (!api->register_handler(host, "com.example.counter.tick", tick, NULL)) {
        snprintf(error, error_size, "com.example.counter.tick was not permitted");
        return 1;
    }
    return 0;
}

BGTASK_PLUGIN("Counter", counter_launch)
