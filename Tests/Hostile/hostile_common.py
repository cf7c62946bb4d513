"""Shared pieces of the hostile tools (control_fuzz.py, bundle_fuzz.py, crash_loop.py).

Python 3 standard library only. Everything a tool starts runs in its own process group (a new
session), is killed by group and reaped; every file lives in one `tempfile.mkdtemp()` directory
that the tool removes. Nothing here kills by name.
"""

import base64
import ctypes
import json
import os
import signal
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

# Children started through subprocess (run(), Host): subprocess reaps them, reap_orphans() not.
STARTED = set()

MAGIC = b"BG"
VERSION = 1
HEADER = 8
MAX_PAYLOAD = 1 << 20

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# MARK: Frames

def frame(payload, version=VERSION, flags=0, length=None, magic=MAGIC):
    """A control frame: "BG", version, flags, big-endian length, payload."""
    if length is None:
        length = len(payload)
    return magic + bytes([version & 0xFF, flags & 0xFF]) + struct.pack(">I", length & 0xFFFFFFFF) + payload


def encode(request):
    """A request as JSONEncoder would write it (compact)."""
    return json.dumps(request, separators=(",", ":")).encode()


class FrameReader:
    """Reads answer frames from a socket until a deadline."""

    def __init__(self, sock):
        self.sock = sock
        self.buffer = b""
        self.closed = False

    def next(self, deadline):
        """(payload, None), or (None, reason): 'closed' (clean end between frames), 'timeout',
        or a description of a malformed frame."""
        while True:
            if len(self.buffer) >= HEADER:
                if self.buffer[:2] != MAGIC or self.buffer[2] != VERSION or self.buffer[3] != 0:
                    return None, "malformed answer header %r" % self.buffer[:HEADER]
                (length,) = struct.unpack(">I", self.buffer[4:8])
                if length > MAX_PAYLOAD:
                    return None, "answer declares %d bytes, over the 1 MiB limit" % length
                if len(self.buffer) >= HEADER + length:
                    payload = self.buffer[HEADER:HEADER + length]
                    self.buffer = self.buffer[HEADER + length:]
                    return payload, None
            if self.closed:
                if self.buffer:
                    return None, "connection ended inside an answer frame (%d bytes buffered)" % len(self.buffer)
                return None, "closed"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, "timeout"
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                return None, "timeout"
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            except OSError as error:
                return None, "recv: %s" % error
            if not chunk:
                self.closed = True
            else:
                self.buffer += chunk


def connect(path, timeout=5.0):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    return sock


def request(path, body, timeout=10.0):
    """One request on a new connection: the decoded answer, or raises OSError/ValueError."""
    sock = connect(path, timeout)
    try:
        sock.sendall(frame(encode(body)))
        payload, reason = FrameReader(sock).next(time.monotonic() + timeout)
        if payload is None:
            raise OSError("no answer to %s: %s" % (body.get("verb"), reason))
        return json.loads(payload)
    finally:
        sock.close()


def task(kind, identifier, earliest=None, title=None, subtitle=None, network=False, power=False):
    """A TaskRequest in the control protocol's form (every field)."""
    body = {"kind": kind, "identifier": identifier}
    if earliest is not None:
        body["earliestBeginDate"] = earliest
    body.update({"requiresNetworkConnectivity": network, "requiresExternalPower": power, "protectionType": 0})
    if title is not None:
        body["title"] = title
    if subtitle is not None:
        body["subtitle"] = subtitle
    body.update({"strategyFail": False, "requiredResources": 0})
    return body


# MARK: Processes

def run(command, timeout=60.0, env=None):
    """Runs a command in its own process group; on timeout the whole group is killed.
    Returns (status, stdout, stderr); status is -SIGNAL for a signal, None for a timeout."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    STARTED.add(process.pid)
    try:
        out, err = process.communicate(timeout=timeout)
        status = process.returncode
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        out, err = process.communicate()
        status = None
    kill_group(process.pid)  # anything it left in its group
    return status, out.decode(errors="replace"), err.decode(errors="replace")


def kill_group(pgid, sig=signal.SIGKILL):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def proc_stat(pid):
    """{'state', 'ppid', 'pgid', 'sid'} of a process, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    close = text.rfind(")")
    fields = text[close + 2:].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgid": int(fields[2]), "sid": int(fields[3])}


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(roots):
    """Every process whose parent chain reaches one of `roots` (roots excluded), as
    {pid: stat}, from one pass over /proc."""
    stats = {}
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat:
            stats[pid] = stat
    roots = set(roots)
    found = {}
    for pid, stat in stats.items():
        seen = set()
        parent = stat["ppid"]
        while parent > 1 and parent not in seen:
            if parent in roots:
                found[pid] = stat
                break
            seen.add(parent)
            parent = stats.get(parent, {}).get("ppid", 0)
    return found


