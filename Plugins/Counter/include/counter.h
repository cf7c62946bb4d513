/* The Counter example plugin exports its mapped handlers; see counter.c. */
#include <stdbool.h>
#include <stdint.h>
bool counter_report(const char *identifier, const char *data_directory);
void counter_slow(uint64_t task, void (*complete)(bool));
