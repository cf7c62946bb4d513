#ifndef BGTASK_URLSESSION_HOOK_H
#define BGTASK_URLSESSION_HOOK_H

#include <stdbool.h>

/* Whether the hook on URLSession(configuration:delegate:delegateQueue:) found the real
 * initializer in libFoundationNetworking.so (see hook.c). */
bool bgtask_urlsession_hook_ready(void);

/* Calls `visit` with the name and address of each function symbol defined in the dynamic symbol
 * table of the loaded image that holds `address_in_object`, whose name starts with `prefix`,
 * until `visit` returns nonzero. Returns how many were visited, or -1 when the image or its
 * file cannot be read (method.c). */
int bgtask_object_symbols(const void *address_in_object, const char *prefix,
                          int (*visit)(const char *name, void *address, void *context), void *context);

/* Calls a Swift method taking one object argument and returning nothing: `function(argument)`
 * with `self` in Swift's context register. Both are borrowed: the caller keeps them alive. */
void bgtask_call_swift_method1(void *function, void *argument, void *self);

#endif
