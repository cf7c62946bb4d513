// Seeing every URLSession an app makes, so that a background session's events can be delivered
// to it (issue 16, docs/transfers.md).
//
// swift-corelibs-foundation gives no hook on a session's creation, and a relaunched app's
// background session has to be found the moment the app recreates it. This file defines the
// symbols of `URLSession.init(configuration:delegate:delegateQueue:)` (its allocating and its
// initializing entry points: debug callers call the first, optimized ones the second) with
// hidden visibility: it is linked into every plugin that
// uses the UIKit module, and the static linker binds the plugin's own calls to it rather than to
// libFoundationNetworking.so's, without touching any other image. It calls the real initializer
// (found once with dlsym in libFoundationNetworking.so) and tells the UIKit module about the new
// session. Both sides use Swift's calling convention (clang's swiftcall), so arguments and
// `self` in the context register pass through untouched.
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

#define URLSESSION_INIT_PREFIX \
    "$s20FoundationNetworking10URLSessionC13configuration8delegate0E5QueueAcA0C13ConfigurationC_AA0C8Delegate_pSg0A009OperationF0CSgtc"
// The allocating initializer (`fC`: `self` is the metatype) is what a caller's code calls; an
// optimized caller allocates the object itself and calls the initializing one (`fc`: `self` is
// the new object). Both are hooked, each calling its own original: Foundation's `fC` calls its
// `fc` directly, so a session is seen once.
#define ALLOCATING_SYMBOL URLSESSION_INIT_PREFIX "fC"
#define INITIALIZING_SYMBOL URLSESSION_INIT_PREFIX "fc"

// configuration, delegate (a class-bound existential: object and witness table), delegateQueue
// (optional object), and `self` in the context register.
typedef void *InitializerType(void *, void *, void *, void *, void *SWIFT_CONTEXT) SWIFTCALL;

// Defined in the UIKit module (BackgroundSessions.swift) with @_cdecl.
extern void bgtask_urlsession_created(void *session);

static _Atomic(InitializerType *) real_allocating, real_initializing;

static InitializerType *resolve(_Atomic(InitializerType *) *slot, const char *symbol) {
    InitializerType *found = atomic_load_explicit(slot, memory_order_acquire);
    if (found) return found;
    void *library = dlopen("libFoundationNetworking.so", RTLD_NOW | RTLD_NOLOAD);
    if (!library) library = dlopen("libFoundationNetworking.so", RTLD_NOW | RTLD_GLOBAL);
    if (!library) return NULL;
    found = (InitializerType *)dlsym(library, symbol);
    if (found) atomic_store_explicit(slot, found, memory_order_release);
    return found;
}

bool bgtask_urlsession_hook_ready(void) {
    return resolve(&real_allocating, ALLOCATING_SYMBOL) != NULL && resolve(&real_initializing, INITIALIZING_SYMBOL) != NULL;
}

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_allocating_init(
    void *configuration, void *delegate, void *witness, void *queue, void *metatype SWIFT_CONTEXT)
    __asm__(ALLOCATING_SYMBOL);

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_allocating_init(
    void *configuration, void *delegate, void *witness, void *queue, void *metatype SWIFT_CONTEXT) {
    InitializerType *initializer = resolve(&real_allocating, ALLOCATING_SYMBOL);
    if (!initializer) __builtin_trap(); // libFoundationNetworking.so is this plugin's dependency: never
    void *session = initializer(configuration, delegate, witness, queue, metatype);
    bgtask_urlsession_created(session);
    return session;
}

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_initializing_init(
    void *configuration, void *delegate, void *witness, void *queue, void *object SWIFT_CONTEXT)
    __asm__(INITIALIZING_SYMBOL);

__attribute__((visibility("hidden"))) SWIFTCALL void *bgtask_urlsession_initializing_init(
    void *configuration, void *delegate, void *witness, void *queue, void *object SWIFT_CONTEXT) {
    InitializerType *initializer = resolve(&real_initializing, INITIALIZING_SYMBOL);
    if (!initializer) __builtin_trap();
    void *session = initializer(configuration, delegate, witness, queue, object);
    bgtask_urlsession_created(session);
    return session;
}
