import BGTaskControl
import GRDB

/// The schema of `bgtask.sqlite`. Migrations are append-only: never edit a registered one, add
/// the next (`v2`, ...) instead. Dates are REAL seconds since 1970; JSON columns hold the
/// Codable values named in their comments.
package enum StoreSchema {
    package static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: v1)
        }
        migrator.registerMigration("v2") { db in
            try db.execute(sql: v2)
        }
        migrator.registerMigration("v3") { db in
            try db.execute(sql: v3)
        }
        migrator.registerMigration("v4") { db in
            try db.execute(sql: v4)
        }
        migrator.registerMigration("v5") { db in
            try db.execute(sql: v5)
        }
        migrator.registerMigration("v6") { db in
            try db.execute(sql: v6)
        }
        migrator.registerMigration("v7") { db in
            try db.execute(sql: v7)
        }
        return migrator
    }

    package static let v1 = """
        -- One row per launch, from beginLaunch (state 'running') to finishLaunch or recovery
        -- (state 'ended', with its run record).
        CREATE TABLE launch (
            id TEXT PRIMARY KEY NOT NULL,
            app TEXT NOT NULL,
            reason TEXT NOT NULL,
            pid INTEGER,
            started_at REAL NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('running', 'ended')),
            tasks TEXT NOT NULL,            -- JSON [TaskAssignment]
            record TEXT,                    -- JSON RunRecord (RunRecord.jsonData), once ended
            ended_at REAL,
            CHECK ((state = 'ended') = (record IS NOT NULL))
        );
        CREATE INDEX launch_app_started ON launch(app, started_at, id);
        CREATE INDEX launch_started ON launch(started_at, id);
        CREATE INDEX launch_state ON launch(state);

        -- Task requests: pending (running_launch NULL) or taken by a running launch. seq is the
        -- submission order (AUTOINCREMENT: never reused, so it only grows).
        CREATE TABLE request (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            app TEXT NOT NULL,
            identifier TEXT NOT NULL,
            kind TEXT NOT NULL,
            earliest REAL,                  -- earliestBeginDate; NULL: due at once
            requires_network INTEGER NOT NULL,
            requires_power INTEGER NOT NULL,
            protection_type INTEGER NOT NULL,
            title TEXT,
            subtitle TEXT,
            strategy_fail INTEGER NOT NULL,
            required_resources INTEGER NOT NULL,
            submitted_at REAL NOT NULL,
            running_launch TEXT REFERENCES launch(id)
        );
        -- At most one pending request per (app, identifier); a running one may coexist.
        CREATE UNIQUE INDEX request_pending_unique ON request(app, identifier) WHERE running_launch IS NULL;
        -- dueApps and nextDueDate: a range of this index, never a scan of the table.
        CREATE INDEX request_pending_due ON request(earliest, app) WHERE running_launch IS NULL;
        -- pendingRequest(identifier:)
        CREATE INDEX request_pending_identifier ON request(identifier, app) WHERE running_launch IS NULL;
        -- submit's view of an app (pending and running), in submission order
        CREATE INDEX request_app ON request(app, seq);
        -- finishLaunch / recovery, and the foreign key (made partial by v2)
        CREATE INDEX request_running ON request(running_launch);

        CREATE TABLE app_state (
            app TEXT PRIMARY KEY NOT NULL,
            refresh_enabled INTEGER NOT NULL,
            penalty_level INTEGER NOT NULL,
            penalty_until REAL,
            last_launch_at REAL,
            last_launch_id TEXT,
            last_registered TEXT            -- JSON [String]; NULL before any launch
        );

        CREATE TABLE setting (
            key TEXT PRIMARY KEY NOT NULL,
            value TEXT NOT NULL
        );
        """
}

extension StoreSchema {
    /// v1's full index on running_launch let SQLite answer `running_launch IS NULL` (dueApps,
    /// nextDueDate) by walking every pending row through it instead of searching
    /// request_pending_due. Partial, it still serves `running_launch = ?` (finishLaunch,
    /// recovery, the foreign key) and no longer competes.
    package static let v2 = """
        DROP INDEX request_running;
        CREATE INDEX request_running ON request(running_launch) WHERE running_launch IS NOT NULL;
        """
}

