#!/usr/bin/env python3
"""Fuzzes a real `bgtask host`'s control socket (STATE/control.sock).

Starts a host (its own session and process group, a temporary state directory, the example
bundles Feed.app and Counter.app built with `bgtask bundle`, plus Sentinel.app), submits one
request for the sentinel app that nothing in the fuzzing can name or release, then for N
iterations connects and sends mutated frames made from valid requests of every verb: bit and
byte flips, truncation, wrong and huge declared lengths, bad headers, values of the wrong type,
unknown verbs, unknown and repeated keys, deep nesting, NULs, invalid UTF-8, extreme numbers,
big strings, garbage, pipelines of up to 300 frames, slowloris senders and idle connections
(each must be cut off by the host's deadlines), and floods of parallel connections up to a cap
(the host must refuse those over its --max-connections by name).

After every input: the host is alive. After every batch: the host is alive, answers `status`
within a deadline, and the sentinel request is still pending (`bgtask pending --json`). Every
answer frame must be well formed (magic, version, length within 1 MiB, a JSON object with `ok`).
A failure saves the batch's inputs (the last one last) to a replay file:
`control_fuzz.py --replay FILE` sends them to a fresh host in the same order and checks again.

Exit status 0 and a last line `PASS ...`, or 1 and `FAIL ...`.
"""

import argparse
import json
import os
import random
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_common as hc  # noqa: E402

FEED = "com.example.feed"
COUNTER = "com.example.counter"
SENTINEL_APP = "org.hostile.sentinel"
SENTINEL_TASK = "org.hostile.sentinel.keep"
# No input may name the sentinel: a valid cancel or simulate-launch of it would be right to
# remove it. Inputs are made by mutating templates that never name it, and any input that
# contains this anyway is made again.
SENTINEL_MARK = b"sentinel"

LAUNCH_VERBS = {"simulate-launch", "open", "extension-run"}


def templates(now):
    """Valid requests of every verb (never naming the sentinel)."""
    later = now + 3600
    return [
        {"verb": "status"},
        {"verb": "apps"},
        {"verb": "apps", "limit": 1},
        {"verb": "apps", "limit": 1, "after": COUNTER},
        {"verb": "pending"},
        {"verb": "pending", "app": FEED},
        {"verb": "submit", "app": FEED, "request": hc.task("refresh", "com.example.feed.refresh", earliest=later)},
        {"verb": "submit", "app": FEED, "request": hc.task("processing", "com.example.feed.cleanup"), "delay": 900},
        {"verb": "submit", "app": COUNTER, "request": hc.task("refresh", "com.example.counter.tick"), "delay": 60},
        {"verb": "submit", "app": FEED, "request": hc.task("processing", "com.example.feed.cleanup", network=True, power=True, earliest=later)},
        {"verb": "submit", "app": FEED, "request": hc.task("continued-processing", "com.example.feed.export.fuzz", title="Fuzz", subtitle="sub")},
        {"verb": "submit", "app": FEED, "request": hc.task("health-research", "com.example.feed.cleanup"), "delay": 60},
        {"verb": "cancel", "app": FEED, "identifier": "com.example.feed.refresh"},
        {"verb": "cancel-all", "app": COUNTER},
        {"verb": "history", "limit": 5},
        {"verb": "history", "app": FEED, "limit": 2},
        {"verb": "why", "identifier": "com.example.feed.refresh"},
        {"verb": "why", "identifier": "com.example.counter.tick", "app": COUNTER},
        {"verb": "device"},
        {"verb": "device", "device": {"idle": "on"}},
        {"verb": "device", "device": {"power": "auto", "network": "off"}},
        {"verb": "device", "device": {"app": FEED, "refresh": "on"}},
        {"verb": "device", "device": {"low-power": "off", "refresh": "on", "locked": "off", "gpu": "auto"}},
        {"verb": "clock"},
        {"verb": "clock", "advance": 60},
        {"verb": "progress"},
        {"verb": "cancel-task", "identifier": "com.example.feed.export.fuzz"},
        {"verb": "simulate-expire", "identifier": "com.example.feed.refresh"},
        # Launches (rationed: see LAUNCH_VERBS).
        {"verb": "simulate-launch", "identifier": "com.example.feed.refresh", "force": True, "wait": False},
        {"verb": "simulate-launch", "identifier": "com.example.counter.tick", "app": COUNTER, "force": True, "wait": True,
         "request": hc.task("refresh", "com.example.counter.tick")},
        {"verb": "open", "app": COUNTER, "event": "{}", "wait": False},
        {"verb": "extension-run", "identifier": "com.example.feed.share", "event": "{\"url\":\"https://example.com\"}", "wait": True},
    ]


