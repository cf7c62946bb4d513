"""The side-by-side table of scripts/bench-celery.sh: bgtask's and Celery's figures from the
alternated runs in its scratch directory (bgtask-N.json: `bgtask-bench --json --only e2e
[limits]`; celery-N.json: celery_bench.py), as medians, with their ratios (bgtask / Celery and
bgtask / the fork floor of the same runs), the machine and the method.

  python3 bench_celery_table.py SCRATCH CELERY_VERSION REDIS_VERSION LOAD_START LOAD_END STARTED ENDED COMMIT

Prints the tables; writes SCRATCH/side-by-side.json (every run's figures).
"""

import glob
import json
import os
import statistics
import sys

scratch, version, redis_version, load_start, load_end, started, ended, commit = sys.argv[1:9]


def run_number(path):
    return int(path.rsplit("-", 1)[1].split(".")[0])


bs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(scratch, "bgtask-*.json")), key=run_number)]
cs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(scratch, "celery-*.json")), key=run_number)]
first_b, first_c = bs[0], cs[0]


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bkey(key):
    return med([b.get(key) for b in bs])


def cget(c, path):
    for part in path.split("."):
        c = c.get(part) if isinstance(c, dict) else None
    return c


def ckey(path):
    return med([cget(c, path) for c in cs])


def ms(us):
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def rate(v):
    return "n/a" if v is None else f"{v:,.0f}/s"


def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def yes(met):
    return "n/a" if met is None else ("yes" if met else "no")


def at_most(a, b, factor):
    return None if a is None or b is None else a <= factor * b


