#!/usr/bin/env python3
"""Crash loop: SIGKILLs a real `bgtask host` N times under load and checks that nothing
acknowledged is lost or doubled and that nothing of a dead host is left running.

Starts a host (its own session and process group, a temporary state directory) with several
apps (the Misbehaving fixture's library under generated Info.plists, each permitting its own
unique task identifiers). A client thread submits processing requests over the control socket
in a loop (most due at once, so that launches run and are killed mid-way; some an hour ahead,
so that they stay pending), each identifier at most once. Meanwhile the host is SIGKILLed at
random moments N times and restarted on the same state directory each time.

After each kill: every process of the dead host's session (its zygote, spares, and launches:
`bgtask-launch` in /proc/PID/cmdline) must be gone within a grace period; this tool is their
child subreaper, so they come back to it to be seen and reaped. At the end, once the last host
has run what is due: every request the client saw acknowledged is pending (`bgtask pending
--json`) or has run (a record in `bgtask history APP --json` other than `host-lost`) exactly
once, never both; a request whose answer was lost with the host is there at most once; a
refused one is not there; the host leaves no zombie children; after a graceful stop no process
of any of the hosts' sessions is left. Only processes of the tool's own hosts' sessions (or
reparented to the tool) are ever looked at or killed, by pid and process group.

Bounded: --restarts kills, --deadline seconds in all (the loop stops early at the deadline and
checks what it has). A failure keeps the state directory (database, logs, host log) and a
summary in an artifacts directory; `--seed` makes the kill moments and submissions the same.

Exit status 0 and a last line `PASS ...`, or 1 and `FAIL ...`.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_common as hc  # noqa: E402


class Client(threading.Thread):
    """Submits each (app, identifier) once, in a loop, over a persistent connection."""

    def __init__(self, path, apps, rng, future_share, pause):
        super().__init__(daemon=True)
        self.path = path
        self.queue = [(app, identifier) for app, identifiers in apps for identifier in identifiers]
        rng.shuffle(self.queue)
        self.rng = rng
        self.future_share = future_share
        self.pause = pause
        self.stop_flag = threading.Event()
        self.acknowledged = {}   # (app, id) -> kind of request ("now" / "later")
        self.unknown = set()     # sent, answer lost with the host
        self.refused = {}        # (app, id) -> code
        self.not_sent = 0
        self.sock = None
        self.lost_reasons = {}   # why answers were lost: "send: ...", "answer: closed", ...
        self.later = {}          # app -> requests an hour ahead sent (at most later_cap each)
        self.later_cap = 5

    def connection(self):
        if self.sock is None:
            self.sock = hc.connect(self.path, timeout=10)
        return self.sock

    def drop(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def note(self, reason):
        self.lost_reasons[reason] = self.lost_reasons.get(reason, 0) + 1

    def run(self):
        later = time.time() + 3600
        index = 0
        while not self.stop_flag.is_set() and index < len(self.queue):
            app, identifier = self.queue[index]
            # At most `later_cap` never-due requests per app: the other 10 - later_cap slots of
            # Apple's per-app limit stay free for requests that run.
            when = "later" if self.rng.random() < self.future_share and self.later.get(app, 0) < self.later_cap else "now"
            body = {"verb": "submit", "app": app,
                    "request": hc.task("processing", identifier, earliest=later if when == "later" else None)}
            try:
                sock = self.connection()
            except OSError:
                # Not connected: the request never left; the same one is tried again.
                self.not_sent += 1
                time.sleep(0.02)
                continue
            if when == "later":
                self.later[app] = self.later.get(app, 0) + 1
            try:
                sock.sendall(hc.frame(hc.encode(body)))
            except OSError as error:
                # The host may have read it before it died: its fate is unknown.
                self.unknown.add((app, identifier))
                self.note("send: %s" % type(error).__name__)
                index += 1
                self.drop()
                continue
            payload, reason = hc.FrameReader(sock).next(time.monotonic() + 15)
            index += 1
            if payload is None:
                self.unknown.add((app, identifier))
                self.note("answer: %s" % reason)
                self.drop()
                continue
            answer = json.loads(payload)
            if answer.get("ok"):
                self.acknowledged[(app, identifier)] = when
            else:
                self.refused[(app, identifier)] = (answer.get("error") or {}).get("code", "?")
            if self.pause:
                time.sleep(self.pause)
        self.drop()


HOSTILE_APP = "org.hostile.crashhostile"
HOSTILE_TASKS = ["com.example.misbehaving.block", "com.example.misbehaving.fork-setsid"]


class HostileSubmitter(threading.Thread):
    """Keeps a launch that resists dying in the host: `block` (blocks in pause() until the
    watchdog) and `fork-setsid` (leaves a grandchild in its own session that ignores SIGTERM),
    resubmitted every half second (a resubmission replaces the pending one). Outside the
    ledger: what matters is that none of their processes outlives a killed host."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.stop_flag = threading.Event()
        self.acknowledged = 0

    def run(self):
        while not self.stop_flag.wait(0.5):
            for identifier in HOSTILE_TASKS:
                try:
                    answer = hc.request(self.path, {"verb": "submit", "app": HOSTILE_APP,
                                                    "request": hc.task("processing", identifier)}, timeout=5)
                    self.acknowledged += 1 if answer.get("ok") else 0
                except (OSError, ValueError):
                    pass


