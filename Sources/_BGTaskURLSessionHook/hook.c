// Seeing every URLSession an app makes, so that a background session's events can be delivered
// to it (issue 16, docs/transfers.md).
//
// swift-corelibs-foundation gives no hook on a session's creation, and a relaunched app's
// background session has to be found the moment the app recreates it. This file defines the
// symbol of `URLSession.init(configuration:delegate:delegateQueue:)` (the allocating entry point
// that callers in other modules call) with hidden visibility: it is linked into every plugin that
// uses the UIKit module, and the static linker binds the plugin's own calls to it rather than to
// libFoundationNetworking.so's, without touching any other image. It calls the real initializer
// (found once with dlsym in libFoundationNetworking.so) and tells the UIKit module about the new
// session. Both sides use Swift's calling convention (clang's swiftcall), so arguments and the
// metatype in the context register pass through untouched.
//
// If Foundation's signature ever changes, the mangled name no longer matches: the plugin's calls
// bind to Foundation's initializer as before, sessions are made as usual, and
// BackgroundSessionTests fails (it checks that the hook saw the session).
#include <dlfcn.h>
#include <stddef.h>
#include <stdatomic.h>
#include "bgtask_urlsession_hook.h"

#define SWIFTCALL __attribute__((swiftcall))
#define SWIFT_CONTEXT __attribute__((swift_context))

#define URLSESSION_INIT_SYMBOL \
    "$s20FoundationNetworking10URLSessionC13configuration8delegate0E5QueueAcA0C13ConfigurationC_AA0C8Delegate_pSg0A009OperationF0CSgtcfC"

// configuration, delegate (a class-bound existential: object and witness table), delegateQueue
// (optional object), and the metatype as `self`.
typedef void *InitializerType(void *, void *, void *, void *, void *SWIFT_CONTEXT) SWIFTCALL;

// Defined in the UIKit module (BackgroundSessions.swift) with @_cdecl.
extern void bgtask_urlsession_created(void *session);

static _Atomic(InitializerType *) real_initializer;

static InitializerType *resolve(void) {
    InitializerType *found = atomic_load_explicit(&real_initializer, memory_order_acquire);
    if (found) return found;
    void *library = dlopen("libFoundationNetworking.so", RTLD_NOW | RTLD_NOLOAD);
    if (!library) library = dlopen("libFoundationNetworking.so", RTLD_NOW | RTLD_GLOBAL);
    if (!library) return NULL;
    found = (InitializerType *)dlsym(library, URLSESSION_INIT_SYMBOL);
    if (found) atomic_store_explicit(&real_initializer, found, memory_order_release);
    return found;
}

bool bgtask_urlsession_hook_ready(void) { return resolve() != NULL; }

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_init(
    void *configuration, void *delegate, void *witness, void *queue, void *metatype SWIFT_CONTEXT)
    __asm__(URLSESSION_INIT_SYMBOL);

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_init(
    void *configuration, void *delegate, void *witness, void *queue, void *metatype SWIFT_CONTEXT) {
    InitializerType *initializer = resolve();
    if (!initializer) __builtin_trap(); // libFoundationNetworking.so is this plugin's dependency: never
    void *session = initializer(configuration, delegate, witness, queue, metatype);
    bgtask_urlsession_created(session);
    return session;
}
