#!/usr/bin/env bash
# bgtask and Celery side by side, in one run (issue 18): bgtask-bench's end-to-end and limits
# figures (a real `bgtask host`, a fresh confined process per launch) and Celery's (prefork
# workers, Redis on loopback: a pool of warm workers) measured the same way, printed together
# with their ratios.
#
#   scripts/bench-celery.sh [--quick] [--keep] [--bgtask-json FILE]
#
# --bgtask-json FILE: take bgtask's figures from an earlier `bgtask-bench --json` run (with the
# e2e and limits sections) instead of running it.
#
# Installs what it needs: redis-server from Debian (apt-get), celery and redis from PyPI (pip,
# into a virtual environment in the scratch directory). Starts Redis and one Celery worker
# (prefork, 2 processes: as bgtask's default --max-launches 2) on 127.0.0.1, and stops them by
# pid. Run as root (bgtask-bench confines launches as `bgtask host` does as root). Builds the
# release products first if they are missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
quick=""
keep=""
bgtask_json=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick="--quick" ;;
        --keep) keep=1 ;;
        --bgtask-json) bgtask_json=$(realpath "$2"); shift ;;
        *) echo "usage: $0 [--quick] [--keep] [--bgtask-json FILE]" >&2; exit 2 ;;
    esac
    shift
done

scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench-celery-XXXXXX")
redis_pid=""
worker_pid=""
cleanup() {
    if [ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null; then
        kill -TERM -- "-$worker_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$worker_pid" 2>/dev/null || true
        wait "$worker_pid" 2>/dev/null || true
    fi
    if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
        kill -TERM "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
    fi
    if [ -z "$keep" ]; then rm -rf "$scratch"; else echo "scratch kept: $scratch" >&2; fi
}
trap cleanup EXIT

# --- what it needs -------------------------------------------------------------------------
if ! command -v redis-server >/dev/null; then
    echo "bench-celery: installing redis-server (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
echo "bench-celery: a virtual environment with celery and redis (pip)" >&2
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --disable-pip-version-check celery redis packaging
bench="$root/.build/release/bgtask-bench"
if [ ! -x "$bench" ] || [ ! -x "$root/.build/release/bgtask" ]; then
    echo "bench-celery: swift build -c release" >&2
    (cd "$root" && swift build -c release >&2)
fi

# --- bgtask --------------------------------------------------------------------------------
if [ -n "$bgtask_json" ]; then
    cp "$bgtask_json" "$scratch/bgtask.json"
else
    echo "bench-celery: bgtask-bench $quick --only e2e limits" >&2
    "$bench" --no-build $quick --json --only e2e limits > "$scratch/bgtask.json"
fi

# --- Celery --------------------------------------------------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CELERY_BENCH_BROKER="redis://127.0.0.1:$port/0"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --logfile "$scratch/redis.log" --dir "$scratch" &
redis_pid=$!
for _ in $(seq 100); do
    "$scratch/venv/bin/python" -c "import redis,sys; redis.Redis(port=$port).ping()" 2>/dev/null && break
    sleep 0.1
done
echo "bench-celery: Redis $(redis-server --version | cut -d' ' -f3) on 127.0.0.1:$port (pid $redis_pid); Celery worker, prefork, 2 processes" >&2
(cd "$here" && exec setsid "$scratch/venv/bin/python" -m celery -A celery_bench worker --pool prefork --concurrency 2 \
    --loglevel WARNING --without-gossip --without-mingle --without-heartbeat > "$scratch/worker.log" 2>&1) &
worker_pid=$!
(cd "$here" && "$scratch/venv/bin/python" celery_bench.py $quick) > "$scratch/celery.json"

# --- side by side --------------------------------------------------------------------------
python3 - "$scratch/bgtask.json" "$scratch/celery.json" "$("$scratch/venv/bin/python" -c 'import celery; print(celery.__version__)')" <<'EOF'
import json, sys
b = json.load(open(sys.argv[1]))
c = json.load(open(sys.argv[2]))
version = sys.argv[3]

def fmt(value, unit):
    if value is None:
        return "n/a"
    if unit == "us":
        return f"{value / 1000:.2f} ms"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return str(value)

rows = []
def row(what, bgtask, celery, unit, better, target, met):
    if bgtask is None or celery is None:
        ratio = "n/a"
    elif unit == "MiB":
        ratio = f"bgtask {bgtask / 64:.2f}×, Celery {celery / 64:.2f}× the cap"
    elif better == "lower":
        ratio = f"bgtask {celery / bgtask:.2f}× faster" if bgtask > 0 else "n/a"
    else:
        ratio = f"bgtask {bgtask / celery:.2f}× the rate"
    rows.append((what, fmt(bgtask, unit), fmt(celery, unit), ratio, target, met))

s = c["submit_body_us"]
row("submit → handler/body p50", b.get("e2e_submit_handler_p50_us"), s["p50"], "us", "lower", "bgtask ≥ 3× faster",
    "yes" if b.get("e2e_submit_handler_p50_us") and s["p50"] / b["e2e_submit_handler_p50_us"] >= 3 else "no")
row("submit → handler/body p99", b.get("e2e_submit_handler_p99_us"), s["p99"], "us", "lower", "context", "")
row("submit → acknowledged p50", b.get("e2e_submit_ack_p50_us"), c["submit_ack_us"]["p50"], "us", "lower", "context", "")
row("no-op tasks/s (2 at a time)", b.get("e2e_throughput_per_s"), c["noop_per_s"], "/s", "higher", "bgtask ≥ 2×",
    "yes" if b.get("e2e_throughput_per_s") and b["e2e_throughput_per_s"] >= 2 * c["noop_per_s"] else "no")
row("expiry vs soft time limit, late p99", b.get("expiry_late_p99_ms"), c["soft_limit_late_ms"]["p99"], "ms", "lower", "bgtask ≤ Celery",
    "yes" if b.get("expiry_late_p99_ms") is not None and b["expiry_late_p99_ms"] <= c["soft_limit_late_ms"]["p99"] else "no")
row("watchdog vs hard time limit, kill late p99", b.get("watchdog_late_p99_ms"), c["hard_kill_late_ms"]["p99"], "ms", "lower", "bgtask ≤ 1/20 of Celery",
    "yes" if b.get("watchdog_late_p99_ms") is not None and c["hard_kill_late_ms"]["p99"] and b["watchdog_late_p99_ms"] <= c["hard_kill_late_ms"]["p99"] / 20 else "no")
jetsam = b.get("jetsam_peak_over_limit_pct_sampler")
bgtask_peak = 64 * (1 + jetsam / 100) if jetsam is not None else None
row("64 MiB cap: peak reached by a task allocating 320 MiB", bgtask_peak, c["memory_peak_mib"], "MiB", "lower", "killed mid-task",
    "bgtask yes (jetsam); Celery " + ("yes" if c["memory_killed_mid_task"] else "no (checked after the task)"))

widths = [max(len(r[i]) for r in rows + [("figure", "bgtask", f"Celery {version}", "ratio", "target", "met?")]) for i in range(6)]
def line(r):
    return "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
print(f"bgtask ({b.get('mode')}, fork floor p50 {b.get('e2e_fork_floor_p50_us', 0) / 1000:.2f} ms, load at start {b['machine']['loadavg_at_start']}) "
      f"vs Celery {version} (prefork, 2 processes, Redis on loopback), one run")
print(line(("figure", "bgtask", f"Celery {version}", "ratio", "target", "met?")))
print("-" * (sum(widths) + 10))
for r in rows:
    print(line(r))
print(json.dumps({"bgtask": b, "celery": c, "celery_version": version}), file=open(sys.argv[1].replace("bgtask.json", "side-by-side.json"), "w"))
EOF
if [ -n "$keep" ]; then echo "JSON: $scratch/side-by-side.json" >&2; fi