# MARK: Mutations

WRONG_VALUES = [None, True, False, 0, -1, 1.5, 1e308, -1e308, 2 ** 63, -2 ** 63 - 1, 2 ** 64, 3.1e9, -3.1e9,
                "", "x", "a" * 300, "\u0000", "\ud800", "\u202e", [], [1, "2"], {}, {"a": "b"},
                {"verb": "status"}, [[[[]]]], {"kind": "refresh"}]
RAW_NUMBERS = [b"1e999", b"-1e999", b"-0", b"0.0000001", b"9223372036854775808", b"-9223372036854775809",
               b"18446744073709551616", b"1.5", b"NaN", b"Infinity", b"-Infinity", b"00", b"+1", b".5", b"1e",
               b"1" * 400, b"0x10", b"4294967296", b"2147483648", b"-2147483649", b"1E+308", b"5e-324"]
ODD_VERBS = ["", "STATUS", "status ", " status", "stat\u0000us", "submit\u200b", "sta\u0301tus", "status\n",
             "apps" * 1000, "x" * 70000, "\U0001F600", "cancel_all", "simulate_launch", "../status", "null"]
INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
                b"\x80", b"\xf8\x88\x80\x80\x80", b"\xef\xbf\xbf"]
ESCAPES = [b"\\u0000", b"\\ud800", b"\\udfff\\ud800", b"\\u", b"\\x41", b"\\", b"\\uD83D\\uDE00", b"\\/"]
INTERESTING_BYTES = [0x00, 0xFF, 0x22, 0x5C, 0x7B, 0x7D, 0x5B, 0x5D, 0x3A, 0x2C, 0x80, 0xC0, 0x0A, 0x20, 0x7F]


