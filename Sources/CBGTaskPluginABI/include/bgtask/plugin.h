/*
 * bgtask plugin ABI — the single definition of the contract between a plugin library and the
 * process that loads it (the bgtask runner, a child of the host).
 *
 * Rules that keep this ABI stable (the sqlite3_api_routines pattern):
 *   - A plugin exports exactly one symbol, BGTASK_ENTRY_SYMBOL, returning a static descriptor.
 *   - A plugin never links against the host. Everything it may call arrives in bgtask_host_api,
 *     a table that only grows: new functions are appended, nothing is removed or reordered.
 *     `size` tells a plugin how much of the table this host provides; check it (BGTASK_HAS)
 *     before calling a function added after the version you were built against.
 *   - BGTASK_ABI_VERSION changes only for an incompatible change; the runner refuses a plugin
 *     whose descriptor names another version, before calling any of its code but the entry.
 *   - Tasks and identifiers cross the boundary as values (ids, C strings), never as host
 *     addresses the plugin must keep.
 *
 * How the structs grow. Every struct that crosses the boundary (bgtask_plugin, bgtask_host_api,
 * bgtask_launch_info, bgtask_task_info, bgtask_request) has a `size` field near its start that
 * never moves, set by the side that writes the struct to sizeof the struct it was built with.
 *   - New fields are only appended, each one starting at or after the previous version's
 *     sizeof (never in its tail padding, which an older writer leaves unset). Nothing is
 *     removed, reordered or retyped; a change that needs that is a new BGTASK_ABI_VERSION.
 *   - The side that reads a struct reads min(its own sizeof, the writer's `size`) bytes and
 *     treats fields beyond the writer's size as zero, so a field added later must mean
 *     "absent" or "as before" when it is zero (a function pointer: NULL, not provided).
 *     Bytes beyond the reader's own sizeof are ignored: they are a newer writer's fields.
 *     bgtask_read_struct (below) does exactly this.
 *   - A `size` below the struct's first version (BGTASK_*_MIN_SIZE) is refused: the runner
 *     fails the launch (a descriptor) or the call (a request, BGTASK_E_INVALID_ARGUMENT), and
 *     the Swift SDK fails the launch (a host table or launch info), each with a message that
 *     names the struct and both sizes. Both sides check: the runner what the plugin hands it,
 *     the SDK what the runner hands it; a C plugin should do the same (BGTASK_READ).
 *   - Struct fields are fixed-width integers, never C enum types: an enum's size is the
 *     compiler's choice (-fshort-enums, other ABIs), a uint32_t's is not. The enums below only
 *     name the values.
 *
 * Threads: the runner's main thread is the app's main thread. The launch function runs on it;
 * then it runs the main run loop, which drains the main dispatch queue. Launch handlers run on
 * the main queue, one at a time (the Swift SDK hops to the queue the app gave). Expiration
 * handlers run on a different thread, so a handler that blocks can still be expired. Every host function may
 * be called from any thread. None is async-signal-safe.
 */
#ifndef BGTASK_PLUGIN_H
#define BGTASK_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BGTASK_ABI_VERSION 1u
#define BGTASK_PLUGIN_MAGIC 0x62677461u /* "bgta" */
#define BGTASK_ENTRY_SYMBOL "bgtask_plugin_entry"

/* The number of bytes of `type` up to the end of `field`. */
#define BGTASK_END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* True when the host table `api` is large enough to contain `field`. */
#define BGTASK_HAS(api, field) ((api)->size >= BGTASK_END_OF(bgtask_host_api, field))

/* A task's type: bgtask_task_info.type, bgtask_request.type. */
typedef uint32_t bgtask_task_type;
enum bgtask_task_type_value {
    BGTASK_TYPE_REFRESH = 1,
    BGTASK_TYPE_PROCESSING = 2,
    BGTASK_TYPE_HEALTH_RESEARCH = 3,
    BGTASK_TYPE_CONTINUED_PROCESSING = 4,
};

/* Why the process was launched: bgtask_launch_info.role. */
typedef uint32_t bgtask_launch_role;
enum bgtask_launch_role_value {
    BGTASK_ROLE_BACKGROUND = 0, /* launched by the system to run tasks */
    BGTASK_ROLE_FOREGROUND = 1, /* opened by the user (`bgtask open`) */
    BGTASK_ROLE_EXTENSION = 2,  /* an app extension; may submit, cannot register */
};

