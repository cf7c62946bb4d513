#include <bgtask/plugin.h>
