/*
 * A plugin built against a later version of bgtask/plugin.h (still ABI 1), in which every struct
 * had fields appended, as the growth rules allow: each one below is today's struct followed by
 * the new fields. The runner must ignore what it does not know of the descriptor and the
 * request; this plugin must read the runner's smaller table and infos with the new fields zero.
 */
#include <bgtask/plugin.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct future_plugin {
    bgtask_plugin current;
    uint64_t capabilities;       /* appended */
    const char *minimum_host;    /* appended */
} future_plugin;

typedef struct future_host_api {
    bgtask_host_api current;
    void (*future_function)(bgtask_host *host); /* appended */
} future_host_api;

typedef struct future_launch_info {
    bgtask_launch_info current;
    uint64_t launch_flags;       /* appended */
} future_launch_info;

typedef struct future_task_info {
    bgtask_task_info current;
    uint32_t priority;           /* appended */
} future_task_info;

typedef struct future_request {
    bgtask_request current;
    uint32_t priority;           /* appended */
    const char *group;           /* appended */
} future_request;

#define SIZE_OFFSET(type) offsetof(type, size)

static future_host_api api;
static bgtask_host *host;

struct found {
    bool request;
    bool trailing_zero;
};

static void found(void *context, const bgtask_request *theirs) {
    future_request request;
    if (!bgtask_read_struct(&request, sizeof request, theirs, bgtask_struct_size(theirs, SIZE_OFFSET(bgtask_request)),
                            BGTASK_REQUEST_MIN_SIZE)) return;
    if (strcmp(request.current.identifier, "com.example.abigrowth.later") != 0) return;
    struct found *f = context;
    f->request = true;
    f->trailing_zero = request.priority == 0 && request.group == NULL;
    printf("abi-growth newer: pending request of %u bytes, read as %zu (priority %u, group %s)\n",
           request.current.size, sizeof request, request.priority, request.group ? request.group : "none");
}

static void run(void *context, const bgtask_task_info *theirs) {
    (void)context;
    future_task_info task;
    if (!bgtask_read_struct(&task, sizeof task, theirs, bgtask_struct_size(theirs, SIZE_OFFSET(bgtask_task_info)),
                            BGTASK_TASK_INFO_MIN_SIZE)) {
        printf("abi-growth newer: task info refused (%u bytes)\n", bgtask_struct_size(theirs, SIZE_OFFSET(bgtask_task_info)));
        fflush(stdout);
        return;
    }
    /* A request of the later version, with its new fields set: the runner reads what it knows. */
    future_request request;
    memset(&request, 0, sizeof request);
    request.current.size = sizeof request;
    request.current.type = BGTASK_TYPE_PROCESSING;
    request.current.identifier = "com.example.abigrowth.later";
    request.current.earliest_begin_date = NAN;
    request.current.requires_external_power = true;
    request.priority = 7;
    request.group = "not for this runner";
    char message[256] = "";
    int32_t status = api.current.submit(host, &request.current, message, sizeof message);
    struct found f = {false, false};
    api.current.pending(host, found, &f);
    printf("abi-growth newer: task %s (type %u, info %u bytes, priority %u): submitted %zu bytes: %d%s%s, pending %s\n",
           task.current.identifier, task.current.type, task.current.size, task.priority, sizeof request, status,
           message[0] ? ": " : "", message, f.request ? "found" : "missing");
    fflush(stdout);
    api.current.set_task_completed(host, task.current.task,
                                   status == BGTASK_OK && f.request && f.trailing_zero && task.priority == 0 &&
                                   task.current.type == BGTASK_TYPE_PROCESSING);
}

static int32_t launch(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *theirs,
                      char *error, size_t error_size) {
    future_launch_info info;
    if (a->abi_version != BGTASK_ABI_VERSION ||
        !bgtask_read_struct(&api, sizeof api, a, bgtask_struct_size(a, SIZE_OFFSET(bgtask_host_api)), BGTASK_HOST_API_MIN_SIZE) ||
        !bgtask_read_struct(&info, sizeof info, theirs, bgtask_struct_size(theirs, SIZE_OFFSET(bgtask_launch_info)),
                            BGTASK_LAUNCH_INFO_MIN_SIZE)) {
        snprintf(error, error_size, "newer: host table of ABI %u, %u bytes; launch info %u bytes", a->abi_version,
                 bgtask_struct_size(a, SIZE_OFFSET(bgtask_host_api)), bgtask_struct_size(theirs, SIZE_OFFSET(bgtask_launch_info)));
        return 1;
    }
    host = h;
    /* The appended function is absent from a runner that does not know it: zero, and the size says so. */
    bool has_future = api.current.size >= BGTASK_END_OF(future_host_api, future_function);
    printf("abi-growth newer: host table %u bytes, built against %zu: future_function %s%s; "
           "launch info %u bytes, built against %zu, launch_flags %llu; app_group_container %s\n",
           api.current.size, sizeof api, has_future ? "present" : "absent",
           api.future_function == NULL ? " (NULL)" : " (set)", info.current.size, sizeof info,
           (unsigned long long)info.launch_flags, BGTASK_HAS(&api.current, app_group_container) ? "present" : "absent");
    fflush(stdout);
    if (has_future || api.future_function != NULL || info.launch_flags != 0) {
        snprintf(error, error_size, "newer: fields the runner does not know read as non-zero");
        return 3;
    }
    return api.current.register_handler(host, "com.example.abigrowth.task", run, NULL) == 1 ? 0 : 2;
}

__attribute__((visibility("hidden"))) const void *abi_growth_newer_entry(void) {
    static const future_plugin descriptor = {
        {BGTASK_PLUGIN_MAGIC, BGTASK_ABI_VERSION, sizeof(future_plugin), "ABIGrowth (newer)", launch},
        0xfeedfacecafebeefull,
        "a runner from the future",
    };
    return &descriptor;
}
