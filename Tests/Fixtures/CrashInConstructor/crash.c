/* Fixture: a plugin whose load-time constructor crashes (before any entry is called). */
#include <bgtask/plugin.h>
#include <signal.h>
__attribute__((constructor)) static void crash_on_load(void) { raise(SIGSEGV); }
static int32_t unreachable(const bgtask_host_api *a, bgtask_host *h, const bgtask_launch_info *l, char *e, size_t n) {
    (void)a; (void)h; (void)l; (void)e; (void)n;
    return 0;
}
BGTASK_PLUGIN("CrashInConstructor", unreachable)