/* Status codes, returned as int32_t. 1...4 equal BGTaskScheduler.Error.Code. */
typedef enum bgtask_status {
    BGTASK_OK = 0,
    BGTASK_E_UNAVAILABLE = 1,
    BGTASK_E_TOO_MANY_PENDING = 2,
    BGTASK_E_NOT_PERMITTED = 3,
    BGTASK_E_IMMEDIATE_RUN_INELIGIBLE = 4,
    BGTASK_E_INVALID_ARGUMENT = 100,
    BGTASK_E_HOST = 101, /* the host could not be reached or failed */
    BGTASK_E_NOT_FOUND = 102, /* nothing to give (metric_payloads: no payload is waiting) */
} bgtask_status;

typedef uint64_t bgtask_task_id;
typedef struct bgtask_host bgtask_host; /* opaque; owned by the runner */

typedef struct bgtask_task_info {
    uint32_t size;              /* sizeof(bgtask_task_info) of the runner */
    bgtask_task_id task;        /* names this task in every host call */
    const char *identifier;     /* valid until the task completes */
    bgtask_task_type type;      /* BGTASK_TYPE_* */
} bgtask_task_info;

/* Called once per task on the main thread (the main queue). Should return promptly: a handler
 * that blocks holds the main queue, as on iOS. The task stays open until set_task_completed is
 * called for it. */
typedef void (*bgtask_launch_handler)(void *context, const bgtask_task_info *task);

/* Called on the expiration thread when the launch's time runs out (or the user cancels).
 * Return true if the app was told (it will complete the task itself), false if it has no
 * handler, in which case the host completes the task unsuccessfully. */
typedef bool (*bgtask_expiration_handler)(void *context, bgtask_task_id task);

typedef struct bgtask_launch_info {
    uint32_t size;              /* sizeof(bgtask_launch_info) of the runner */
    bgtask_launch_role role;    /* BGTASK_ROLE_* */
    const char *bundle_identifier;
    const char *bundle_path;
    const char *data_directory; /* the app's container; persists across launches */
    const char *launch_id;
    const char *event_json;     /* extensions: the event they were started with, or NULL */
    /* ---- ABI 1, appended (check the struct's size) ---- */
    /* Why the system launched the app: "scheduled", "simulated", "foreground", "extension",
     * "remote-notification" (then event_json is the push's payload), ... */
    const char *reason;
} bgtask_launch_info;

/* A continued-processing request's submission strategy: bgtask_request.strategy. Values as
 * BGContinuedProcessingTaskRequest.SubmissionStrategy. */
typedef uint32_t bgtask_strategy;
enum bgtask_strategy_value {
    BGTASK_STRATEGY_FAIL = 0,
    BGTASK_STRATEGY_QUEUE = 1,
};

#define BGTASK_RESOURCE_GPU 1u

/* Written by the plugin (submit) and by the runner (pending). */
typedef struct bgtask_request {
    uint32_t size;                /* sizeof(bgtask_request) of the side that wrote it */
    bgtask_task_type type;        /* BGTASK_TYPE_* */
    const char *identifier;
    double earliest_begin_date;   /* seconds since 1970; NaN for none */
    bool requires_network;        /* processing, health research */
    bool requires_external_power; /* processing, health research */
    int32_t protection_type;      /* health research: 0 none, 1 complete, 2 unless open, 3 until first auth */
    const char *title;            /* continued processing */
    const char *subtitle;         /* continued processing */
    bgtask_strategy strategy;     /* continued processing: BGTASK_STRATEGY_* */
    uint32_t required_resources;  /* continued processing: BGTASK_RESOURCE_* bits */
} bgtask_request;

typedef void (*bgtask_request_visitor)(void *context, const bgtask_request *request);

/* Called with one JSON text (UTF-8, NUL-terminated, valid during the call). */
typedef void (*bgtask_json_visitor)(void *context, const char *json);
/* The app's state changed (set_state_handler): BGTASK_APP_STATE_*. */
typedef void (*bgtask_state_handler)(void *context, uint32_t state);
/* The device's thermal state (BGTASK_THERMAL_*) or Low Power Mode changed (set_device_handler). */
typedef void (*bgtask_device_handler)(void *context, uint32_t thermal_state, bool low_power_mode);
/* A suspended app was resumed for a new launch (set_resume_handler): `launch` is the new
 * launch's info, valid during the call. */
