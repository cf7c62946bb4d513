/*
 * ABIGrowth: plugins built against other sizes of the ABI's structs than the runner's, one per
 * launch (BGTASK_FIXTURE_MODE), for ABIGrowthTests. Each prints "abi-growth MODE: ..." lines to
 * the launch log and completes com.example.abigrowth.task successfully only when what it saw
 * is what the growth rules of bgtask/plugin.h promise.
 *
 *  - older              (older.c) built against its own copy of ABI 1 as first published: C
 *                       enum fields, a host table without app_group_container.
 *  - newer              (newer.c) built against a later version that appended fields to every
 *                       struct: a larger descriptor, request, host table and infos.
 *  - small-descriptor   (undersized.c) a descriptor whose size is below ABI 1's.
 *  - small-request      (undersized.c) submits a request whose size is below ABI 1's.
 */
#include <stdlib.h>
#include <string.h>

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN const void *abi_growth_older_entry(void);
HIDDEN const void *abi_growth_newer_entry(void);
HIDDEN const void *abi_growth_small_descriptor_entry(void);
HIDDEN const void *abi_growth_small_request_entry(void);

__attribute__((visibility("default"))) const void *bgtask_plugin_entry(void) {
    const char *mode = getenv("BGTASK_FIXTURE_MODE");
    if (mode == NULL || strcmp(mode, "older") == 0) return abi_growth_older_entry();
    if (strcmp(mode, "newer") == 0) return abi_growth_newer_entry();
    if (strcmp(mode, "small-descriptor") == 0) return abi_growth_small_descriptor_entry();
    if (strcmp(mode, "small-request") == 0) return abi_growth_small_request_entry();
    return NULL;
}
