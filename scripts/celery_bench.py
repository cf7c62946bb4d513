"""Celery's side of scripts/bench-celery.sh: the tasks (this module is the worker's app) and the
client that measures them the way bgtask-bench measures bgtask end to end.

  submit -> body     client: t0 = CLOCK_MONOTONIC, apply_async; the task stamps CLOCK_MONOTONIC
                     as its body starts and returns it (the same clock in every process); one
                     task at a time, with 10 ms of idle gap after each (as bgtask-bench's idle
                     gaps) and back to back (the next sent as the result of the last came),
                     the two methods alternated in blocks
  no-op tasks/s      N no-op tasks sent at once, until the last one ran (each INCRs a counter)
  soft limit         soft_time_limit=1 s, body busy until SoftTimeLimitExceeded: late = raised - (start + 1 s)
  hard kill          time_limit=1 s, body asleep: late = the process gone (pidfd) - (start + 1 s)
  memory cap         worker_max_memory_per_child 64 MiB (Celery's only memory cap), the body
                     allocating 1 MiB blocks up to 320 MiB: the peak it reached

Run by bench-celery.sh (which starts Redis and the worker); prints one JSON object. With
--latency-only it measures submit -> body and the no-op rate only (the later of alternated runs).
"""

import json
import os
import select
import sys
import time

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

BROKER = os.environ.get("CELERY_BENCH_BROKER", "redis://127.0.0.1:6399/0")
app = Celery("celery_bench", broker=BROKER, backend=BROKER)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_max_memory_per_child=64 * 1024,  # KiB: 64 MiB, checked after each task
    broker_connection_retry_on_startup=True,
)


def _now():
    return time.monotonic_ns()


def _redis():
    import redis

    return redis.Redis.from_url(BROKER)


@app.task
def stamp():
    return _now()


@app.task(ignore_result=True)
def noop(key):
    _redis().incr(key)


@app.task(soft_time_limit=1)
def soft_limited():
    start = _now()
    try:
        while True:
            time.sleep(0.0005)
    except SoftTimeLimitExceeded:
        return (_now() - start) / 1e6 - 1000.0


@app.task(time_limit=1)
def hard_limited(key):
    r = _redis()
    r.set(key, json.dumps({"pid": os.getpid(), "start": _now()}))
    while True:
        time.sleep(10)


@app.task
def hog(mib):
    import resource

    blocks = []
    for _ in range(mib):
        block = bytearray(1 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        blocks.append(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
    return ordered[rank - 1]


def summary(values):
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values) if values else None, "n": len(values)}


IDLE_GAP_S = 0.01  # as bgtask-bench's idle gaps (OneAtATime.idleGapUs)


def measure(quick, latency_only=False):
    n_latency = 100 if quick else 500
    n_noop = 200 if quick else 2000
    n_soft = 5 if quick else 20
    n_hard = 5 if quick else 20
    result = {}

    for _ in range(20):  # warm the workers and connections
        stamp.delay().get(timeout=10)

    # One task at a time, with IDLE_GAP_S after each (what a sporadic submission finds) and
    # back to back, alternated in blocks so that drift on the machine moves both alike.
    methods = {"gap": IDLE_GAP_S, "b2b": 0.0}
    acks = {m: [] for m in methods}
    bodies = {m: [] for m in methods}
    blocks = 2 if quick else 5
    for block in range(blocks):
        count = n_latency // blocks + (1 if block < n_latency % blocks else 0)
        for method, gap in methods.items():
            for _ in range(count):
                t0 = _now()
                async_result = stamp.apply_async()
                acks[method].append((_now() - t0) / 1000)
                entered = async_result.get(timeout=10)
                bodies[method].append((entered - t0) / 1000)
                if gap:
                    time.sleep(gap)
    result["idle_gap_ms"] = IDLE_GAP_S * 1000
    result["submit_ack_us"] = summary(acks["gap"])
    result["submit_body_us"] = summary(bodies["gap"])
    result["submit_ack_b2b_us"] = summary(acks["b2b"])
    result["submit_body_b2b_us"] = summary(bodies["b2b"])

    r = _redis()
    key = "celery-bench-noop"
    rates = []
    for _ in range(1 if quick else 3):
        r.delete(key)
        t0 = _now()
        for _ in range(n_noop):
            noop.apply_async((key,))
        while int(r.get(key) or 0) < n_noop:
            time.sleep(0.0005)
        rates.append(n_noop / ((_now() - t0) / 1e9))
        time.sleep(0.2)
    result["noop_per_s"] = sorted(rates)[len(rates) // 2]
    result["noop_tasks"] = n_noop
    if latency_only:
        return result

    soft = [soft_limited.delay().get(timeout=30) for _ in range(n_soft)]
    result["soft_limit_late_ms"] = summary(soft)

    hard = []
    for i in range(n_hard):
        key = "celery-bench-hard-%d" % i
        r.delete(key)
        async_result = hard_limited.apply_async((key,))
        while r.get(key) is None:
            time.sleep(0.001)
        info = json.loads(r.get(key))
        try:
            fd = os.pidfd_open(info["pid"])
        except ProcessLookupError:
            continue
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(30000)
        gone = _now()
        os.close(fd)
        hard.append((gone - info["start"]) / 1e6 - 1000.0)
        try:
            async_result.get(timeout=30)
        except Exception:
            pass
    result["hard_kill_late_ms"] = summary(hard)

    peak = hog.delay(320).get(timeout=120)
    result["memory_cap_mib"] = 64
    result["memory_peak_mib"] = peak
    result["memory_killed_mid_task"] = peak < 64 * 1.1
    return result


if __name__ == "__main__":
    print(json.dumps(measure("--quick" in sys.argv, latency_only="--latency-only" in sys.argv)))