typedef void (*bgtask_resume_handler)(void *context, const struct bgtask_launch_info *launch);

#define BGTASK_LOG_DEBUG 0
#define BGTASK_LOG_INFO 1
#define BGTASK_LOG_ERROR 2

typedef struct bgtask_host_api {
    uint32_t abi_version; /* BGTASK_ABI_VERSION of the runner */
    uint32_t size;        /* sizeof(bgtask_host_api) of the runner */

    /* ---- ABI 1 ---- */

    /* Registers a launch handler. Returns 1 when registered, 0 when the identifier is not in
     * BGTaskSchedulerPermittedIdentifiers or this process may not register (an extension).
     * Registering an identifier twice, or after launch (continued processing excepted), ends
     * the launch as on iOS: the call does not return. */
    int32_t (*register_handler)(bgtask_host *host, const char *identifier,
                                bgtask_launch_handler handler, void *context);

    /* Sets or clears (NULL) the expiration callback of a running task. */
    void (*set_expiration_handler)(bgtask_host *host, bgtask_task_id task,
                                   bgtask_expiration_handler handler, void *context);

    /* Completes a task. Idempotent: later calls are ignored. */
    void (*set_task_completed)(bgtask_host *host, bgtask_task_id task, bool success);

    /* Submits a request for this app. On failure returns a bgtask_status and writes a message
     * into `message` (NUL-terminated, truncated to message_size). A request whose `size` is
     * below BGTASK_REQUEST_MIN_SIZE is refused (BGTASK_E_INVALID_ARGUMENT). */
    int32_t (*submit)(bgtask_host *host, const bgtask_request *request,
                      char *message, size_t message_size);

    void (*cancel)(bgtask_host *host, const char *identifier);
    void (*cancel_all)(bgtask_host *host);

    /* Calls `visitor` once per pending request of this app, then returns. */
    int32_t (*pending)(bgtask_host *host, bgtask_request_visitor visitor, void *context);

    /* Writes a line to the launch's log. */
    void (*log)(bgtask_host *host, int32_t level, const char *message);

    /* Continued processing: progress and text shown to the user. */
    void (*update_progress)(bgtask_host *host, bgtask_task_id task, int64_t completed, int64_t total);
    void (*update_title)(bgtask_host *host, bgtask_task_id task, const char *title, const char *subtitle);

    /* BGTASK_RESOURCE_* bits this machine supports. */
    uint32_t (*supported_resources)(bgtask_host *host);

    /* ---- ABI 1, appended (check BGTASK_HAS(api, app_group_container)) ---- */

    /* The shared container of app group `group_identifier` (a directory the app and its
     * extensions that name the group in com.apple.security.application-groups all see), or NULL
     * when this bundle is not entitled to the group. Valid for the life of the process. */
    const char *(*app_group_container)(bgtask_host *host, const char *group_identifier);

    /* ---- ABI 1, appended (check BGTASK_HAS(api, begin_background_time)) ---- */

    /* Background time, as UIApplication.beginBackgroundTask: while an assertion is held the
     * launch goes on after its last task has ended, until the assertion is ended or the
     * launch's time runs out. Shortly before then `expiration` (may be NULL; its return value
     * is ignored) is called on the runner's expiration thread with the assertion's id: end it
     * there, or the launch is killed at the end of its grace, as iOS kills the app. `name` may
     * be NULL. Returns the assertion's id, or BGTASK_BACKGROUND_TIME_INVALID (0) once the
     * launch's time has run out. */
    uint64_t (*begin_background_time)(bgtask_host *host, const char *name,
                                      bgtask_expiration_handler expiration, void *context);
    /* Ends an assertion. An unknown or already ended id is ignored. */
    void (*end_background_time)(bgtask_host *host, uint64_t id);
    /* Seconds until the launch's time runs out (UIApplication.backgroundTimeRemaining): very
     * large (DBL_MAX) while a foreground launch is in the foreground. */
    double (*background_time_remaining)(bgtask_host *host);
    /* BGTASK_APP_STATE_*: the app's state now (UIApplication.applicationState). */
    uint32_t (*application_state)(bgtask_host *host);
    /* BGTASK_REFRESH_STATUS_*: the device's and the app's Background App Refresh switches when
     * the launch started (UIApplication.backgroundRefreshStatus). */
    uint32_t (*background_refresh_status)(bgtask_host *host);

    /* ---- ABI 1, appended: remote notifications (check BGTASK_HAS(api, register_remote_notifications)) ---- */

    /* UIApplication.registerForRemoteNotifications: writes the app's device token (64 hex
     * digits, NUL-terminated; stable for the app across launches and host restarts) into
     * `token` and returns 0, or returns a bgtask_status with the reason written there. */
    int32_t (*register_remote_notifications)(bgtask_host *host, char *token, size_t token_size);
    /* The completion handler of application(_:didReceiveRemoteNotification:fetchCompletionHandler:)
     * was called with `result` (BGTASK_FETCH_RESULT_*). Later calls are ignored. */
    void (*remote_notification_completed)(bgtask_host *host, uint32_t result);

    /* ---- ABI 1, appended: local notifications ---- */
    /* (check BGTASK_HAS(api, notification_authorization)) UNUserNotificationCenter. A request
     * crosses as JSON (UTF-8, at most 16 KiB), the shape of NotificationRequest in
     * Sources/BGTaskModel/Notifications.swift and docs/abi.md:
     *   {"identifier":"id","content":{"title":"","subtitle":"","body":"","badge":1,
     *    "sound":"default","user_info":{},"thread_identifier":"","category_identifier":""},
     *    "trigger":{"type":"time-interval","time_interval":60,"repeats":false}}
     * ("trigger" absent: delivered at once; or {"type":"calendar","date_components":{"hour":8,
     * "minute":30,"weekday":2,"time_zone":"Europe/Paris"},"repeats":true}). Every content key
     * may be left out. */

    /* The app's authorization, BGTASK_NOTIFICATION_AUTH_* (UNAuthorizationStatus). With
     * `request` true the app asks for it (requestAuthorization; `options` are
     * UNAuthorizationOptions' bits): no prompt exists, the host answers with the operator's
     * decision and records that the app asked. */
    uint32_t (*notification_authorization)(bgtask_host *host, uint32_t options, bool request);
    /* Adds (or replaces, by identifier) a request. BGTASK_OK, or BGTASK_E_NOTIFICATIONS_NOT_ALLOWED
     * (not authorized), BGTASK_E_NOTIFICATION_NO_DATE (calendar components no date matches),
     * BGTASK_E_INVALID_ARGUMENT (the JSON, a field over its limit: `message` names the field),
     * BGTASK_E_HOST; the message is written into `message` (NUL-terminated, truncated). As on
     * iOS, an app keeps at most 64 pending requests: the ones that fire last are discarded. */
    int32_t (*notification_add)(bgtask_host *host, const char *request_json, char *message, size_t message_size);
    /* Calls `visitor` once per pending request (BGTASK_NOTIFICATIONS_PENDING, JSON as above,
     * soonest first) or delivered notification (BGTASK_NOTIFICATIONS_DELIVERED, as
     * {"date":SECONDS_SINCE_1970,"request":{...}}, newest first), then returns a status. The
     * string is valid during the call. */
    int32_t (*notification_list)(bgtask_host *host, uint32_t which, bgtask_json_visitor visitor, void *context);
    /* Removes pending requests or delivered notifications (`which`) with these identifiers;
     * `identifiers` NULL removes all of them. Unknown identifiers are ignored. */
    int32_t (*notification_remove)(bgtask_host *host, uint32_t which, const char *const *identifiers, size_t count);

    /* ---- ABI 1, appended: background URL sessions (check BGTASK_HAS(api, transfer_call)) ---- */
    /* The host carries a background session's tasks (URLSessionConfiguration.background):
     * calls and answers cross as JSON (UTF-8), the shapes of TransferCall, TransferReply and
     * TransferEvent in Sources/BGTaskModel/Transfers.swift (docs/abi.md):
     *   {"op":"create","request":{"session":"com.example.bg","taskIdentifier":1,"kind":"download",
     *    "url":"https://example.com/f","method":"GET","headers":[],"discretionary":false,
     *    "sendsLaunchEvents":true,"allowsCellularAccess":true,"allowsExpensiveNetworkAccess":true,
     *    "allowsConstrainedNetworkAccess":true,"requestTimeout":60,"resourceTimeout":604800}}
     *   {"op":"cancel","id":"..."}   {"op":"attach","session":"..."}   {"op":"delivered","id":"..."}
     *   {"op":"events-handled","session":"..."}
     * Sends a call (at most 64 KiB) and waits for the host's answer: BGTASK_OK with the
     * TransferReply's JSON passed to `reply` (valid during the call; `reply` may be NULL), or a
     * bgtask_status with the reason passed to `reply` as {"error":"..."}. */
    int32_t (*transfer_call)(bgtask_host *host, const char *call_json, bgtask_json_visitor reply, void *context);
    /* Sets the function the runner calls, on its reader thread, with each TransferEvent's JSON
     * for the sessions this launch attached to ("progress", "finished"). NULL stops them. The
     * function must not block: hand the event to a queue. */
    void (*transfer_events)(bgtask_host *host, bgtask_json_visitor handler, void *context);

    /* ---- ABI 1, appended: the app's state (check BGTASK_HAS(api, set_state_handler)) ---- */
    /* Sets the function the runner calls with the app's new state (BGTASK_APP_STATE_*) when it
     * changes: a foreground launch leaving the foreground (BGTASK_APP_STATE_BACKGROUND), called
     * on the runner's reader thread before the launch may end, so it can take background time
     * (begin_background_time) and hand the rest to the main queue; it must not block. And a
     * process that is not kept after its launch, about to end (BGTASK_APP_STATE_TERMINATING),
     * on the main thread once the launch's work is over. NULL stops the calls. */
    void (*set_state_handler)(bgtask_host *host, bgtask_state_handler handler, void *context);

    /* ---- ABI 1, appended: the app's process lives on (check BGTASK_HAS(api, set_resume_handler)) ---- */
    /* With the host's default lifecycle an app's process is not ended when a launch's work is
     * over: it is suspended, and the app's next launch resumes it. The launch function is not
     * called again (the handlers it registered stay registered, the app's memory is as it left
     * it); instead the runner calls `handler` with the new launch's info, on the main thread,
     * before the new launch's tasks start (push payloads and transfer events arrive here, as
     * they arrive in the launch info of a fresh launch). NULL stops the calls. */
    void (*set_resume_handler)(bgtask_host *host, bgtask_resume_handler handler, void *context);

    /* ---- ABI 1, appended: the device's state (check BGTASK_HAS(api, thermal_state)) ---- */
    /* The device's thermal state now (BGTASK_THERMAL_*: ProcessInfo.thermalState). The host
     * expires background launches when it turns critical. */
    uint32_t (*thermal_state)(bgtask_host *host);
    /* Low Power Mode now (ProcessInfo.isLowPowerModeEnabled). */
    bool (*low_power_mode)(bgtask_host *host);
    /* Sets the function the runner calls, on its reader thread, when the thermal state or Low
     * Power Mode changes during a launch, or changed while the app was suspended (called as it
     * resumes, before the new launch's tasks). It must not block. NULL stops the calls. */
    void (*set_device_handler)(bgtask_host *host, bgtask_device_handler handler, void *context);

    /* ---- ABI 1, appended: MetricKit (check BGTASK_HAS(api, metric_payloads)) ---- */
    /* Calls `visitor` once with the app's metrics the host has not delivered before (days that
     * have ended, and their crash and hang diagnostics) as JSON, the shape of MetricDelivery in
     * Sources/BGTaskModel/MetricDay.swift (dates in seconds since 1970), then returns BGTASK_OK;
     * or returns BGTASK_E_NOT_FOUND without calling it when there are none. The host hands
     * each day to one launch only, as iOS delivers a day's payload once. */
    int32_t (*metric_payloads)(bgtask_host *host, bgtask_json_visitor visitor, void *context);

    /* ---- ABI 1, appended: foreground presentation (check BGTASK_HAS(api, set_notification_handler)) ---- */
    /* Sets the function the runner calls, on its reader thread, with each notification of the
     * app's delivered while it is in the foreground, as JSON ({"date":SECONDS_SINCE_1970,
     * "request":{...}}, as notification_list gives delivered ones); it must not block. The
     * app answers with notification_presented (UNUserNotificationCenterDelegate.willPresent). */
    void (*set_notification_handler)(bgtask_host *host, bgtask_json_visitor handler, void *context);
    /* How the app presents notification `identifier` (UNNotificationPresentationOptions' bits:
     * 1 badge, 2 sound, 4 alert, 8 list, 16 banner; 0: not shown). */
    void (*notification_presented)(bgtask_host *host, const char *identifier, uint32_t options);
} bgtask_host_api;

