/* The ABI is header-only; this file lets SwiftPM build the target as a module. */
#include "bgtask/plugin.h"