def at_least(a, b, factor):
    return None if a is None or b is None else a >= factor * b


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(r):
        return "  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)).rstrip()

    return "\n".join([line(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [line(r) for r in rows])


def runs_of(values, unit):
    return " / ".join("n/a" if v is None else (f"{v / 1000:.2f}" if unit == "us" else f"{v:,.0f}") for v in values)


floor = bkey("e2e_fork_floor_p50_us")
gap = first_b.get("e2e_idle_gap_ms", 10)
methods = (("back to back", "b2b", "_b2b"), (f"{gap:g} ms idle gaps", "gap", ""))

rows = []
header = ("figure", "bgtask fresh", "bgtask resumed", f"Celery {version}", "fresh ÷ Celery", "resumed ÷ Celery",
          "fresh ÷ floor", "resumed ÷ floor", "target", "met? (fresh; resumed)")
for name, bsuf, csuf in methods:
    for p in ("p50", "p99"):
        f = bkey(f"e2e_fresh_{bsuf}_submit_handler_{p}_us")
        r = bkey(f"e2e_resumed_{bsuf}_submit_handler_{p}_us")
        c = ckey(f"submit_body{csuf}_us.{p}")
        if p == "p50":
            target = "fresh ≤ 2× floor, ≤ Celery; resumed ≤ 0.5× floor, ≤ 0.3× Celery"
            met = (f"floor {yes(at_most(f, floor, 2))}, Celery {yes(at_most(f, c, 1))}; "
                   f"floor {yes(at_most(r, floor, 0.5))}, Celery {yes(at_most(r, c, 0.3))}")
        else:
            target, met = "context", ""
        rows.append((f"submit → handler / task body {p}, {name}", ms(f), ms(r), ms(c), ratio(f, c), ratio(r, c),
                     ratio(f, floor), ratio(r, floor), target, met))
    f = bkey(f"e2e_fresh_{bsuf}_submit_ack_p50_us")
    r = bkey(f"e2e_resumed_{bsuf}_submit_ack_p50_us")
    c = ckey(f"submit_ack{csuf}_us.p50")
    rows.append((f"submit → acknowledged p50, {name}", ms(f), ms(r), ms(c), ratio(f, c), ratio(r, c), "", "", "context", ""))
f, r, c = bkey("e2e_fresh_throughput_per_s"), bkey("e2e_resumed_throughput_per_s"), ckey("noop_per_s")
rows.append(("no-op tasks/s, 2 at a time", rate(f), rate(r), rate(c), ratio(f, c), ratio(r, c), "", "",
             "fresh ≥ 1×, resumed ≥ 2× Celery", f"{yes(at_least(f, c, 1))}; {yes(at_least(r, c, 2))}"))
rows.append(("fork floor p50 (bgtask-bench, same runs)", ms(floor), "", "", "", "", "", "", "floor", ""))

m = first_b.get("machine", {})
apps = first_b.get("e2e_apps")
print(f"bgtask {commit} (bgtask-bench, {first_b.get('mode')} run, release) vs Celery {version} "
      f"(prefork, 2 processes, Redis {redis_version} on 127.0.0.1)")
print(f"machine: {m.get('nproc')} cores, {m.get('cpu')}, {m.get('memory')}, Linux {m.get('kernel')}, {m.get('swift')}; "
      f"{started} – {ended}; load average {load_start} at the start, {load_end} at the end")
print(f"method: medians of {len(bs)} bgtask and {len(cs)} Celery runs, alternated (bgtask, Celery, Celery, bgtask, ...).\n"
      f"  bgtask: a real `bgtask host` (root, confined, --policy immediate, real clock) with {apps} apps rotating, one submission\n"
      f"  at a time (a connection each) until the handler's first act; two hosts, alternated in blocks: `--app-lifecycle fresh`\n"
      f"  (a new process per launch) and `--app-lifecycle ios` (every app's suspended process resumed, after one unmeasured\n"
      f"  launch of each app). Celery: apply_async until the task body's first act, one task at a time. Both: back to back, and\n"
      f"  with {gap:g} ms of idle after each. no-op rate: bgtask, {apps} apps due at once (--max-launches 2) until the last\n"
      f"  handler; Celery, {first_c.get('noop_tasks')} no-ops sent at once until the last ran.")
print()
print(table(header, rows))

# The limits: measured in the first run of each side.
lrows = []


def lrow(what, bv, cv, unit, target, met):
    def fmt(v):
        return "n/a" if v is None else (f"{v:.2f} ms" if unit == "ms" else f"{v:.0f} MiB")

    if bv is None or cv is None:
        rr = "n/a"
    elif unit == "MiB":
        rr = f"bgtask {bv / 64:.2f}×, Celery {cv / 64:.2f}× the cap"
    else:
        rr = ratio(bv, cv)
    lrows.append((what, fmt(bv), fmt(cv), rr, target, met))


e, s = first_b.get("expiry_late_p99_ms"), cget(first_c, "soft_limit_late_ms.p99")
lrow("expiry vs soft time limit, late p99", e, s, "ms", "bgtask ≤ Celery", yes(at_most(e, s, 1)))
w, h = first_b.get("watchdog_late_p99_ms"), cget(first_c, "hard_kill_late_ms.p99")
lrow("watchdog vs hard time limit, kill late p99", w, h, "ms", "bgtask ≤ 1/20 of Celery", yes(at_most(w, h, 1 / 20)))
jetsam = first_b.get("jetsam_peak_over_limit_pct_sampler")
killed = first_c.get("memory_killed_mid_task")
lrow("64 MiB cap: peak reached by a task allocating 320 MiB", 64 * (1 + jetsam / 100) if jetsam is not None else None,
     first_c.get("memory_peak_mib"), "MiB", "killed mid-task",
     "bgtask yes (jetsam); Celery " + ("n/a" if killed is None else ("yes" if killed else "no (checked after the task)")))
print()
print("limits (the first run of each side; bgtask's launches through LaunchSupervisor, the lifecycle aside)")
print(table(("figure", "bgtask", f"Celery {version}", "bgtask ÷ Celery", "target", "met?"), lrows))

print()
print("each run's figure, in run order (a check on the medians; ms unless a rate):")
for name, bsuf, csuf in methods:
    print(f"  p50 {name}: bgtask fresh {runs_of([b.get(f'e2e_fresh_{bsuf}_submit_handler_p50_us') for b in bs], 'us')}; "
          f"resumed {runs_of([b.get(f'e2e_resumed_{bsuf}_submit_handler_p50_us') for b in bs], 'us')}; "
          f"Celery {runs_of([cget(c, f'submit_body{csuf}_us.p50') for c in cs], 'us')}")
print(f"  no-op/s: bgtask fresh {runs_of([b.get('e2e_fresh_throughput_per_s') for b in bs], '/s')}; "
      f"resumed {runs_of([b.get('e2e_resumed_throughput_per_s') for b in bs], '/s')}; "
      f"Celery {runs_of([c.get('noop_per_s') for c in cs], '/s')}")
print(f"  fork floor p50: {runs_of([b.get('e2e_fork_floor_p50_us') for b in bs], 'us')}")
resumed = [(b.get("e2e_resumed_gap_records_resumed", 0) + b.get("e2e_resumed_b2b_records_resumed", 0),
            b.get("e2e_resumed_gap_records_matched", 0) + b.get("e2e_resumed_b2b_records_matched", 0)) for b in bs]
print("  the ios host's measured launches that its records call resumed: " + " / ".join(f"{a} of {t}" for a, t in resumed))
json.dump({"bgtask": bs, "celery": cs, "celery_version": version, "redis_version": redis_version,
           "load_at_start": load_start, "load_at_end": load_end, "started": started, "ended": ended, "commit": commit},
          open(os.path.join(scratch, "side-by-side.json"), "w"))
