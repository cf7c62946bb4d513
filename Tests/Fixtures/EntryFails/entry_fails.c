/* Fixture: a plugin whose launch function reports an error. */
#include <bgtask/plugin.h>
#include <stdio.h>
static int32_t refuse(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *l, char *error, size_t size) {
    (void)a; (void)h; (void)l;
    snprintf(error, size, "database file is missing");
    return 7;
}
BGTASK_PLUGIN("EntryFails", refuse)
