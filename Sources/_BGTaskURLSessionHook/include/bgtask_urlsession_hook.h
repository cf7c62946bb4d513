#ifndef BGTASK_URLSESSION_HOOK_H
#define BGTASK_URLSESSION_HOOK_H

#include <stdbool.h>

/* Whether the hook on URLSession(configuration:delegate:delegateQueue:) found the real
 * initializer in libFoundationNetworking.so (see hook.c). */
bool bgtask_urlsession_hook_ready(void);

#endif
