/* BenchPlugin: the plugin bgtask-bench launches (see bench.c). It exports only the ABI entry,
 * bgtask_plugin_entry, declared by BGTASK_PLUGIN in bgtask/plugin.h. */
#include <bgtask/plugin.h>
