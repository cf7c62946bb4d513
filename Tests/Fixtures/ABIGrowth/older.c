/*
 * A plugin built against bgtask/plugin.h as ABI 1 was first published (commit b6533c6): the
 * structs below are that header's, renamed, and this file does not include today's header.
 * Its fields were C enums then (4 bytes with GCC and Clang on Linux, as uint32_t is now), and
 * its host table ended at supported_resources. A runner with a larger table must serve it.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define V1_ABI_VERSION 1u
#define V1_PLUGIN_MAGIC 0x62677461u

typedef enum v1_task_type {
    V1_TYPE_REFRESH = 1,
    V1_TYPE_PROCESSING = 2,
    V1_TYPE_HEALTH_RESEARCH = 3,
    V1_TYPE_CONTINUED_PROCESSING = 4,
} v1_task_type;

typedef enum v1_launch_role { V1_ROLE_BACKGROUND = 0, V1_ROLE_FOREGROUND = 1, V1_ROLE_EXTENSION = 2 } v1_launch_role;
typedef enum v1_strategy { V1_STRATEGY_FAIL = 0, V1_STRATEGY_QUEUE = 1 } v1_strategy;

typedef struct v1_host v1_host;

typedef struct v1_task_info {
    uint32_t size;
    uint64_t task;
    const char *identifier;
    v1_task_type type;
} v1_task_info;

typedef void (*v1_launch_handler)(void *context, const v1_task_info *task);
typedef bool (*v1_expiration_handler)(void *context, uint64_t task);

typedef struct v1_launch_info {
    uint32_t size;
    v1_launch_role role;
    const char *bundle_identifier;
    const char *bundle_path;
    const char *data_directory;
    const char *launch_id;
    const char *event_json;
} v1_launch_info;

typedef struct v1_request {
    uint32_t size;
    v1_task_type type;
    const char *identifier;
    double earliest_begin_date;
    bool requires_network;
    bool requires_external_power;
    int32_t protection_type;
    const char *title;
    const char *subtitle;
    v1_strategy strategy;
    uint32_t required_resources;
} v1_request;

typedef void (*v1_request_visitor)(void *context, const v1_request *request);

typedef struct v1_host_api {
    uint32_t abi_version;
    uint32_t size;
    int32_t (*register_handler)(v1_host *host, const char *identifier, v1_launch_handler handler, void *context);
    void (*set_expiration_handler)(v1_host *host, uint64_t task, v1_expiration_handler handler, void *context);
    void (*set_task_completed)(v1_host *host, uint64_t task, bool success);
    int32_t (*submit)(v1_host *host, const v1_request *request, char *message, size_t message_size);
    void (*cancel)(v1_host *host, const char *identifier);
    void (*cancel_all)(v1_host *host);
    int32_t (*pending)(v1_host *host, v1_request_visitor visitor, void *context);
    void (*log)(v1_host *host, int32_t level, const char *message);
    void (*update_progress)(v1_host *host, uint64_t task, int64_t completed, int64_t total);
    void (*update_title)(v1_host *host, uint64_t task, const char *title, const char *subtitle);
    uint32_t (*supported_resources)(v1_host *host);
} v1_host_api;

typedef int32_t (*v1_launch_fn)(const v1_host_api *api, v1_host *host, const v1_launch_info *launch,
                                 char *error, size_t error_size);

typedef struct v1_plugin {
    uint32_t magic;
    uint32_t abi_version;
    uint32_t size;
    const char *name;
    v1_launch_fn launch;
} v1_plugin;

static const v1_host_api *api;
static v1_host *host;

static void found(void *context, const v1_request *request) {
    if (request->size < sizeof *request) return; /* a runner older than this plugin: not here */
    if (strcmp(request->identifier, "com.example.abigrowth.later") == 0 && request->type == V1_TYPE_PROCESSING) {
        *(bool *)context = true;
    }
}

static void run(void *context, const v1_task_info *task) {
    (void)context;
    v1_request request;
    memset(&request, 0, sizeof request);
    request.size = sizeof request;
    request.type = V1_TYPE_PROCESSING;
    request.identifier = "com.example.abigrowth.later";
    request.earliest_begin_date = NAN;
    request.requires_network = true;
    char message[256] = "";
    int32_t status = api->submit(host, &request, message, sizeof message);
    bool pending = false;
    api->pending(host, found, &pending);
    printf("abi-growth older: task %s (type %d, info %u bytes): submit %d%s%s, pending %s\n",
           task->identifier, (int)task->type, task->size, status, message[0] ? ": " : "", message,
           pending ? "found" : "missing");
    fflush(stdout);
    api->set_task_completed(host, task->task, status == 0 && pending && task->type == V1_TYPE_PROCESSING);
}

static int32_t launch(const v1_host_api *a, v1_host *h, const v1_launch_info *info, char *error, size_t error_size) {
    /* This plugin's own check: a host at least as new as the header it was built with. */
    if (a->abi_version != V1_ABI_VERSION || a->size < sizeof *a || info->size < sizeof *info) {
        snprintf(error, error_size, "older: host table %u bytes (ABI %u), launch info %u bytes", a->size, a->abi_version, info->size);
        return 1;
    }
    api = a;
    host = h;
    printf("abi-growth older: host table %u bytes, built against %zu; launch info %u bytes, built against %zu; role %d\n",
           a->size, sizeof *a, info->size, sizeof *info, (int)info->role);
    fflush(stdout);
    return api->register_handler(host, "com.example.abigrowth.task", run, NULL) == 1 ? 0 : 2;
}

__attribute__((visibility("hidden"))) const void *abi_growth_older_entry(void) {
    static const v1_plugin descriptor = {V1_PLUGIN_MAGIC, V1_ABI_VERSION, sizeof(v1_plugin), "ABIGrowth (older)", launch};
    return &descriptor;
}