def in_sessions(sessions):
    """Processes whose session is one of `sessions` (a tool's hosts each lead one)."""
    found = {}
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat and stat["sid"] in sessions:
            found[pid] = stat
    return found


def set_child_subreaper():
    """Orphans of what this process starts come back to it (and can be seen and reaped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except OSError:
        return False


def alive(pid):
    stat = proc_stat(pid)
    return stat is not None and stat["state"] != "Z"


# MARK: Bundles and the host

def bin_dir(bgtask):
    return os.path.dirname(os.path.abspath(bgtask))


def library(bgtask, name):
    return os.path.join(bin_dir(bgtask), "lib%s.so" % name)


def check_build(bgtask, libraries):
    missing = [p for p in [bgtask] + [library(bgtask, n) for n in libraries] if not os.path.exists(p)]
    if missing:
        sys.exit("missing build products: %s (build first: swift build --build-tests, or pass --bgtask)" % ", ".join(missing))


def make_bundle(bgtask, lib, info, output, extensions=()):
    """`bgtask bundle`, as the tests and Examples/build.sh do."""
    command = [bgtask, "bundle", "--library", library(bgtask, lib), "--info", info, "--output", output]
    for extension in extensions:
        command += ["--extension", extension]
    status, out, err = run(command, timeout=60)
    if status != 0:
        raise RuntimeError("bgtask bundle %s failed (%s): %s" % (output, status, err.strip()))
    return output


def example_bundles(bgtask, directory, staging):
    """Feed.app (with Share.appex) and Counter.app, built as Examples/build.sh builds them."""
    plugins = os.path.join(PACKAGE_ROOT, "Plugins")
    share = make_bundle(bgtask, "FeedShare", os.path.join(plugins, "FeedShare", "Info.plist"),
                        os.path.join(staging, "Share.appex"))
    feed = make_bundle(bgtask, "Feed", os.path.join(plugins, "Feed", "Info.plist"),
                       os.path.join(staging, "Feed.app"), [share])
    counter = make_bundle(bgtask, "Counter", os.path.join(plugins, "Counter", "Info.plist"),
                          os.path.join(staging, "Counter.app"))
    for bundle in (feed, counter):
        os.rename(bundle, os.path.join(directory, os.path.basename(bundle)))  # atomic, as operators are told


def info_plist(identifier, executable, permitted, modes=("fetch", "processing"), extra=""):
    strings = "".join("<string>%s</string>" % p for p in permitted)
    mode_strings = "".join("<string>%s</string>" % m for m in modes)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0"><dict>'
            "<key>CFBundleIdentifier</key><string>%s</string>"
            "<key>CFBundleExecutable</key><string>%s</string>"
            "<key>BGTaskSchedulerPermittedIdentifiers</key><array>%s</array>"
            "<key>UIBackgroundModes</key><array>%s</array>%s</dict></plist>\n"
            % (identifier, executable, strings, mode_strings, extra))


class Host:
    """A real `bgtask host` in its own session (so its own process group), on a state
    directory of the caller's scratch directory, logging to a file there."""

    def __init__(self, bgtask, plugins, state, log, arguments=()):
        self.bgtask = bgtask
        self.plugins = plugins
        self.state = state
        self.log = log
        self.arguments = list(arguments)
        self.process = None
        self.sessions = set()  # every session a host of this object led

    @property
    def socket_path(self):
        return os.path.join(self.state, "control.sock")

    @property
    def pid(self):
        return self.process.pid if self.process else None

    def start(self, timeout=60.0):
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [self.bgtask, "host", "--plugins", self.plugins, "--state", self.state] + self.arguments,
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.sessions.add(self.process.pid)
        STARTED.add(self.process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if request(self.socket_path, {"verb": "status"}, timeout=5).get("ok"):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("the host did not come up (exit %s): %s" % (self.process.poll(), self.log_tail()))

    def exited(self):
        """The exit status (negative: a signal) once the host is gone, else None."""
        return self.process.poll() if self.process else None

    def status_ok(self, deadline_s):
        """True when a valid `status` is answered within the deadline (a connection refused
        over the cap is retried until then). Else the reason."""
        deadline = time.monotonic() + deadline_s
        last = "no attempt"
        while time.monotonic() < deadline:
            try:
                answer = request(self.socket_path, {"verb": "status"}, timeout=max(0.1, deadline - time.monotonic()))
                if answer.get("ok"):
                    return True
                last = "answer %r" % answer
                if answer.get("error", {}).get("code") != "too-many-connections":
                    return last
            except (OSError, ValueError) as error:
                last = str(error)
            if self.exited() is not None:
                return "the host exited (%s)" % self.exited()
            time.sleep(0.05)
        return "no status answer within %.0f s (last: %s)" % (deadline_s, last)

    def cli(self, arguments, timeout=30.0):
        return run([self.bgtask] + arguments + ["--state", self.state], timeout=timeout)

    def kill(self):
        """SIGKILL the host and its group, and reap it."""
        if not self.process:
            return None
        pid = self.process.pid
        kill_group(pid)
        status = self.process.wait()
        kill_group(pid)
        self.process = None
        return status

    def stop(self, timeout=20.0):
        """SIGTERM and wait (bounded), then kill the group whatever is left; reaps."""
        if not self.process:
            return None
        pid = self.process.pid
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(pid)
            status = self.process.wait()
        kill_group(pid)
        self.process = None
        return status

    def log_tail(self, lines=30):
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def leftovers(sessions, exclude=()):
    """Launch processes (`bgtask-launch` in their cmdline) and any other process still in one
    of the hosts' sessions: what a dead or stopped host must not leave behind."""
    found = {}
    for pid, stat in in_sessions(sessions).items():
        if pid in exclude:
            continue
        found[pid] = (stat, cmdline(pid))
    return found


def kill_leftovers(found):
    """SIGKILLs processes `leftovers` found (each by pid, then its group), and reaps those that
    are this process's children (orphans come back to a subreaper)."""
    for pid, (stat, _) in found.items():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if stat["pgid"] > 1 and stat["pgid"] != os.getpgrp():
            kill_group(stat["pgid"])
    reap_orphans()


def reap_orphans(timeout=2.0):
    """Reaps children of this process that it did not start with subprocess (orphans given to
    it as a subreaper), waiting up to `timeout` for those still dying. Returns their pids."""
    reaped = []
    deadline = time.monotonic() + timeout
    while True:
        mine = [pid for pid in all_pids() if (proc_stat(pid) or {}).get("ppid") == os.getpid()]
        orphans = [pid for pid in mine if pid not in STARTED]
        for pid in orphans:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    reaped.append(pid)
            except ChildProcessError:
                pass
        if not [pid for pid in orphans if pid not in reaped] or time.monotonic() > deadline:
            return reaped
        time.sleep(0.05)


def zombies_under(parents):
    """Zombies whose parent is one of `parents`."""
    found = []
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat and stat["state"] == "Z" and stat["ppid"] in parents:
            found.append(pid)
    return found


# MARK: Replay files

def save_cases(path, cases, note):
    """Cases as JSON lines: {"name", "chunks": [[base64, delay_after_s], ...], ...}."""
    with open(path, "w") as f:
        f.write(json.dumps({"note": note}) + "\n")
        for case in cases:
            entry = dict(case)
            entry["chunks"] = [[base64.b64encode(data).decode(), delay] for data, delay in case["chunks"]]
            f.write(json.dumps(entry) + "\n")


def load_cases(path):
    cases = []
    with open(path) as f:
        for line in f:
            entry = json.loads(line)
            if "chunks" not in entry:
                continue
            entry["chunks"] = [(base64.b64decode(data), delay) for data, delay in entry["chunks"]]
            cases.append(entry)
    return cases


def artifacts_dir(requested, tool):
    if requested:
        os.makedirs(requested, exist_ok=True)
        return requested
    return tempfile.mkdtemp(prefix="bgtask-%s-failure-" % tool)


def default_bgtask():
    for candidate in (".build/debug/bgtask", os.path.join(PACKAGE_ROOT, ".build/debug/bgtask")):
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return ".build/debug/bgtask"


class Scratch:
    """One mkdtemp directory; remove() deletes it and nothing else."""

    def __init__(self, tool):
        self.path = tempfile.mkdtemp(prefix="bgtask-%s-" % tool)
        # A root host runs each app as its own uid: bundles must be reachable by others.
        os.chmod(self.path, 0o755)

    def join(self, *parts):
        return os.path.join(self.path, *parts)

    def remove(self):
        shutil.rmtree(self.path, ignore_errors=True)