/* ProcessInfo.ThermalState's raw values. */
#define BGTASK_THERMAL_NOMINAL 0u
#define BGTASK_THERMAL_FAIR 1u
#define BGTASK_THERMAL_SERIOUS 2u
#define BGTASK_THERMAL_CRITICAL 3u

/* Local notifications: bgtask_host_api.notification_* */
#define BGTASK_NOTIFICATIONS_PENDING 0u
#define BGTASK_NOTIFICATIONS_DELIVERED 1u
/* UNAuthorizationStatus's raw values. */
#define BGTASK_NOTIFICATION_AUTH_NOT_DETERMINED 0u
#define BGTASK_NOTIFICATION_AUTH_DENIED 1u
#define BGTASK_NOTIFICATION_AUTH_AUTHORIZED 2u
/* Statuses of notification_add, beside bgtask_status's (UNError.Code's meanings). */
#define BGTASK_E_NOTIFICATIONS_NOT_ALLOWED 110
#define BGTASK_E_NOTIFICATION_NO_DATE 111

/* UIBackgroundFetchResult's raw values. */
#define BGTASK_FETCH_RESULT_NEW_DATA 0
#define BGTASK_FETCH_RESULT_NO_DATA 1
#define BGTASK_FETCH_RESULT_FAILED 2