extension StoreSchema {
    /// Background pushes: each app's device token, and the pushes received, pending until
    /// delivered in a launch or dropped (with why).
    package static let v3 = """
        CREATE TABLE device_token (
            app TEXT PRIMARY KEY NOT NULL,
            token TEXT NOT NULL UNIQUE,     -- 64 hex digits, made once per app
            created_at REAL NOT NULL
        );

        CREATE TABLE push (
            id TEXT PRIMARY KEY NOT NULL,   -- apns-id (a UUID)
            app TEXT NOT NULL,
            payload TEXT NOT NULL,          -- the JSON payload as received
            kind TEXT NOT NULL CHECK (kind IN ('background', 'alert')),
            priority INTEGER NOT NULL,
            expiration REAL,                -- apns-expiration; NULL: none given; 0: now or never
            collapse_id TEXT,
            received_at REAL NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dropped')),
            detail TEXT,                    -- why it was dropped, or how it was delivered
            launch_id TEXT,                 -- the launch it was delivered in
            settled_at REAL
        );
        CREATE INDEX push_pending ON push(state, received_at) WHERE state = 'pending';
        CREATE INDEX push_app ON push(app, received_at);
        """

    /// Local notifications: each app's authorization (the operator's switch and whether the app
    /// asked), and its notification requests, pending (with the next delivery date) or
    /// delivered. id is the order of addition and of delivery (AUTOINCREMENT: a delivered
    /// notification's id is the cursor `bgtask notifications --follow` reads after).
    package static let v4 = """
        CREATE TABLE notification_app (
            app TEXT PRIMARY KEY NOT NULL,
            allowed INTEGER,                -- the operator's switch: 1 on, 0 off, NULL not set
            asked_at REAL,                  -- the app's first requestAuthorization
            asked_options INTEGER NOT NULL DEFAULT 0
        );

        CREATE TABLE notification (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            app TEXT NOT NULL,
            identifier TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'delivered')),
            request TEXT NOT NULL,          -- JSON NotificationRequest
            added_at REAL NOT NULL,
            fire_at REAL,                   -- pending: the next delivery; delivered: when it was due
            delivered_at REAL,              -- delivered only
            launch_id TEXT,                 -- the launch that added it
            CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
        );
        -- One pending and one delivered notification per (app, identifier): adding an identifier
        -- again replaces the pending request, delivering it again replaces the delivered one.
        CREATE UNIQUE INDEX notification_pending ON notification(app, identifier) WHERE state = 'pending';
        CREATE UNIQUE INDEX notification_delivered ON notification(app, identifier) WHERE state = 'delivered';
        -- What is due, and the next date to wake for: a range of this index.
        CREATE INDEX notification_due ON notification(fire_at) WHERE state = 'pending';
        -- An app's lists, and pruning its delivered ones.
        CREATE INDEX notification_app_state ON notification(app, state, id);
        """
}

extension StoreSchema {
    /// Background URL sessions' transfers (Store/TransferStore.swift): one row per task an app
    /// handed the host, from `create` to `delivered` (kept as a record, bounded per app).
    /// Written durably at creation, at the first response (the validator a resume needs), and
    /// when it ends, is cancelled or is delivered; bytes received are written lazily (on resume
    /// the spool file's length is the truth).
    package static let v5 = """
        CREATE TABLE transfer (
            id TEXT PRIMARY KEY NOT NULL,   -- a UUID
            app TEXT NOT NULL,              -- the owner: the app (an extension's transfer is its app's)
            bundle TEXT NOT NULL,           -- the bundle whose launch created it (app or extension)
            session TEXT NOT NULL,
            task_identifier INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('download', 'upload', 'data')),
            request TEXT NOT NULL,          -- JSON TransferRequest, as the app handed it
            state TEXT NOT NULL CHECK (state IN ('waiting', 'running', 'completed', 'failed', 'cancelled', 'delivered')),
            held_by TEXT,                   -- while waiting: the condition holding it back
            bytes_received INTEGER NOT NULL DEFAULT 0,
            bytes_expected INTEGER NOT NULL DEFAULT -1,
            bytes_sent INTEGER NOT NULL DEFAULT 0,
            bytes_expected_to_send INTEGER NOT NULL DEFAULT 0,
            validator TEXT,                 -- ETag or Last-Modified of the partial body (If-Range)
            spool TEXT,                     -- the host-private partial file (STATE/transfers/ID.part)
            response TEXT,                  -- JSON TransferResponse
            body BLOB,                      -- data and upload tasks: the response body (bounded)
            error TEXT,                     -- JSON TransferError
            file TEXT,                      -- download, completed: the file in the app's container
            not_before REAL,                -- earliestBeginDate on the host's clock
            created_at REAL NOT NULL,
            finished_at REAL,
            attempts INTEGER NOT NULL DEFAULT 0,
            resumed INTEGER NOT NULL DEFAULT 0,
            launched_for TEXT,              -- the background-transfer launch started for its events
            delivered_in_launch TEXT,       -- the launch the app was told in
            delivered_at REAL
        );
        -- An app's sessions and lists, and the active-per-app count.
        CREATE INDEX transfer_app ON transfer(app, state, created_at);
        -- What a starting host resumes, and what waits for a launch.
        CREATE INDEX transfer_active ON transfer(state) WHERE state != 'delivered';
        """
}

