#!/usr/bin/env bash
# bgtask and Celery side by side, in the same minutes (issues 18 and 29): bgtask-bench's
# end-to-end figures (a real `bgtask host`, both app lifecycles: `--app-lifecycle fresh`, a new
# confined process per launch, and `--app-lifecycle ios`, the app's suspended process resumed)
# and Celery's (prefork workers, Redis on loopback: a pool of warm workers), each measured
# both ways (back to back, and with 10 ms idle gaps), in alternated runs (bgtask, Celery,
# Celery, bgtask, ...), printed together as medians with their ratios. The limits figures
# (expiry, watchdog, memory cap) are measured once, in the first run of each.
#
#   scripts/bench-celery.sh [--quick] [--keep] [--runs N] [--bgtask-json FILE]
#
# --runs N: alternated runs of each side (default 3; 2 with --quick).
# --bgtask-json FILE: take bgtask's figures from an earlier `bgtask-bench --json` run (with the
# e2e and limits sections) instead of running it (Celery is still run N times).
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
runs=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick="--quick" ;;
        --keep) keep=1 ;;
        --runs) runs="$2"; shift ;;
        --bgtask-json) bgtask_json=$(realpath "$2"); shift ;;
        *) echo "usage: $0 [--quick] [--keep] [--runs N] [--bgtask-json FILE]" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$runs" ]; then if [ -n "$quick" ]; then runs=2; else runs=3; fi; fi
case "$runs" in ''|*[!0-9]*|0) echo "bench-celery: --runs needs a positive number, not '$runs'" >&2; exit 2 ;; esac
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
started_at=$(date -u '+%Y-%m-%d %H:%M:%S UTC')

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

# --- Redis and the Celery worker (kept for every run) ----------------------------------------
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

# --- alternated runs -------------------------------------------------------------------------
# Run i of each side; the first of each also measures the limits. The order turns every run
# (bgtask, Celery, Celery, bgtask, ...) so that a machine drifting one way moves both alike.
run_bgtask() {
    local i=$1 sections="e2e"
    [ "$i" = 1 ] && sections="e2e limits"
    if [ -n "$bgtask_json" ]; then
        if [ "$i" = 1 ]; then cp "$bgtask_json" "$scratch/bgtask-1.json"; fi
        return 0
    fi
    echo "bench-celery: run $i/$runs, bgtask-bench $quick --only $sections (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    # shellcheck disable=SC2086
    "$bench" --no-build $quick --json --only $sections > "$scratch/bgtask-$i.json"
}
run_celery() {
    local i=$1 only=""
    [ "$i" = 1 ] || only="--latency-only"
    echo "bench-celery: run $i/$runs, Celery $only (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    # shellcheck disable=SC2086
    (cd "$here" && "$scratch/venv/bin/python" celery_bench.py $quick $only) > "$scratch/celery-$i.json"
}
for i in $(seq "$runs"); do
    if [ $((i % 2)) = 1 ]; then run_bgtask "$i"; run_celery "$i"; else run_celery "$i"; run_bgtask "$i"; fi
done

# --- side by side --------------------------------------------------------------------------
python3 "$here/bench_celery_table.py" "$scratch" "$("$scratch/venv/bin/python" -c 'import celery; print(celery.__version__)')" \
    "$(redis-server --version | cut -d' ' -f3 | sed 's/^v=//')" "$load_at_start" "$(cut -d' ' -f1-3 /proc/loadavg)" "$started_at" \
    "$(date -u '+%H:%M:%S UTC')" "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ -n "$keep" ]; then echo "JSON: $scratch/side-by-side.json" >&2; fi