#define BGTASK_BACKGROUND_TIME_INVALID 0

/* UIApplication.State's raw values. */
#define BGTASK_APP_STATE_ACTIVE 0
#define BGTASK_APP_STATE_INACTIVE 1
#define BGTASK_APP_STATE_BACKGROUND 2
/* Not one of UIApplication.State's: the process is about to end while it runs (a launch whose
 * process is not kept, at its end). Told on the main thread, with nothing left to do after. */
#define BGTASK_APP_STATE_TERMINATING 3

/* UIBackgroundRefreshStatus's raw values. */
#define BGTASK_REFRESH_STATUS_RESTRICTED 0
#define BGTASK_REFRESH_STATUS_DENIED 1
#define BGTASK_REFRESH_STATUS_AVAILABLE 2

/* Called on the runner's main thread after registration of Info.plist-mapped handlers, as
 * application(_:didFinishLaunchingWithOptions:). Register handlers here. Return 0 on success;
 * anything else fails the launch, with the text written to `error` as the reason. */
typedef int32_t (*bgtask_launch_fn)(const bgtask_host_api *api, bgtask_host *host,
                                    const bgtask_launch_info *launch,
                                    char *error, size_t error_size);

/* The first three fields are read before anything else and never move. */
typedef struct bgtask_plugin {
    uint32_t magic;       /* BGTASK_PLUGIN_MAGIC */
    uint32_t abi_version; /* BGTASK_ABI_VERSION the plugin was built against */
    uint32_t size;        /* sizeof(bgtask_plugin) of the plugin */
    const char *name;     /* informational */
    bgtask_launch_fn launch;
} bgtask_plugin;