def paths(value, prefix=()):
    """Every key path of a JSON object, nested objects included."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield prefix + (key,)
            yield from paths(inner, prefix + (key,))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def string_spans(payload):
    """(start, end) of the insides of the JSON strings of a payload without escapes."""
    spans, inside, start = [], False, 0
    for i, byte in enumerate(payload):
        if byte == 0x22:
            if inside:
                spans.append((start, i))
            else:
                start = i + 1
            inside = not inside
    return spans


def insert_in_string(rng, payload, piece):
    spans = [s for s in string_spans(payload) if s[1] > s[0]] or [(1, 1)]
    start, end = rng.choice(spans)
    at = rng.randint(start, end)
    return payload[:at] + piece + payload[at:]


def nested(depth, kind):
    if kind == "array":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'[{"a":' * (depth // 2) + b"1" + b"}]" * (depth // 2)


def normal(name, payload, **extra):
    case = {"name": name, "mode": "normal", "chunks": [(hc.frame(payload), 0)]}
    case.update(extra)
    return case


def mutate(rng, template):
    """One input: a dict with name, mode and chunks [(bytes, delay after)]."""
    payload = hc.encode(template)
    kind = rng.choices(
        ["valid", "bitflip", "byteset", "truncate", "header", "length", "wrongtype", "rawnumber", "verb", "keys",
         "deep", "nul", "utf8", "escape", "bigstring", "garbage", "notobject", "pipeline", "split"],
        weights=[4, 10, 6, 6, 5, 6, 10, 5, 5, 5, 4, 4, 5, 3, 2, 3, 3, 4, 3])[0]
    if kind == "valid":
        return normal("valid", payload)
    if kind == "bitflip":
        data = bytearray(payload)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return normal("bitflip", bytes(data))
    if kind == "byteset":
        data = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.choice(INTERESTING_BYTES)
        return normal("byteset", bytes(data))
    if kind == "truncate":
        cut = rng.randrange(len(payload))
        if rng.random() < 0.5:
            # The header promises the whole payload; the peer ends the stream early.
            return {"name": "truncate-stream", "mode": "normal", "chunks": [(hc.frame(payload)[:hc.HEADER + cut], 0)]}
        return normal("truncate-json", payload[:cut])
    if kind == "header":
        data = bytearray(hc.frame(payload))
        choice = rng.randrange(4)
        if choice == 0:
            data[rng.randrange(hc.HEADER)] ^= 1 << rng.randrange(8)
        elif choice == 1:
            data[2] = rng.choice([0, 2, 255])
        elif choice == 2:
            data[3] = rng.choice([1, 0x80, 255])
        else:
            data[0:2] = rng.choice([b"GB", b"\0\0", b"bg", b"{\""])
        return {"name": "header", "mode": "normal", "chunks": [(bytes(data), 0)]}
    if kind == "length":
        declared = rng.choice([0, 1, len(payload) - 1, len(payload) + 1, len(payload) * 2, hc.MAX_PAYLOAD,
                               hc.MAX_PAYLOAD + 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, rng.randrange(1 << 32)])
        return {"name": "length-%d" % declared, "mode": "normal", "chunks": [(hc.frame(payload, length=declared), 0)]}
    if kind == "wrongtype":
        path = rng.choice(list(paths(template)))
        return normal("wrongtype-" + ".".join(path), hc.encode(replaced(template, path, rng.choice(WRONG_VALUES))))
    if kind == "rawnumber":
        path = rng.choice(list(paths(template)))
        marker = "\u2063MARK\u2063"
        text = hc.encode(replaced(template, path, marker)).replace(json.dumps(marker).encode(), rng.choice(RAW_NUMBERS))
        return normal("rawnumber-" + ".".join(path), text)
    if kind == "verb":
        return normal("verb", hc.encode(dict(template, verb=rng.choice(ODD_VERBS + ["v%d" % rng.randrange(1000)]))))
    if kind == "keys":
        choice = rng.randrange(4)
        if choice == 0:  # a repeated key
            return normal("dup-verb", b'{"verb":"status",' + payload[1:])
        if choice == 1:
            return normal("dup-key", payload[:-1] + b',"app":"com.example.feed","app":"x"}')
        if choice == 2:
            extra = {"k%d" % i: i for i in range(rng.choice([1, 100, 5000]))}
            return normal("unknown-keys", hc.encode(dict(extra, **template)))
        return normal("missing-verb", hc.encode({k: v for k, v in template.items() if k != "verb"}))
    if kind == "deep":
        depth = rng.choice([10, 100, 256, 257, 512, 513, 1000, 10000, 100000, 300000])
        shape = rng.choice(["array", "object", "mixed"])
        path = rng.choice(list(paths(template)))
        marker = "\u2063MARK\u2063"
        text = hc.encode(replaced(template, path, marker)).replace(json.dumps(marker).encode(), nested(depth, shape))
        if len(text) > hc.MAX_PAYLOAD:
            text = nested(depth // 4, shape)
        return normal("deep-%s-%d" % (shape, depth), text)
    if kind == "nul":
        if rng.random() < 0.5:
            return normal("nul-raw", insert_in_string(rng, payload, b"\0" * rng.randint(1, 3)))
        at = rng.randrange(len(payload) + 1)
        return normal("nul-anywhere", payload[:at] + b"\0" + payload[at:])
    if kind == "utf8":
        return normal("utf8", insert_in_string(rng, payload, rng.choice(INVALID_UTF8)))
    if kind == "escape":
        return normal("escape", insert_in_string(rng, payload, rng.choice(ESCAPES)))
    if kind == "bigstring":
        size = rng.choice([1024, 65536, 300000, hc.MAX_PAYLOAD - len(payload) - 64])
        path = rng.choice(list(paths(template)))
        return normal("bigstring-%d" % size, hc.encode(replaced(template, path, "b" * size)))
    if kind == "garbage":
        data = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 8, 9, 100, 4096])))
        if rng.random() < 0.5:
            return normal("garbage-payload", data)
        return {"name": "garbage-stream", "mode": "normal", "chunks": [(data, 0)]}
    if kind == "notobject":
        return normal("notobject", rng.choice([b"", b"{}", b"[]", b"null", b'"status"', b"123", b"true", b" ",
                                               b'{"verb":null}', b'{"verb":1}', b"[" + payload + b"]"]))
    if kind == "pipeline":
        count = rng.choice([2, 5, 50, 255, 256, 257, 300])
        frames = []
        for i in range(count):
            base = rng.choice(SAFE)
            if rng.random() < 0.2:
                frames.append(hc.frame(bytes(b ^ (1 << rng.randrange(8)) if rng.random() < 0.02 else b
                                             for b in hc.encode(base))))
            else:
                frames.append(hc.frame(hc.encode(base)))
        return {"name": "pipeline-%d" % count, "mode": "normal", "chunks": [(b"".join(frames), 0)], "pipelined": count}
    # split: a valid frame in pieces (header split, payload split), with short pauses.
    data = hc.frame(payload)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4))))
    pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    return {"name": "split", "mode": "normal", "chunks": [(p, 0.01) for p in pieces]}


SAFE = []  # filled in main: templates without launches (for pipelines)


def slow_case(rng, template, request_timeout):
    """A slowloris sender, a stalled frame, or an idle connection: the host must cut it off."""
    data = hc.frame(hc.encode(template))
    choice = rng.randrange(3)
    if choice == 0:
        step = request_timeout / 4.0
        pieces = [(data[i:i + 1], step) for i in range(min(len(data) - 1, 12))]
        return {"name": "slowloris", "mode": "slow", "chunks": pieces}
    if choice == 1:
        return {"name": "stall-after-header", "mode": "slow", "chunks": [(hc.frame(b"x" * 1000)[:hc.HEADER + 3], 0)]}
    return {"name": "idle", "mode": "idle", "chunks": []}


def flood_case(rng, count):
    return {"name": "flood-%d" % count, "mode": "flood", "count": count,
            "chunks": [(hc.frame(hc.encode({"verb": "status"})), 0)]}


# MARK: Running inputs

class Fuzzer:
    def __init__(self, args, host, scratch):
        self.args = args
        self.host = host
        self.scratch = scratch
        self.failures = []
        self.lock = threading.Lock()
        self.counts = {"inputs": 0, "answers": 0, "ok": 0, "refused": 0, "closed-silently": 0}
        self.codes = {}
        self.background = []
        self.sent = []  # inputs of the current batch, in order

    def fail(self, message, case=None):
        with self.lock:
            self.failures.append((message, case))

    def check_answer(self, payload, case):
        try:
            answer = json.loads(payload)
        except ValueError:
            self.fail("%s: the host answered a frame that is not JSON: %r" % (case["name"], payload[:200]), case)
            return None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            self.fail("%s: the host answered without a boolean ok: %r" % (case["name"], payload[:200]), case)
            return None
        with self.lock:
            self.counts["answers"] += 1
            if answer["ok"]:
                self.counts["ok"] += 1
            else:
                code = (answer.get("error") or {}).get("code", "?")
                self.codes[code] = self.codes.get(code, 0) + 1
                if not isinstance(answer.get("error"), dict) or not answer["error"].get("message"):
                    self.fail("%s: a refusal without an error message: %r" % (case["name"], payload[:200]), case)
        return answer

    def run_normal(self, case):
        """Sends the chunks, half-closes, reads every answer until the host closes."""
        answer_deadline = self.args.request_timeout + self.args.answer_margin
        try:
            sock = hc.connect(self.host.socket_path, timeout=5)
        except OSError as error:
            self.fail("%s: cannot connect: %s" % (case["name"], error), case)
            return
        try:
            for data, delay in case["chunks"]:
                try:
                    sock.sendall(data)
                except OSError:
                    break  # the host closed on a bad frame before reading the rest
                if delay:
                    time.sleep(delay)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            reader = hc.FrameReader(sock)
            deadline = time.monotonic() + answer_deadline
            answers = 0
            while True:
                payload, reason = reader.next(deadline)
                if payload is None:
                    if reason == "timeout":
                        self.fail("%s: the host neither answered nor closed within %.0f s (%d answers)"
                                  % (case["name"], answer_deadline, answers), case)
                    elif reason != "closed":
                        self.fail("%s: %s" % (case["name"], reason), case)
                    break
                answers += 1
                self.check_answer(payload, case)
            if answers == 0:
                with self.lock:
                    self.counts["closed-silently"] += 1
            expected = case.get("pipelined")
            if expected and answers > expected:
                self.fail("%s: %d answers to %d frames" % (case["name"], answers, expected), case)
        finally:
            sock.close()

    def run_slow(self, case):
        """The host must end the connection within the request (or idle) deadline."""
        limit = (self.args.idle_timeout if case["mode"] == "idle" else self.args.request_timeout) + self.args.answer_margin
        try:
            sock = hc.connect(self.host.socket_path, timeout=5)
        except OSError as error:
            self.fail("%s: cannot connect: %s" % (case["name"], error), case)
            return
        started = time.monotonic()
        try:
            reader = hc.FrameReader(sock)
            for data, delay in case["chunks"]:
                try:
                    sock.sendall(data)
                except OSError:
                    break
                if delay:
                    payload, reason = reader.next(time.monotonic() + delay)
                    if payload is not None:
                        self.check_answer(payload, case)
                    if reader.closed:
                        break
            while True:
                payload, reason = reader.next(started + limit)
                if payload is not None:
                    answer = self.check_answer(payload, case)
                    if answer and case["mode"] == "slow" and (answer.get("error") or {}).get("code") not in ("request-timeout", "too-many-connections"):
                        self.fail("%s: cut off with %r, expected request-timeout" % (case["name"], answer), case)
                    continue
                if reason == "timeout":
                    self.fail("%s: the host kept the connection open for %.1f s (deadline %.1f s + margin)"
                              % (case["name"], time.monotonic() - started, limit - self.args.answer_margin), case)
                elif reason != "closed":
                    self.fail("%s: %s" % (case["name"], reason), case)
                break
        finally:
            sock.close()

    def run_flood(self, case):
        """`count` connections at once, each asking `status`: each is answered or refused by
        name (too-many-connections), and no more than the cap are served at once."""
        sockets = []
        try:
            for _ in range(case["count"]):
                try:
                    sock = hc.connect(self.host.socket_path, timeout=5)
                    sock.sendall(case["chunks"][0][0])
                    sockets.append(sock)
                except OSError as error:
                    # The listen backlog may be full for a moment: not a host failure.
                    with self.lock:
                        self.codes["connect-" + type(error).__name__] = self.codes.get("connect-" + type(error).__name__, 0) + 1
            served = refused = 0
            deadline = time.monotonic() + self.args.request_timeout + self.args.answer_margin
            for sock in sockets:
                payload, reason = hc.FrameReader(sock).next(deadline)
                if payload is None:
                    if reason == "closed":
                        continue
                    self.fail("%s: a connection got no answer (%s)" % (case["name"], reason), case)
                    continue
                answer = self.check_answer(payload, case)
                if answer is None:
                    continue
                if answer.get("ok"):
                    served += 1
                elif (answer.get("error") or {}).get("code") == "too-many-connections":
                    refused += 1
            if served > self.args.max_connections:
                self.fail("%s: %d connections served at once, over --max-connections %d"
                          % (case["name"], served, self.args.max_connections), case)
            with self.lock:
                self.counts["refused"] += refused
        finally:
            for sock in sockets:
                sock.close()

    def run(self, case):
        self.counts["inputs"] += 1
        self.sent.append(case)
        if case["mode"] == "normal":
            self.run_normal(case)
        elif case["mode"] == "flood":
            self.run_flood(case)
        else:
            # Slow inputs take seconds: a few at once, in the background.
            self.background = [t for t in self.background if t.is_alive()]
            while len(self.background) >= self.args.max_slow:
                self.background[0].join()
                self.background = [t for t in self.background if t.is_alive()]
            thread = threading.Thread(target=self.run_slow, args=(case,), daemon=True)
            thread.start()
            self.background.append(thread)
        status = self.host.exited()
        if status is not None:
            self.fail("the host died (exit status %s) after input %d (%s)" % (status, self.counts["inputs"], case["name"]), case)

    def join_background(self):
        for thread in self.background:
            thread.join()
        self.background = []

    def health(self):
        """Alive, answers status, the sentinel still pending. A list of problems."""
        problems = []
        status = self.host.exited()
        if status is not None:
            return ["the host is dead (exit status %s)" % status]
        answered = self.host.status_ok(self.args.status_deadline)
        if answered is not True:
            problems.append("status: %s" % answered)
        code, out, err = self.host.cli(["pending", SENTINEL_APP, "--json"], timeout=self.args.status_deadline + 10)
        try:
            pending = json.loads(out) if code == 0 else None
        except ValueError:
            pending = None
        if pending is None:
            problems.append("bgtask pending --json failed (status %s): %s" % (code, err.strip()[:300]))
        elif not any(p.get("request", {}).get("identifier") == SENTINEL_TASK for p in pending):
            problems.append("the sentinel request %s is no longer pending: %s" % (SENTINEL_TASK, out.strip()[:300]))
        return problems

    def state_bytes(self):
        """What the host keeps on disk: the database and its WAL."""
        total = 0
        for name in os.listdir(self.host.state):
            if name.startswith("bgtask.sqlite"):
                try:
                    total += os.path.getsize(os.path.join(self.host.state, name))
                except OSError:
                    pass
        return total

    def resources(self):
        """The host's descriptors and threads. Descriptors a suspended app holds in the host (its
        channel, its log pipe, two pidfds: SuspendedApps.descriptorsPerApp) are the app
        lifecycle's, kept until the app's next launch or its eviction, not leaked: not counted."""
        pid = self.host.pid
        try:
            fds = len(os.listdir("/proc/%d/fd" % pid))
            try:
                answer = hc.request(self.host.socket_path, {"verb": "apps"}, timeout=5)
                fds -= 4 * sum(1 for app in (answer or {}).get("apps", []) if app.get("process") == "suspended")
            except (OSError, ValueError, TypeError, AttributeError):
                pass
            with open("/proc/%d/status" % pid) as f:
                threads = int(next(line for line in f if line.startswith("Threads:")).split()[1])
            return fds, threads
        except (OSError, StopIteration, TypeError):
            return None, None


def setup(args, scratch):
    """Bundles, a started host, the sentinel request. Returns the Host."""
    plugins = scratch.join("plugins")
    staging = scratch.join("staging")
    os.makedirs(plugins)
    os.makedirs(staging)
    hc.example_bundles(args.bgtask, plugins, staging)
    info = scratch.join("sentinel.plist")
    with open(info, "w") as f:
        f.write(hc.info_plist(SENTINEL_APP, "libCounter.so", [SENTINEL_TASK], modes=("fetch",)))
    hc.make_bundle(args.bgtask, "Counter", info, os.path.join(staging, "Sentinel.app"))
    os.rename(os.path.join(staging, "Sentinel.app"), os.path.join(plugins, "Sentinel.app"))
    host = hc.Host(args.bgtask, plugins, scratch.join("state"), scratch.join("host.log"), [
        "--clock", "virtual", "--max-connections", str(args.max_connections),
        "--request-timeout", "%gs" % args.request_timeout, "--idle-timeout", "%gs" % args.idle_timeout,
        "--foreground-stay", "200ms", "--max-launches", "2"])
    host.start()
    # The sentinel: submitted a month ahead, then its app's refresh switched off, so that
    # neither the clock (fuzzed `clock advance`) nor the device switches can make it run.
    code, out, err = host.cli(["submit", SENTINEL_APP, SENTINEL_TASK, "--type", "refresh", "--earliest", "+720h"])
    if code != 0:
        raise RuntimeError("cannot submit the sentinel request: %s" % err)
    code, out, err = host.cli(["device", "--app", SENTINEL_APP, "--refresh", "off"])
    if code != 0:
        raise RuntimeError("cannot switch the sentinel app's refresh off: %s" % err)
    return host


def report_failure(args, fuzzer, host, cases):
    directory = hc.artifacts_dir(args.artifacts, "control-fuzz")
    replay = os.path.join(directory, "control-fuzz-replay.jsonl")
    hc.save_cases(replay, cases, "control_fuzz.py seed %d; the last input is last" % args.seed)
    with open(os.path.join(directory, "host.log"), "w") as f:
        f.write(host.log_tail(400))
    print("inputs saved for replay: %s (control_fuzz.py --replay %s)" % (replay, replay))
    print("host log tail: %s" % os.path.join(directory, "host.log"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bgtask", default=hc.default_bgtask(), help="the bgtask binary (default: .build/debug/bgtask); its plugin libraries are next to it")
    parser.add_argument("--iterations", type=int, default=3000, help="inputs to send (default 3000)")
    parser.add_argument("--batch", type=int, default=100, help="inputs between health checks (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1): the same seed makes the same inputs")
    parser.add_argument("--duration", type=float, default=600, help="stop sending after this many seconds (default 600)")
    parser.add_argument("--quick", action="store_true", help="a short run for CI: 400 inputs, batches of 100, at most 20 s of fuzzing")
    parser.add_argument("--max-connections", type=int, default=16, help="the host's --max-connections (default 16)")
    parser.add_argument("--flood", type=int, default=24, help="parallel connections in a flood input (default 24, at most 64)")
    parser.add_argument("--max-slow", type=int, default=3, help="slowloris/idle inputs in flight at once (default 3)")
    parser.add_argument("--request-timeout", type=float, default=2.0, help="the host's --request-timeout in seconds (default 2)")
    parser.add_argument("--idle-timeout", type=float, default=4.0, help="the host's --idle-timeout in seconds (default 4)")
    parser.add_argument("--answer-margin", type=float, default=8.0, help="seconds past the host's deadline before a silent host is a hang (default 8)")
    parser.add_argument("--status-deadline", type=float, default=10.0, help="seconds a health check's status may take (default 10)")
    parser.add_argument("--max-state-growth", type=int, default=64, help="MiB the host's database may grow by during the run (default 64)")
    parser.add_argument("--replay", metavar="FILE", help="send the inputs of a saved replay file to a fresh host, in order, then check it")
    parser.add_argument("--artifacts", metavar="DIR", help="where a failure's replay file and host log go (default: a new temporary directory, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (state, host log)")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.batch, args.duration = 400, 100, min(args.duration, 20)
    args.flood = min(args.flood, 64)
    args.bgtask = os.path.abspath(args.bgtask)
    hc.check_build(args.bgtask, ["Feed", "FeedShare", "Counter"])

    started = time.monotonic()
    hc.set_child_subreaper()
    scratch = hc.Scratch("control-fuzz")
    host = None
    fuzzer = None
    failed_cases = []
    try:
        host = setup(args, scratch)
        fuzzer = Fuzzer(args, host, scratch)
        fds0, threads0 = fuzzer.resources()
        disk0 = fuzzer.state_bytes()
        problems = fuzzer.health()
        if problems:
            fuzzer.fail("before fuzzing: " + "; ".join(problems))
        rng = random.Random(args.seed)
        now = time.time()
        all_templates = templates(now)
        SAFE[:] = [t for t in all_templates if t["verb"] not in LAUNCH_VERBS]
        if args.replay:
            cases = hc.load_cases(args.replay)
            print("replaying %d inputs from %s" % (len(cases), args.replay))
            batches = [cases]
        else:
            batches = None
        batch_index = 0
        since_launch = 0
        fuzz_started = time.monotonic()
        while not fuzzer.failures:
            if batches is not None:
                if batch_index >= len(batches):
                    break
                batch = batches[batch_index]
            else:
                if batch_index * args.batch >= args.iterations or time.monotonic() - fuzz_started > args.duration:
                    break
                batch = []
                for i in range(min(args.batch, args.iterations - batch_index * args.batch)):
                    position = batch_index * args.batch + i
                    if position % 97 == 13:
                        batch.append(slow_case(rng, rng.choice(SAFE), args.request_timeout))
                        continue
                    if position % 211 == 50:
                        batch.append(flood_case(rng, args.flood))
                        continue
                    # Launch verbs at most once in 10 inputs: the machine is shared.
                    since_launch += 1
                    pool = all_templates if since_launch >= 10 else SAFE
                    template = rng.choice(pool)
                    if template["verb"] in LAUNCH_VERBS:
                        since_launch = 0
                    while True:
                        case = mutate(rng, template)
                        if all(SENTINEL_MARK not in data for data, _ in case["chunks"]):
                            break
                    batch.append(case)
            fuzzer.sent = []
            for case in batch:
                fuzzer.run(case)
                if fuzzer.failures:
                    break
                if batches is None and time.monotonic() - fuzz_started > args.duration:
                    break
            fuzzer.join_background()
            if not fuzzer.failures:
                for problem in fuzzer.health():
                    fuzzer.fail("after batch %d: %s" % (batch_index + 1, problem))
            if fuzzer.failures:
                failed_cases = list(fuzzer.sent)
            batch_index += 1
        fds1, threads1 = fuzzer.resources()
        if not fuzzer.failures and fds0 is not None and fds1 is not None:
            # Everything the fuzzer opened is closed: the host must give its descriptors and
            # connection threads back (a little slack for launches and SQLite).
            settle = time.monotonic() + 5
            while (fds1 > fds0 + 16 or threads1 > threads0 + 16) and time.monotonic() < settle:
                time.sleep(0.2)
                fds1, threads1 = fuzzer.resources()
            if fds1 > fds0 + 16:
                fuzzer.fail("the host holds %d descriptors after fuzzing, %d before" % (fds1, fds0))
            if threads1 > threads0 + 16:
                fuzzer.fail("the host runs %d threads after fuzzing, %d before" % (threads1, threads0))
        disk1 = fuzzer.state_bytes()
        print("host resources: %s descriptors and %s threads before, %s and %s after; database %.1f MiB before, %.1f MiB after"
              % (fds0, threads0, fds1, threads1, disk0 / 2 ** 20, disk1 / 2 ** 20))
        if disk1 - disk0 > args.max_state_growth * 2 ** 20:
            fuzzer.fail("the host's database grew by %.1f MiB during fuzzing (over --max-state-growth %d MiB)"
                        % ((disk1 - disk0) / 2 ** 20, args.max_state_growth))
    except Exception as error:  # setup problems are failures too
        if fuzzer is None:
            print("FAIL control_fuzz: setup: %s" % error)
            if host:
                print(host.log_tail())
            cleanup(host, scratch, args)
            return 1
        fuzzer.fail("tool error: %r" % error)
    elapsed = time.monotonic() - started
    if fuzzer.failures:
        for message, case in fuzzer.failures[:20]:
            print("failure: %s" % message)
        if host:
            report_failure(args, fuzzer, host, failed_cases or [c for _, c in fuzzer.failures if c])
    counts = fuzzer.counts
    print("inputs %d, answers %d (ok %d), connections closed without an answer %d, refused over the cap %d"
          % (counts["inputs"], counts["answers"], counts["ok"], counts["closed-silently"], counts["refused"]))
    print("error codes: %s" % ", ".join("%s %d" % kv for kv in sorted(fuzzer.codes.items())))
    cleanup(host, scratch, args)
    verdict = "FAIL" if fuzzer.failures else "PASS"
    print("%s control_fuzz: %d inputs, %d failures, seed %d, %.1f s" % (verdict, counts["inputs"], len(fuzzer.failures), args.seed, elapsed))
    return 1 if fuzzer.failures else 0


def cleanup(host, scratch, args):
    if host:
        host.kill()
        hc.kill_leftovers(hc.leftovers(host.sessions))
    if args.keep:
        print("scratch kept: %s" % scratch.path)
    else:
        scratch.remove()


if __name__ == "__main__":
    sys.exit(main())