extension StoreSchema {
    /// Energy accounting and MetricKit: each app's use summed per day of the host's clock
    /// (midnight UTC; a virtual clock's days too) as its launches end, and the crashes, hangs
    /// and CPU exceptions of those days. Both are kept `MetricStore.keptDays` days.
    package static let v6 = """
        CREATE TABLE app_day (
            app TEXT NOT NULL,
            day REAL NOT NULL,              -- the day's midnight UTC on the host's clock
            launches INTEGER NOT NULL DEFAULT 0,
            cpu_ms REAL NOT NULL DEFAULT 0,
            background_ms REAL NOT NULL DEFAULT 0,
            foreground_ms REAL NOT NULL DEFAULT 0,
            peak_memory INTEGER NOT NULL DEFAULT 0,
            disk_written INTEGER NOT NULL DEFAULT 0,
            disk_read INTEGER NOT NULL DEFAULT 0,
            wakeups INTEGER NOT NULL DEFAULT 0,
            exit_normal INTEGER NOT NULL DEFAULT 0,
            exit_memory INTEGER NOT NULL DEFAULT 0,
            exit_cpu INTEGER NOT NULL DEFAULT 0,
            exit_watchdog INTEGER NOT NULL DEFAULT 0,
            exit_assertion INTEGER NOT NULL DEFAULT 0,
            exit_abnormal INTEGER NOT NULL DEFAULT 0,
            exit_bad_access INTEGER NOT NULL DEFAULT 0,
            exit_illegal INTEGER NOT NULL DEFAULT 0,
            exit_disk INTEGER NOT NULL DEFAULT 0,
            background_cpu_ms REAL NOT NULL DEFAULT 0,     -- of background launches: what EnergyBudget judges
            background_disk_written INTEGER NOT NULL DEFAULT 0,
            excess TEXT,                    -- why the day's background use is excessive (EnergyBudget)
            delivered INTEGER NOT NULL DEFAULT 0,  -- handed to a launch (MetricKit)
            PRIMARY KEY (app, day)
        ) WITHOUT ROWID;

        CREATE TABLE app_diagnostic (
            launch_id TEXT PRIMARY KEY NOT NULL,
            app TEXT NOT NULL,
            day REAL NOT NULL,
            diagnostic TEXT NOT NULL        -- JSON MetricDiagnostic
        );
        CREATE INDEX app_diagnostic_day ON app_diagnostic(app, day);

        -- Foreground uses (`bgtask open`), on the host's clock: what usage patterns are predicted from.
        CREATE TABLE app_use (
            app TEXT NOT NULL,
            opened_at REAL NOT NULL
        );
        CREATE INDEX app_use_app ON app_use(app, opened_at);
        """
}

extension StoreSchema {
    /// The bytes apps' own TCP connections moved (`SocketTraffic`), summed per day beside what
    /// the host moved for their background sessions (the `transfer` table's); suspended apps
    /// evicted for memory pressure.
    package static let v7 = """
        ALTER TABLE app_day ADD COLUMN network_sent INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE app_day ADD COLUMN network_received INTEGER NOT NULL DEFAULT 0;
        -- Suspended processes evicted for memory pressure (MetricKit's memory-pressure exits).
        ALTER TABLE app_day ADD COLUMN exit_memory_pressure INTEGER NOT NULL DEFAULT 0;
        """
}
