/* Fixture: a plugin built for an ABI version this runner does not provide. */
#include <bgtask/plugin.h>
static int32_t never(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *l, char *e, size_t n) {
    (void)a; (void)h; (void)l; (void)e; (void)n;
    return 0;
}
__attribute__((visibility("default"))) const bgtask_plugin *bgtask_plugin_entry(void) {
    static const bgtask_plugin descriptor = {BGTASK_PLUGIN_MAGIC, 99, sizeof(bgtask_plugin), "BadABI", never};
    return &descriptor;
}
