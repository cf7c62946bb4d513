/*
 * Structs whose size says less than ABI 1's: the runner must refuse them, naming the struct and
 * both sizes, and never read past what they declare.
 */
#include <bgtask/plugin.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static const bgtask_host_api *api;
static bgtask_host *host;

__attribute__((visibility("hidden"))) const void *abi_growth_small_descriptor_entry(void) {
    /* Built against a header that is not bgtask/plugin.h: its descriptor stops after `size`. */
    static const struct { uint32_t magic, abi_version, size, padding; } descriptor = {
        BGTASK_PLUGIN_MAGIC, BGTASK_ABI_VERSION, 16, 0};
    return &descriptor;
}

static void run(void *context, const bgtask_task_info *task) {
    (void)context;
    /* A request that declares only its size and type: everything after is not the plugin's. */
    bgtask_request request;
    memset(&request, 0, sizeof request);
    request.size = 8;
    request.type = BGTASK_TYPE_PROCESSING;
    request.identifier = "com.example.abigrowth.later";
    request.earliest_begin_date = NAN;
    char message[256] = "";
    int32_t status = api->submit(host, &request, message, sizeof message);
    printf("abi-growth small-request: submit returned %d: %s\n", status, message);
    fflush(stdout);
    api->set_task_completed(host, task->task, status == BGTASK_E_INVALID_ARGUMENT);
}

static int32_t launch(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *info, char *error, size_t error_size) {
    (void)info; (void)error; (void)error_size;
    api = a;
    host = h;
    return api->register_handler(host, "com.example.abigrowth.task", run, NULL) == 1 ? 0 : 2;
}

__attribute__((visibility("hidden"))) const void *abi_growth_small_request_entry(void) {
    static const bgtask_plugin descriptor = {BGTASK_PLUGIN_MAGIC, BGTASK_ABI_VERSION, sizeof(bgtask_plugin), "ABIGrowth (small request)", launch};
    return &descriptor;
}