/* The size of each struct as ABI 1 first defined it (the end of its last field then). A struct
 * whose `size` says less is refused; these never change. The host table's first version ended
 * at supported_resources (app_group_container was appended). */
enum {
    BGTASK_PLUGIN_MIN_SIZE = BGTASK_END_OF(bgtask_plugin, launch),
    BGTASK_HOST_API_MIN_SIZE = BGTASK_END_OF(bgtask_host_api, supported_resources),
    BGTASK_LAUNCH_INFO_MIN_SIZE = BGTASK_END_OF(bgtask_launch_info, event_json),
    BGTASK_TASK_INFO_MIN_SIZE = BGTASK_END_OF(bgtask_task_info, type),
    BGTASK_REQUEST_MIN_SIZE = BGTASK_END_OF(bgtask_request, required_resources),
};

/* The `size` field of the struct at `s` (0 when `s` is NULL), read as bytes: no wider access to
 * a struct the other side may have written shorter than the reader's type. Any thread;
 * async-signal-safe. */
static inline uint32_t bgtask_struct_size(const void *s, size_t size_offset) {
    uint32_t size = 0;
    if (s != NULL) memcpy(&size, (const char *)s + size_offset, sizeof size);
    return size;
}

/* Reads a struct the other side wrote, as the growth rules say: copies min(own_size,
 * their_size) bytes of `theirs` into `own` and zeroes the rest of `own`, so that a field the
 * writer did not know reads as zero (and `own`'s size field keeps the writer's size). Returns
 * false, with `own` zeroed, when `theirs` is NULL or their_size is below min_size (a
 * BGTASK_*_MIN_SIZE). Any thread; async-signal-safe. */