def install_apps(args, scratch, plugins):
    apps = []
    staging = scratch.join("staging")
    os.makedirs(staging)
    if args.hostile:
        info = scratch.join("hostile.plist")
        with open(info, "w") as f:
            f.write(hc.info_plist(HOSTILE_APP, "libMisbehaving.so", HOSTILE_TASKS, modes=("processing",)))
        bundle = hc.make_bundle(args.bgtask, "Misbehaving", info, os.path.join(staging, "Hostile.app"))
        os.rename(bundle, os.path.join(plugins, "Hostile.app"))
    for index in range(args.apps):
        app = "org.hostile.crash%d" % index
        identifiers = ["%s.t%d" % (app, j) for j in range(args.identifiers)]
        info = scratch.join("crash%d.plist" % index)
        with open(info, "w") as f:
            f.write(hc.info_plist(app, "libBenchPlugin.so", identifiers, modes=("processing",)))
        bundle = hc.make_bundle(args.bgtask, "BenchPlugin", info, os.path.join(staging, "Crash%d.app" % index))
        os.rename(bundle, os.path.join(plugins, "Crash%d.app" % index))
        apps.append((app, identifiers))
    return apps


def wait_gone(sessions, exclude, grace):
    """Waits until no process of `sessions` (but `exclude`) is alive, and none below this one
    (no host runs when this is called: whatever is left under this subreaper is a dead host's),
    reaping orphans; returns what is left alive after `grace` seconds as {pid: (stat, cmdline)}."""
    deadline = time.monotonic() + grace
    while True:
        hc.reap_orphans(timeout=0)
        left = {pid: v for pid, v in hc.leftovers(sessions, exclude).items() if v[0]["state"] != "Z"}
        for pid, stat in hc.descendants([os.getpid()]).items():
            if stat["state"] != "Z" and pid not in exclude and pid not in hc.STARTED:
                left[pid] = (stat, hc.cmdline(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def settle(args, host, client, deadline):
    """Waits until nothing due is pending and no launch runs (bounded); returns the pending list."""
    pending = []
    while True:
        code, out, err = host.cli(["pending", "--json"], timeout=30)
        if code == 0:
            pending = json.loads(out)
            due = [p for p in pending if p.get("running_launch") or p.get("runningLaunch")
                   or (p.get("request") or {}).get("earliestBeginDate") is None]
            if not due:
                code, out, err = host.cli(["apps", "--json"], timeout=30)
                running = [a["identifier"] for a in json.loads(out).get("apps", []) if a.get("running")] if code == 0 else ["?"]
                if not running:
                    return pending, None
                due = running
        if time.monotonic() > deadline:
            return pending, "requests still due, or launches running, at the deadline: %s" % (due[:5] if code == 0 else "?")
        time.sleep(0.25)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bgtask", default=hc.default_bgtask(), help="the bgtask binary (default: .build/debug/bgtask); its plugin libraries are next to it")
    parser.add_argument("--restarts", type=int, default=25, help="host SIGKILLs (default 25)")
    parser.add_argument("--deadline", type=float, default=300, help="seconds for the whole run at most (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--apps", type=int, default=6, help="apps (default 6)")
    parser.add_argument("--identifiers", type=int, default=450,
                        help="unique task identifiers per app (default 450: each runs in about one launch, and an app's whole history must fit one `history` answer)")
    parser.add_argument("--min-up", type=float, default=0.1, help="least seconds between a host's start and its kill (default 0.1)")
    parser.add_argument("--max-up", type=float, default=1.5, help="most seconds between a host's start and its kill (default 1.5)")
    parser.add_argument("--later", type=float, default=0.15, help="share of requests submitted an hour ahead (default 0.15)")
    parser.add_argument("--pause", type=float, default=0.01, help="seconds the client waits between submissions (default 0.01)")
    parser.add_argument("--no-hostile", dest="hostile", action="store_false", help="leave out the app whose launches block and leave grandchildren")
    parser.add_argument("--grace", type=float, default=5, help="seconds a dead host's processes have to end (default 5)")
    parser.add_argument("--quick", action="store_true", help="a short run for CI: 8 kills, 3 apps, at most 20 s")
    parser.add_argument("--artifacts", metavar="DIR", help="where a failure's state directory and summary go (default: a new temporary directory, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    if args.quick:
        args.restarts, args.apps, args.identifiers = 8, 3, 300
        args.deadline = min(args.deadline, 20)
        args.max_up = min(args.max_up, 0.8)
    args.bgtask = os.path.abspath(args.bgtask)
    hc.check_build(args.bgtask, ["Misbehaving", "BenchPlugin"])
    hc.set_child_subreaper()
    rng = random.Random(args.seed)
    started = time.monotonic()
    # The loop's share of the deadline; the rest is for settling and the checks.
    loop_deadline = started + args.deadline * 0.7
    scratch = hc.Scratch("crash-loop")
    failures = []
    host = None
    client = None
    hostile = None
    kills = 0
    left_after_kill = 0
    try:
        plugins = scratch.join("plugins")
        os.makedirs(plugins)
        apps = install_apps(args, scratch, plugins)
        # A short budget: the hostile app's blocked launches end by the watchdog in 2 s.
        host = hc.Host(args.bgtask, plugins, scratch.join("state"), scratch.join("host.log"),
                       ["--history-per-app", "100000", "--budget", "1500ms", "--grace", "500ms", "--max-launches", "3"])
        host.start()
        client = Client(host.socket_path, apps, random.Random(args.seed + 1), args.later, args.pause)
        client.start()
        hostile = HostileSubmitter(host.socket_path) if args.hostile else None
        if hostile:
            hostile.start()
        while kills < args.restarts and time.monotonic() < loop_deadline:
            time.sleep(rng.uniform(args.min_up, args.max_up))
            dead = host.pid
            try:
                os.kill(dead, signal.SIGKILL)  # the host alone, as a crash would: its children must notice
            except ProcessLookupError:
                pass
            status = host.process.wait()
            host.process = None
            kills += 1
            if status != -signal.SIGKILL:
                failures.append("host %d exited %s before its kill" % (dead, status))
            left = wait_gone({dead}, set(), args.grace)
            if left:
                left_after_kill += len(left)
                failures.append("kill %d: %d process(es) of the dead host still alive after %.0f s: %s" % (
                    kills, len(left), args.grace, "; ".join("%d %s" % (pid, cmd[:80]) for pid, (_, cmd) in sorted(left.items()))))
                hc.kill_leftovers(left)
            host.start()
        client.stop_flag.set()
        client.join(30)
        if client.is_alive():
            failures.append("the client did not finish")
        if hostile:
            hostile.stop_flag.set()
            hostile.join(30)
        # Everything due runs; then the ledger.
        pending, problem = settle(args, host, client, max(time.monotonic() + 10, started + args.deadline - 10))
        if problem:
            failures.append(problem)
        seen_pending = {}
        for entry in pending:
            if entry["app"] == HOSTILE_APP:
                continue
            key = (entry["app"], entry["request"]["identifier"])
            seen_pending[key] = seen_pending.get(key, 0) + 1
        ran = {}
        lost_records = 0
        records = 0
        for app, _ in apps:
            code, out, err = host.cli(["history", app, "--limit", "100000", "--json"], timeout=60)
            if code != 0:
                failures.append("bgtask history %s failed (%s): %s" % (app, code, err.strip()[:300]))
                continue
            if "left out" in err:
                failures.append("history of %s was truncated (%s): the ledger cannot be checked; run fewer identifiers" % (app, err.strip()))
            for record in json.loads(out):
                records += 1
                if record.get("termination") == "host-lost":
                    lost_records += 1
                    continue
                for task in record.get("tasks", []):
                    key = (record["app"], task["identifier"])
                    ran[key] = ran.get(key, 0) + 1
        hostile_ends = {}
        if hostile:
            code, out, err = host.cli(["history", HOSTILE_APP, "--limit", "100000", "--json"], timeout=60)
            for record in json.loads(out) if code == 0 else []:
                hostile_ends[record.get("termination")] = hostile_ends.get(record.get("termination"), 0) + 1
        duplicates, lost, refused_stored, phantoms = [], [], [], []
        for key in client.acknowledged:
            total = seen_pending.get(key, 0) + ran.get(key, 0)
            if total == 0:
                lost.append(key)
            elif total > 1:
                duplicates.append((key, seen_pending.get(key, 0), ran.get(key, 0)))
        for key in client.unknown:
            if seen_pending.get(key, 0) + ran.get(key, 0) > 1:
                duplicates.append((key, seen_pending.get(key, 0), ran.get(key, 0)))
        for key in client.refused:
            if seen_pending.get(key, 0) + ran.get(key, 0) > 0:
                refused_stored.append((key, client.refused[key]))
        known = set(client.acknowledged) | client.unknown
        for key in set(seen_pending) | set(ran):
            if key not in known:
                phantoms.append(key)
        if lost:
            failures.append("%d acknowledged request(s) neither pending nor run: %s" % (len(lost), lost[:10]))
        if duplicates:
            failures.append("%d request(s) twice (key, pending, runs): %s" % (len(duplicates), duplicates[:10]))
        if refused_stored:
            failures.append("%d refused request(s) stored or run: %s" % (len(refused_stored), refused_stored[:10]))
        if phantoms:
            failures.append("%d request(s) pending or run that were never acknowledged or sent: %s" % (len(phantoms), phantoms[:10]))
        # The living host reaps its children: a zombie child that stays one is a leak.
        first = set(hc.zombies_under({host.pid}))
        time.sleep(1.0)
        stuck = first & set(hc.zombies_under({host.pid}))
        if stuck:
            failures.append("the host leaves %d zombie child(ren): %s" % (len(stuck), sorted(stuck)[:10]))
        final = host.pid
        status = host.stop()
        if status not in (0, None):
            failures.append("the last host exited %s on SIGTERM" % status)
        left = wait_gone(host.sessions, set(), args.grace)
        if left:
            failures.append("after the last host stopped, %d process(es) of the hosts' sessions are alive: %s" % (
                len(left), "; ".join("%d %s" % (pid, cmd[:80]) for pid, (_, cmd) in sorted(left.items()))))
            hc.kill_leftovers(left)
        hc.reap_orphans(timeout=1)
        zombies = hc.zombies_under({os.getpid(), final})
        if zombies:
            failures.append("zombies left under the test: %s" % zombies)
        launches = [pid for pid in hc.descendants([os.getpid()]) if hc.cmdline(pid).startswith("bgtask-launch")]
        if launches:
            failures.append("launch processes left under the test: %s" % launches)
            for pid in launches:
                hc.kill_group(pid)
        print("kills %d; submissions: %d acknowledged (%d due at once, %d an hour ahead), %d answer lost with the host, %d refused, %d retried before connecting"
              % (kills, len(client.acknowledged), sum(1 for w in client.acknowledged.values() if w == "now"),
                 sum(1 for w in client.acknowledged.values() if w == "later"), len(client.unknown), len(client.refused), client.not_sent))
        print("ledger: %d pending, %d run records (%d host-lost), %d tasks run; refusals: %s"
              % (len(pending), records, lost_records, sum(ran.values()),
                 ", ".join("%s %d" % (c, n) for c, n in sorted(count_codes(client.refused).items())) or "none"))
        if hostile:
            print("hostile app: %d submissions acknowledged, its launches ended: %s" % (
                hostile.acknowledged, ", ".join("%s %d" % kv for kv in sorted(hostile_ends.items())) or "none"))
        print("answers lost: %s" % (", ".join("%s %d" % kv for kv in sorted(client.lost_reasons.items())) or "none"))
    except Exception as error:
        failures.append("tool error: %r" % error)
    finally:
        if client is not None:
            client.stop_flag.set()
        if hostile is not None:
            hostile.stop_flag.set()
        if host is not None and host.process is not None:
            host.kill()
        if host is not None:
            hc.kill_leftovers(hc.leftovers(host.sessions))
    elapsed = time.monotonic() - started
    for failure in failures[:20]:
        print("failure: %s" % failure)
    if failures:
        directory = hc.artifacts_dir(args.artifacts, "crash-loop")
        try:
            shutil.copytree(scratch.join("state"), os.path.join(directory, "state"), symlinks=True, ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns("control.sock"))
        except (OSError, shutil.Error):
            pass
        if host is not None:
            with open(os.path.join(directory, "host.log"), "w") as f:
                f.write(host.log_tail(2000))
        with open(os.path.join(directory, "summary.json"), "w") as f:
            json.dump({"seed": args.seed, "restarts": args.restarts, "kills": kills, "failures": failures,
                       "acknowledged": sorted("%s %s" % k for k in (client.acknowledged if client else {})),
                       "unknown": sorted("%s %s" % k for k in (client.unknown if client else set()))}, f, indent=1)
        print("state, host log and summary kept in %s (rerun with --seed %d)" % (directory, args.seed))
    if args.keep:
        print("scratch kept: %s" % scratch.path)
    else:
        scratch.remove()
    verdict = "FAIL" if failures else "PASS"
    print("%s crash_loop: %d kills, %d acknowledged, %d failures, seed %d, %.1f s" % (
        verdict, kills, len(client.acknowledged) if client else 0, len(failures), args.seed, elapsed))
    return 1 if failures else 0


def count_codes(refused):
    counts = {}
    for code in refused.values():
        counts[code] = counts.get(code, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