static inline bool bgtask_read_struct(void *own, size_t own_size, const void *theirs,
                                      size_t their_size, size_t min_size) {
    memset(own, 0, own_size);
    if (theirs == NULL || their_size < min_size) return false;
    memcpy(own, theirs, their_size < own_size ? their_size : own_size);
    return true;
}

/* bgtask_read_struct for a variable `own` of one of the structs above and a pointer `theirs`
 * (evaluated twice) to the same struct as the other side wrote it. In a launch handler:
 *     bgtask_task_info info;
 *     if (!BGTASK_READ(info, task, BGTASK_TASK_INFO_MIN_SIZE)) return;   (refused)
 * then read `info`, and check BGTASK_HAS on a host table read the same way. */
#define BGTASK_READ(own, theirs, min_size)                                                \
    bgtask_read_struct(&(own), sizeof(own), (theirs),                                     \
                       bgtask_struct_size((theirs), (size_t)((const char *)&(own).size -  \
                                                             (const char *)&(own))),      \
                       (min_size))

/* The layout of the first version, pinned where it was defined (LP64 Linux): a change that
 * moves a field of ABI 1 fails here, not in a plugin built last year. */
#if defined(__LP64__)
#ifdef __cplusplus
#define BGTASK_STATIC_ASSERT(condition, message) static_assert(condition, message)
#else
#define BGTASK_STATIC_ASSERT(condition, message) _Static_assert(condition, message)
#endif
BGTASK_STATIC_ASSERT(offsetof(bgtask_plugin, size) == 8 && BGTASK_PLUGIN_MIN_SIZE == 32, "bgtask_plugin: ABI 1 layout");
BGTASK_STATIC_ASSERT(offsetof(bgtask_host_api, size) == 4 && BGTASK_HOST_API_MIN_SIZE == 96, "bgtask_host_api: ABI 1 layout");
BGTASK_STATIC_ASSERT(offsetof(bgtask_launch_info, size) == 0 && BGTASK_LAUNCH_INFO_MIN_SIZE == 48, "bgtask_launch_info: ABI 1 layout");
BGTASK_STATIC_ASSERT(offsetof(bgtask_task_info, size) == 0 && BGTASK_TASK_INFO_MIN_SIZE == 28, "bgtask_task_info: ABI 1 layout");
BGTASK_STATIC_ASSERT(offsetof(bgtask_request, size) == 0 && BGTASK_REQUEST_MIN_SIZE == 56, "bgtask_request: ABI 1 layout");
BGTASK_STATIC_ASSERT(offsetof(bgtask_request, strategy) == 48 && offsetof(bgtask_request, required_resources) == 52, "bgtask_request: ABI 1 layout");
#undef BGTASK_STATIC_ASSERT
#endif

/* The one exported symbol: returns a descriptor with static storage duration. */
typedef const bgtask_plugin *(*bgtask_plugin_entry_fn)(void);

/* Declares the entry of a C plugin:  BGTASK_PLUGIN("Counter", counter_launch)  */
#define BGTASK_PLUGIN(name_, launch_)                                              \
    __attribute__((visibility("default"))) const bgtask_plugin *bgtask_plugin_entry(void) { \
        static const bgtask_plugin descriptor = {                                  \
            BGTASK_PLUGIN_MAGIC, BGTASK_ABI_VERSION, sizeof(bgtask_plugin), name_, launch_}; \
        return &descriptor;                                                        \
    }

#ifdef __cplusplus
}
#endif

#endif /* BGTASK_PLUGIN_H */
