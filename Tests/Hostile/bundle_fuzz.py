#!/usr/bin/env python3
"""Fuzzes bundle validation: `bgtask validate BUNDLE --json`, then a running host's plugin scan.

Generates bundles from a valid one (Counter.app's Info.plist and library, built with `bgtask
bundle`; an app with an extension for the .appex cases), each with one fault whose outcome is
known (or, for `havoc` and corrupt-plist cases, several faults and any well-formed outcome):
every key of the bundle format given every wrong type, wrong element types, missing keys,
generated identifiers (valid and invalid, checked against a model of the rules: reverse DNS,
255 bytes, `.*` only at the end), the limits (1,000 permitted identifiers, 16 background modes,
64 app groups, 64 extensions: at and over), bad handler signatures and entitlements, XML and
binary property lists (plistlib, and a hand-written binary writer for deep nesting and
cycles), truncated and bit-flipped plists, deep nesting, a FIFO, socket, directory, dangling or
looping symlink, or symlink out of the bundle where Info.plist or the executable should be, a
missing, non-ELF, truncated-ELF or non-shared-object executable, and files of a few MiB.

Each `bgtask validate --json` runs with a timeout and must exit 0 (valid) or 65 (invalid, the
exit status docs/cli.md gives an invalid bundle), never die of a signal or hang; an invalid bundle's
JSON names the file (inside the bundle) and, for a key's fault, that key (`key` field, and
`key K` in the message). Then a batch of the bundles (and a FIFO, a socket, a symlink and a
plain file named *.app) is moved into a running host's plugin directory next to a valid
Feed.app: `bgtask apps --json` must answer, list com.example.feed, and account for every
dropped *.app as an app or an invalid bundle; some bundles are then broken in place (Info.plist
swapped for a FIFO) and the host asked again.

A failure leaves the failing bundles (FIFOs and sockets recreated from a description) and a
replay file in an artifacts directory: `bundle_fuzz.py --replay FILE` validates them again.

Exit status 0 and a last line `PASS ...`, or 1 and `FAIL ...`.
"""

import argparse
import copy
import datetime
import json
import os
import plistlib
import random
import shutil
import socket
import stat
import struct
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_common as hc  # noqa: E402

APP_ID = "com.example.counter"
LIB = "libCounter.so"
KEYS = ["CFBundleIdentifier", "CFBundleExecutable", "BGTaskSchedulerPermittedIdentifiers", "UIBackgroundModes",
        "BGTaskHandlers", "Entitlements", "NSExtension"]
HEALTH = "com.apple.developer.background-tasks.health-research"
GPU = "com.apple.developer.background-tasks.continued-processing.gpu"
GROUPS = "com.apple.security.application-groups"
LIMIT_IDENTIFIER = 255
LIMIT_PLIST = 1 << 20
ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def reverse_dns(text):
    parts = text.split(".")
    return len(parts) >= 2 and all(part and all(c in ALLOWED for c in part) for part in parts)


def base_info():
    with open(os.path.join(hc.PACKAGE_ROOT, "Plugins", "Counter", "Info.plist"), "rb") as f:
        return plistlib.load(f)


# MARK: Values

def wrong_values(kind):
    """Values that are not of `kind` (string, array, dict, bool)."""
    every = {"string": "x", "integer": 7, "real": 1.5, "bool": True, "date": datetime.datetime(2020, 1, 1),
             "data": b"\x00\x01", "array": ["a.b"], "dict": {"a": "b"}, "empty-array": [], "empty-dict": {}}
    drop = {"string": ["string"], "array": ["array", "empty-array"], "dict": ["dict", "empty-dict"], "bool": ["bool"]}[kind]
    return [(name, value) for name, value in every.items() if name not in drop]


def xml_safe(text):
    for c in text:
        o = ord(c)
        if (o < 0x20 and c not in "\t\n\r") or 0xD800 <= o <= 0xDFFF or o in (0xFFFE, 0xFFFF):
            return False
    return "\r" not in text  # XML turns CR into LF


def identifier(rng, allow_wildcard=False):
    """A generated identifier, valid or not, as a string."""
    choice = rng.randrange(10)
    if choice == 0:
        return rng.choice(["", ".", "..", "a", "a.", ".a", "a..b", "com.example.", "com.ex ample.x", "com.ex_ample.x",
                           "com.exämple.x", "com.x/y", "com.x\\y", "com.*", "*", "com.x.*.y", "com.x.**", "com.x*",
                           "-.-", "com.-", "COM.EXAMPLE.X", "1.2", "com.x\u200b.y", "com.x\u0301.y", "com.x\ufeff",
                           "com.x\x00y", "com.x\ty", "com.x\n", "com.\U0001F600.x", "a" * 200 + "." + "b" * 54,
                           "a" * 200 + "." + "b" * 55, "a." * 127 + "b", "a." * 128 + "b", "x" * 70000 + ".y"])
    parts = []
    for _ in range(rng.choice([1, 2, 2, 3, 3, 4, 6])):
        alphabet = "abcXYZ019-" if rng.random() < 0.8 else "abc-_ .*/é\x00\x7f"
        parts.append("".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 8, 20]))))
    text = ".".join(parts)
    if allow_wildcard and rng.random() < 0.3:
        text += ".*"
    return text


def permitted_valid(entry):
    if not isinstance(entry, str) or not entry:
        return False
    if len(entry.encode("utf-8", "surrogatepass")) > LIMIT_IDENTIFIER:
        return False
    base = entry[:-2] if entry.endswith(".*") else entry
    return reverse_dns(base)


# MARK: Binary property lists by hand (for nesting and cycles plistlib cannot write)

def bplist(objects, top=0, ref_size=4, offset_size=4):
    out = bytearray(b"bplist00")
    offsets = []
    for encoded in objects:
        offsets.append(len(out))
        out += encoded
    table = len(out)
    for offset in offsets:
        out += offset.to_bytes(offset_size, "big")
    out += bytes(6) + bytes([offset_size, ref_size]) + struct.pack(">QQQ", len(objects), top, table)
    return bytes(out)


def b_count(marker, n):
    if n < 15:
        return bytes([marker | n])
    return bytes([marker | 0xF, 0x12]) + struct.pack(">I", n)


def b_string(text):
    data = text.encode("ascii")
    return b_count(0x50, len(data)) + data


def b_array(refs):
    return b_count(0xA0, len(refs)) + b"".join(r.to_bytes(4, "big") for r in refs)


def b_dict(keys, values):
    return b_count(0xD0, len(keys)) + b"".join(r.to_bytes(4, "big") for r in keys + values)


def deep_binary(info, key, depth, cycle=False):
    """A binary plist of `info` (strings and string arrays only) with `key` set to `depth`
    nested arrays, or to an array that contains itself (`cycle`)."""
    objects = [None]
    keys, values = [], []
    for name, value in info.items():
        if name == key or not isinstance(value, (str, list)) or any(not isinstance(v, str) for v in (value if isinstance(value, list) else [])):
            continue
        keys.append(len(objects))
        objects.append(b_string(name))
        if isinstance(value, str):
            values.append(len(objects))
            objects.append(b_string(value))
        else:
            refs = list(range(len(objects) + 1, len(objects) + 1 + len(value)))
            values.append(len(objects))
            objects.append(b_array(refs))
            objects.extend(b_string(v) for v in value)
    keys.append(len(objects))
    objects.append(b_string(key))
    values.append(len(objects))
    start = len(objects)
    if cycle:
        objects.append(b_array([start + 1]))
        objects.append(b_array([start]))
    else:
        for i in range(depth):
            objects.append(b_array([start + i + 1] if i + 1 < depth else []))
    objects[0] = b_dict(keys, values)
    return bplist(objects)


def deep_xml(info, key, depth):
    body = plistlib.dumps({k: v for k, v in info.items() if k != key}, fmt=plistlib.FMT_XML)
    nest = b"<array>" * depth + b"</array>" * depth
    return body.replace(b"<dict>", b"<dict><key>%s</key>%s" % (key.encode(), nest), 1)


# MARK: Cases

class Case:
    """A bundle to make: its Info.plist bytes (or a special file), executable, extras; and what
    validation must say: valid True/False/None (either), and the key of the fault ("" for a
    file-level fault, None for any)."""

    def __init__(self, name, info, valid, key=None, fmt="xml"):
        self.name = name
        self.info = info          # dict, or bytes (raw Info.plist)
        self.fmt = fmt
        self.valid = valid
        self.key = key
        self.plist_special = None  # fifo, socket, dir, link-out, link-dev, dangling, loop, link-in
        self.exe_special = None    # same, plus missing, text, empty, elf-exec, elf-short, big-garbage, big-elf, hardlink
        self.extension = None      # (dict or bytes) Info.plist of PlugIns/Ext.appex
        self.extensions = 0        # empty *.appex directories to add (limit cases)
        self.appex = False         # the bundle itself is an .appex

    def describe(self):
        return {"name": self.name, "valid": self.valid, "key": self.key, "fmt": self.fmt,
                "plist_special": self.plist_special, "exe_special": self.exe_special, "extensions": self.extensions,
                "appex": self.appex}


def plist_bytes(info, fmt):
    if isinstance(info, bytes):
        return info
    if fmt == "binary":
        return plistlib.dumps(info, fmt=plistlib.FMT_BINARY, sort_keys=False)
    return plistlib.dumps(info, fmt=plistlib.FMT_XML, sort_keys=False)


def fmt_for(rng, *texts):
    if all(xml_safe(t) for t in texts if isinstance(t, str)):
        return rng.choice(["xml", "binary"])
    return "binary"


def make_case(rng, base, index):
    info = copy.deepcopy(base)
    family = rng.choices(
        ["type", "element", "missing", "bundle-id", "permitted", "limits", "handlers", "entitlements", "corrupt",
         "deep", "plist-special", "exe-special", "huge", "extension", "appex", "havoc", "valid"],
        weights=[12, 8, 4, 10, 10, 5, 5, 6, 8, 5, 6, 8, 2, 6, 3, 6, 3])[0]
    fmt = rng.choice(["xml", "binary"])

    if family == "valid":
        return Case("valid", info, True, fmt=fmt)
    if family == "type":
        key = rng.choice(KEYS)
        kind = {"CFBundleIdentifier": "string", "CFBundleExecutable": "string", "BGTaskSchedulerPermittedIdentifiers": "array",
                "UIBackgroundModes": "array", "BGTaskHandlers": "dict", "Entitlements": "dict", "NSExtension": "dict"}[key]
        name, value = rng.choice(wrong_values(kind))
        info[key] = value
        if key == "BGTaskSchedulerPermittedIdentifiers":
            info.pop("BGTaskHandlers", None)
        if key == "NSExtension":  # apps ignore it
            return Case("type-NSExtension-" + name, info, True, fmt=fmt)
        return Case("type-%s-%s" % (key, name), info, False, key, fmt)
    if family == "element":
        choice = rng.randrange(5)
        name, value = rng.choice(wrong_values("string") + [("empty-string", "")])
        if choice == 0:
            entries = list(info["BGTaskSchedulerPermittedIdentifiers"])
            at = rng.randrange(len(entries) + 1)
            entries.insert(at, value)
            info["BGTaskSchedulerPermittedIdentifiers"] = entries
            return Case("element-permitted-" + name, info, False, "BGTaskSchedulerPermittedIdentifiers[%d]" % at, fmt)
        if choice == 1:
            info["UIBackgroundModes"] = ["fetch", value]
            return Case("element-modes-" + name, info, False, "UIBackgroundModes[1]", fmt)
        if choice == 2:
            if name == "empty-string":
                return Case("element-handler-empty", dict(info, BGTaskHandlers={"com.example.counter.report": ""}), False, "BGTaskHandlers.com.example.counter.report", fmt)
            info["BGTaskHandlers"] = {"com.example.counter.report": value}
            return Case("element-handler-" + name, info, False, "BGTaskHandlers.com.example.counter.report", fmt)
        if choice == 3:
            if name == "bool":
                value = 1  # an integer 1 must not grant an entitlement
            info["Entitlements"] = {HEALTH: value}
            return Case("element-entitlement-" + name, info, False, "Entitlements." + HEALTH, fmt)
        info["Entitlements"] = {GROUPS: ["group.com.example.counter", value]}
        return Case("element-group-" + name, info, False, "Entitlements.%s[1]" % GROUPS, fmt)
    if family == "missing":
        key = rng.choice(["CFBundleIdentifier", "CFBundleExecutable", "BGTaskSchedulerPermittedIdentifiers", "UIBackgroundModes", "BGTaskHandlers"])
        del info[key]
        if key == "BGTaskSchedulerPermittedIdentifiers":
            # Its mapped handlers now name identifiers it does not permit.
            return Case("missing-" + key, info, False, "BGTaskHandlers.com.example.counter.report", fmt)
        required = key in ("CFBundleIdentifier", "CFBundleExecutable")
        return Case("missing-" + key, info, not required, key if required else None, fmt)
    if family == "bundle-id":
        text = identifier(rng)
        info["CFBundleIdentifier"] = text
        valid = bool(text) and len(text.encode()) <= LIMIT_IDENTIFIER and reverse_dns(text)
        case = Case("bundle-id", info, valid, None if valid else "CFBundleIdentifier", fmt_for(rng, text))
        if len(text) > 60000 and case.fmt == "xml":
            case.fmt = "binary"
        return case
    if family == "permitted":
        count = rng.choice([0, 1, 3, 10])
        entries = [identifier(rng, allow_wildcard=True) for _ in range(count)]
        info["BGTaskSchedulerPermittedIdentifiers"] = entries
        info.pop("BGTaskHandlers", None)
        # The reader checks every entry's type (a non-empty string) first, then each one's form.
        bad = [i for i, e in enumerate(entries) if not isinstance(e, str) or not e] or \
            [i for i, e in enumerate(entries) if not permitted_valid(e)]
        key = None if not bad else "BGTaskSchedulerPermittedIdentifiers[%d]" % bad[0]
        return Case("permitted", info, not bad, key, fmt_for(rng, *entries))
    if family == "limits":
        choice = rng.randrange(5)
        over = rng.random() < 0.5
        if choice == 0:
            n = 1001 if over else 1000
            info["BGTaskSchedulerPermittedIdentifiers"] = ["com.example.counter.t%d" % i for i in range(n - 3)] + base["BGTaskSchedulerPermittedIdentifiers"]
            return Case("limit-permitted-%d" % n, info, not over, "BGTaskSchedulerPermittedIdentifiers" if over else None, fmt)
        if choice == 1:
            n = 17 if over else 16
            info["UIBackgroundModes"] = ["fetch"] + ["mode%d" % i for i in range(n - 1)]
            return Case("limit-modes-%d" % n, info, not over, "UIBackgroundModes" if over else None, fmt)
        if choice == 2:
            n = 65 if over else 64
            info["Entitlements"] = {GROUPS: ["group.com.example.g%d" % i for i in range(n)]}
            return Case("limit-groups-%d" % n, info, not over, "Entitlements." + GROUPS if over else None, fmt)
        if choice == 3:
            case = Case("limit-extensions-%d" % (65 if over else 64), info, False if over else None, "" if over else None, fmt)
            case.extensions = 65 if over else 64  # empty .appex directories: each invalid, the app valid at 64
            return case
        # 100,000 identifiers: the file is over the size limit, refused before it is parsed.
        info["BGTaskSchedulerPermittedIdentifiers"] = ["com.example.counter.identifier%d" % i for i in range(100000)]
        info.pop("BGTaskHandlers", None)
        return Case("limit-100k-identifiers", info, False, "", "xml")
    if family == "handlers":
        signature = rng.choice(["", "(", "f(", "f)", "f() ->", "1f()", "f(identifier, identifier, identifier, identifier, identifier, identifier, identifier, identifier, identifier)",
                                "f(nonsense)", "f(identifier) -> nonsense", "f(" + "identifier, " * 1000 + "identifier)",
                                "a" * 10000 + "()", "f(task_id, complete) -> bool extra", "\u0000f()", "f(identifier) -> bool"])
        target = rng.choice(["com.example.counter.report", "com.example.other.report"])
        info["BGTaskHandlers"] = {target: signature}
        key = "BGTaskHandlers." + target
        if target == "com.example.other.report":
            return Case("handler-unpermitted", info, False, key, fmt_for(rng, signature))
        return Case("handler-signature", info, None, key, fmt_for(rng, signature))
    if family == "entitlements":
        choice = rng.randrange(4)
        if choice == 0:
            info["Entitlements"] = {HEALTH: True, GPU: False, "com.example.unknown": True}
            return Case("entitlements-bools", info, True, None, fmt)
        if choice == 1:
            group = rng.choice(["group.", "group", "com.example.g", "group.com", "group.com..x", "group.com.x", "group.com.x.*", "GROUP.com.x"])
            info["Entitlements"] = {GROUPS: [group]}
            valid = group.startswith("group.") and reverse_dns(group[len("group."):])
            return Case("entitlements-group", info, valid, None if valid else "Entitlements.%s[0]" % GROUPS, fmt)
        if choice == 2:
            name, value = rng.choice(wrong_values("array"))
            info["Entitlements"] = {GROUPS: value}
            return Case("entitlements-groups-" + name, info, False, "Entitlements." + GROUPS, fmt)
        name, value = rng.choice([(n, v) for n, v in wrong_values("bool")])
        info["Entitlements"] = {GPU: value}
        return Case("entitlements-gpu-" + name, info, False, "Entitlements." + GPU, fmt)
    if family == "corrupt":
        data = bytearray(plist_bytes(info, fmt))
        choice = rng.randrange(6)
        if choice == 0:
            data = data[:rng.randrange(len(data))]
            name = "truncated"
        elif choice == 1:
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            name = "bitflip"
        elif choice == 2:
            data = bytearray(rng.choice([b"", b"\0", b"bplist00", b"bplist00" + bytes(40), b"<plist>", b"{", b"()", b"[]",
                                         b"<?xml version=\"1.0\"?><plist><array/></plist>", b"<plist><string>x</string></plist>",
                                         b"{ CFBundleIdentifier = com.example.counter; CFBundleExecutable = libCounter.so; }",
                                         b"\xef\xbb\xbf" + bytes(data), b"\xff\xfe" + "<plist/>".encode("utf-16-le"),
                                         bytes(rng.randrange(256) for _ in range(512))]))
            name = "replaced"
        elif choice == 3 and fmt == "binary":
            # A trailer whose counts and offsets point anywhere.
            trailer = bytearray(data[-32:])
            field = rng.randrange(4)
            if field == 0:
                trailer[6:8] = bytes([rng.choice([0, 3, 5, 8, 255]), rng.choice([0, 3, 5, 8, 255])])
            else:
                trailer[8 * field:8 * field + 8] = struct.pack(">Q", rng.choice([0, 1, 2 ** 32, 2 ** 63, 2 ** 64 - 1, len(data) * 4]))
            data[-32:] = trailer
            name = "trailer"
        elif choice == 4:
            data = data.replace(b"com.example.counter", b"com.example.\x00ounter", 1)
            name = "nul"
        else:
            data = data.replace(b"com.example.counter", b"com.example.\xff\xfeounter", 1)
            name = "utf8"
        return Case("corrupt-%s-%s" % (fmt, name), bytes(data), None, None, fmt)
    if family == "deep":
        depth = rng.choice([10, 100, 500, 512, 513, 1000, 5000, 50000, 140000])
        key = rng.choice(["Deep", "UIBackgroundModes", "BGTaskSchedulerPermittedIdentifiers", "Entitlements"])
        if key == "BGTaskSchedulerPermittedIdentifiers" or key == "Entitlements":
            info.pop("BGTaskHandlers", None)
        choice = rng.randrange(3)
        if choice == 0:
            data = deep_xml(info, key, depth)
            name = "xml"
        elif choice == 1:
            data = deep_binary(info, key, depth)
            name = "binary"
        else:
            data = deep_binary(info, key, 0, cycle=True)
            name = "cycle"
        # Unknown keys are ignored: valid if it parses. A known key holding arrays is invalid,
        # at that key, or as a file that does not parse ("").
        return Case("deep-%s-%s-%d" % (name, key, depth), data, None if key == "Deep" else False,
                    None if key == "Deep" else key, name)
    if family == "plist-special":
        case = Case("", info, False, "", fmt)
        case.plist_special = rng.choice(["fifo", "socket", "dir", "link-out", "link-dev", "dangling", "loop", "link-in", "link-chain-out"])
        case.name = "plist-" + case.plist_special
        if case.plist_special == "link-in":
            case.valid, case.key = True, None
        return case
    if family == "exe-special":
        case = Case("", info, False, "CFBundleExecutable", fmt)
        case.exe_special = rng.choice(["fifo", "socket", "dir", "link-out", "link-dev", "dangling", "loop", "link-in", "missing",
                                       "text", "empty", "elf-exec", "elf-short", "big-garbage", "big-elf", "hardlink",
                                       "name-dotdot", "name-dot", "name-path", "name-parent"])
        case.name = "exe-" + case.exe_special
        if case.exe_special in ("link-in", "big-elf", "hardlink"):
            case.valid, case.key = True, None
        if case.exe_special == "name-dotdot":
            info["CFBundleExecutable"] = ".."
        elif case.exe_special == "name-dot":
            info["CFBundleExecutable"] = "."
        elif case.exe_special == "name-path":
            info["CFBundleExecutable"] = "lib/libCounter.so"
        elif case.exe_special == "name-parent":
            info["CFBundleExecutable"] = "../libCounter.so"
        return case
    if family == "huge":
        if rng.random() < 0.5:
            info["Padding"] = "p" * (LIMIT_PLIST + 4096)
            return Case("huge-plist-over", info, False, "", "xml")
        info["Padding"] = "p" * (LIMIT_PLIST - 4096)
        return Case("huge-plist-under", info, True, None, "xml")
    if family in ("extension", "appex"):
        ext = {"CFBundleIdentifier": APP_ID + ".share", "CFBundleExecutable": LIB, "NSExtension": {"NSExtensionPointIdentifier": "com.apple.share-services"}}
        choice = rng.randrange(6)
        valid, key = False, None
        if choice == 0:
            ext["CFBundleIdentifier"] = "com.other.share"
            key = "CFBundleIdentifier"
        elif choice == 1:
            del ext["NSExtension"]
            key = "NSExtension"
        elif choice == 2:
            ext["NSExtension"] = rng.choice(wrong_values("dict"))[1]
            key = "NSExtension"
        elif choice == 3:
            ext["NSExtension"] = {"NSExtensionPointIdentifier": rng.choice(wrong_values("string"))[1]}
            key = "NSExtension.NSExtensionPointIdentifier"
        elif choice == 4:
            ext["CFBundleIdentifier"] = identifier(rng)
            valid = ext["CFBundleIdentifier"].startswith(APP_ID + ".") and reverse_dns(ext["CFBundleIdentifier"]) and len(ext["CFBundleIdentifier"].encode()) <= LIMIT_IDENTIFIER
            key = None if valid else "CFBundleIdentifier"
        else:
            valid = True
        if family == "appex":
            # Validated alone it has no app: any reverse-DNS identifier is fine.
            if choice == 0:
                valid, key = True, None
            if choice == 4:
                text = ext["CFBundleIdentifier"]
                valid = bool(text) and reverse_dns(text) and len(text.encode()) <= LIMIT_IDENTIFIER
                key = None if valid else "CFBundleIdentifier"
            case = Case("appex-%d" % choice, ext, valid, key, fmt_for(rng, ext["CFBundleIdentifier"]))
            case.appex = True
            return case
        case = Case("extension-%d" % choice, info, valid, key, fmt)
        case.extension = (ext, fmt_for(rng, ext["CFBundleIdentifier"]))
        return case
    # havoc: several faults at once; any well-formed answer.
    for _ in range(rng.randint(2, 5)):
        key = rng.choice(KEYS + ["Extra"])
        info[key] = rng.choice([v for _, v in wrong_values("string")] + [identifier(rng), [identifier(rng) for _ in range(3)]])
    texts = [v for v in info.values() if isinstance(v, str)] + [x for v in info.values() if isinstance(v, list) for x in v if isinstance(x, str)]
    return Case("havoc", info, None, None, fmt_for(rng, *texts))


# MARK: Making bundles

ELF_DYN = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\x3e\x00" + bytes(44)
ELF_EXEC = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x02\x00\x3e\x00" + bytes(44)


def make_special(path, kind, scratch, real, bundle):
    """Puts a special file at `path` (Info.plist or the executable); `real` is the file that
    belongs there, `bundle` the bundle directory."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        finally:
            sock.close()
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "link-out":
        outside = os.path.join(scratch, "outside-" + os.path.basename(path))
        if not os.path.exists(outside):
            shutil.copyfile(real, outside)
        os.symlink(outside, path)
    elif kind == "link-chain-out":
        os.symlink("hop", path)
        os.symlink("/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd", os.path.join(bundle, "hop"))
    elif kind == "link-dev":
        os.symlink("/dev/zero", path)
    elif kind == "dangling":
        os.symlink(os.path.join(bundle, "nothing-here"), path)
    elif kind == "loop":
        os.symlink(os.path.basename(path) + ".b", path)
        os.symlink(os.path.basename(path), path + ".b")
    elif kind == "link-in":
        target = os.path.basename(path) + ".1"
        shutil.copyfile(real, path + ".1")
        os.symlink(target, path)
    elif kind == "missing":
        pass
    elif kind == "text":
        with open(path, "w") as f:
            f.write("#!/bin/sh\necho not a library\n")
    elif kind == "empty":
        open(path, "w").close()
    elif kind == "elf-exec":
        with open(path, "wb") as f:
            f.write(ELF_EXEC)
    elif kind == "elf-short":
        with open(path, "wb") as f:
            f.write(ELF_DYN[:17])
    elif kind == "big-garbage":
        with open(path, "wb") as f:
            f.write(b"\x00GARBAGE" * (4 << 17))  # 4 MiB
    elif kind == "big-elf":
        with open(path, "wb") as f:
            f.write(ELF_DYN + bytes((3 << 20)))  # 3 MiB: the header is what validation reads
    elif kind == "hardlink":
        try:
            os.link(real, path)
        except OSError:
            shutil.copyfile(real, path)
    else:
        raise ValueError(kind)


def build(case, directory, name, template_lib, scratch):
    """Makes the bundle of `case` at directory/name."""
    bundle = os.path.join(directory, name)
    os.mkdir(bundle)
    os.chmod(bundle, 0o755)
    info = case.info
    plist_path = os.path.join(bundle, "Info.plist")
    staging_plist = os.path.join(scratch, "plist-" + name)
    with open(staging_plist, "wb") as f:
        f.write(plist_bytes(info, case.fmt if case.fmt in ("xml", "binary") else "xml"))
    if case.plist_special:
        make_special(plist_path, case.plist_special, scratch, staging_plist, bundle)
    else:
        shutil.copyfile(staging_plist, plist_path)
    os.unlink(staging_plist)
    executable = info.get("CFBundleExecutable") if isinstance(info, dict) else LIB
    if not isinstance(executable, str) or not executable or "/" in executable or executable in (".", "..") or "\0" in executable:
        executable = LIB
    exe_path = os.path.join(bundle, executable)
    if case.exe_special and case.exe_special not in ("name-dotdot", "name-dot", "name-path", "name-parent"):
        make_special(exe_path, case.exe_special, scratch, template_lib, bundle)
    elif not os.path.exists(exe_path):
        shutil.copyfile(template_lib, exe_path)
    if case.extension or case.extensions:
        plugins = os.path.join(bundle, "PlugIns")
        os.mkdir(plugins)
        if case.extension:
            ext, fmt = case.extension
            appex = os.path.join(plugins, "Share.appex")
            os.mkdir(appex)
            with open(os.path.join(appex, "Info.plist"), "wb") as f:
                f.write(plist_bytes(ext, fmt))
            shutil.copyfile(template_lib, os.path.join(appex, LIB))
        for i in range(case.extensions):
            os.mkdir(os.path.join(plugins, "E%02d.appex" % i))
    return bundle


# MARK: Checking

class Checker:
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.counts = {"valid": 0, "invalid": 0}
        self.elapsed = []

    def fail(self, case, bundle, message):
        self.failures.append((case, bundle, message))

    def validate(self, case, bundle):
        started = time.monotonic()
        status, out, err = hc.run([self.args.bgtask, "validate", bundle, "--json"], timeout=self.args.timeout)
        self.elapsed.append(time.monotonic() - started)
        if status is None:
            return self.fail(case, bundle, "bgtask validate hung: killed after %.0f s" % self.args.timeout)
        if status < 0:
            return self.fail(case, bundle, "bgtask validate died of signal %d: %s" % (-status, err.strip()[-500:]))
        if status not in (0, 65):
            return self.fail(case, bundle, "bgtask validate exited %d (expected 0 or 65): %s %s" % (status, out.strip()[:300], err.strip()[-300:]))
        try:
            body = json.loads(out)
        except ValueError:
            return self.fail(case, bundle, "bgtask validate --json printed no JSON object (status %d): %r" % (status, out[:300]))
        if not isinstance(body, dict):
            return self.fail(case, bundle, "bgtask validate --json printed %r" % out[:300])
        summary_valid = body.get("valid") is True
        if status == 0:
            self.counts["valid"] += 1
            if not summary_valid:
                return self.fail(case, bundle, "exit 0 without valid: true: %r" % out[:300])
            if case.valid is False:
                return self.fail(case, bundle, "an invalid bundle (expected fault at key %r) was accepted: %s" % (case.key, out.strip()[:300]))
            return
        self.counts["invalid"] += 1
        if summary_valid:
            # The app is valid and an extension is not: each problem names its file and key.
            problems = body.get("invalid_extensions") or []
            if not problems:
                return self.fail(case, bundle, "exit 65 with a valid summary and no invalid extension: %r" % out[:300])
            if case.valid is True:
                return self.fail(case, bundle, "a valid bundle was refused: %s" % problems[0][:300])
            for problem in problems:
                if bundle not in problem:
                    self.fail(case, bundle, "an invalid extension's error does not name its file: %r" % problem[:300])
            if case.key and case.extension and not any(("key %s:" % case.key) in p for p in problems):
                self.fail(case, bundle, "no invalid extension's error names key %s: %r" % (case.key, problems[0][:300]))
            return
        if body.get("valid") != "false":
            return self.fail(case, bundle, "exit 65 without valid: false: %r" % out[:300])
        error, file, key = body.get("error", ""), body.get("file", ""), body.get("key", "")
        if case.valid is True:
            return self.fail(case, bundle, "a valid bundle was refused: %s" % error[:400])
        if not error:
            return self.fail(case, bundle, "an invalid bundle's JSON has no error")
        if not file or not (file == bundle or file.startswith(bundle + "/")):
            return self.fail(case, bundle, "the error names file %r, not a file of the bundle %s" % (file, bundle))
        if file not in error:
            return self.fail(case, bundle, "the error does not name its file %r: %s" % (file, error[:300]))
        if key and ("key %s:" % key) not in error:
            return self.fail(case, bundle, "the error does not name its key %r: %s" % (key, error[:300]))
        if case.key is not None and case.extension is None:
            if case.key == "" and key != "":
                return self.fail(case, bundle, "expected a file-level error, got key %r: %s" % (key, error[:300]))
            if case.key and not (key == case.key or key.startswith(case.key + "[") or key.startswith(case.key + ".")):
                if not (case.name.startswith("deep") and key == ""):
                    return self.fail(case, bundle, "expected an error at key %r, got key %r: %s" % (case.key, key, error[:300]))
        if case.valid is None and case.key and case.key.startswith("BGTaskHandlers") and not key.startswith("BGTaskHandlers"):
            return self.fail(case, bundle, "expected an error at key %r or none, got key %r: %s" % (case.key, key, error[:300]))


def host_phase(args, cases, scratch, template_lib, checker, rng):
    """Drops bundles into a running host's plugin directory; the host must keep answering."""
    plugins = scratch.join("plugins")
    staging = scratch.join("host-staging")
    os.makedirs(plugins)
    os.makedirs(staging)
    hc.example_bundles(args.bgtask, plugins, staging)
    shutil.rmtree(os.path.join(plugins, "Counter.app"))
    host = hc.Host(args.bgtask, plugins, scratch.join("state"), scratch.join("host.log"), ["--clock", "virtual"])
    problems = []
    try:
        host.start()
        dropped = []
        for i, case in enumerate(cases):
            name = "Fuzz-%04d.app" % i if not case.appex else "Fuzz-%04d.appex" % i
            build(case, staging, name, template_lib, scratch.path)
            os.rename(os.path.join(staging, name), os.path.join(plugins, name))
            if name.endswith(".app"):
                dropped.append(name)
        # Entries named *.app that are not directories, in the plugin directory itself.
        os.mkfifo(os.path.join(plugins, "Pipe.app"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(os.path.join(plugins, "Sock.app"))
        sock.close()
        os.symlink(os.path.join(scratch.path, "host-staging"), os.path.join(plugins, "Link.app"))
        with open(os.path.join(plugins, "File.app"), "w") as f:
            f.write("not a bundle\n")
        dropped += ["Pipe.app", "Sock.app", "Link.app", "File.app"]
        found, apps = check_apps(args, host, plugins, dropped, "after dropping %d bundles" % len(dropped))
        problems += found
        # Break some in place, the valid ones first: Info.plist swapped for a FIFO (the host
        # must not block on it).
        candidates = [n for n in dropped if os.path.isdir(os.path.join(plugins, n)) and not os.path.islink(os.path.join(plugins, n))]
        loaded = [n for n in candidates if os.path.join(plugins, n) in apps]
        others = [n for n in candidates if n not in loaded]
        print("breaking in place: loaded %s" % loaded)
        for name in loaded + rng.sample(others, max(0, min(len(others), 5 - len(loaded)))):
            plist = os.path.join(plugins, name, "Info.plist")
            if os.path.lexists(plist):
                if os.path.isdir(plist) and not os.path.islink(plist):
                    shutil.rmtree(plist)
                else:
                    os.unlink(plist)
            os.mkfifo(plist)
        problems += check_apps(args, host, plugins, dropped, "after swapping Info.plists for FIFOs")[0]
        if host.exited() is not None:
            problems.append("the host died (exit status %s)" % host.exited())
    except Exception as error:
        problems.append("host phase: %r" % error)
    finally:
        if problems:
            problems.append("host log:\n" + host.log_tail(20))
        host.stop()
        hc.kill_leftovers(hc.leftovers(host.sessions))
    for problem in problems:
        checker.fail(None, plugins, problem)


def check_apps(args, host, plugins, dropped, when):
    time.sleep(1.0)  # the watcher's debounce, and the rescan
    problems = []
    deadline = time.monotonic() + args.host_timeout
    while True:
        status, out, err = host.cli(["apps", "--json"], timeout=args.host_timeout)
        if status is None:
            return ["%s: bgtask apps --json hung (killed after %.0f s)" % (when, args.host_timeout)], {}
        if status != 0:
            return ["%s: bgtask apps --json exited %s: %s" % (when, status, err.strip()[:300])], {}
        try:
            body = json.loads(out)
        except ValueError:
            return ["%s: bgtask apps --json printed no JSON: %r" % (when, out[:200])], {}
        apps = {a["path"]: a["identifier"] for a in body.get("apps", [])}
        invalid = {b["path"]: b["error"] for b in body.get("invalid", [])}
        missing = [n for n in dropped if os.path.join(plugins, n) not in apps and os.path.join(plugins, n) not in invalid]
        feed = apps.get(os.path.join(plugins, "Feed.app")) == "com.example.feed"
        if (feed and not missing) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not feed:
        problems.append("%s: bgtask apps does not list the valid Feed.app (apps: %s)" % (when, sorted(apps.values())[:10]))
    if missing:
        problems.append("%s: %d dropped *.app entries are neither apps nor invalid: %s" % (when, len(missing), missing[:10]))
    for path, error in invalid.items():
        if path not in error:
            problems.append("%s: the invalid entry %s has an error that does not name it: %s" % (when, path, error[:200]))
    print("host %s: %d apps, %d invalid entries, %d dropped" % (when, len(apps), len(invalid), len(dropped)))
    answered = host.status_ok(args.host_timeout)
    if answered is not True:
        problems.append("%s: status: %s" % (when, answered))
    return problems, apps


def save_failures(args, checker, cases_by_bundle, template_lib):
    directory = hc.artifacts_dir(args.artifacts, "bundle-fuzz")
    replay = os.path.join(directory, "bundle-fuzz-replay.jsonl")
    with open(replay, "w") as f:
        f.write(json.dumps({"note": "bundle_fuzz.py seed %d: the failing cases (regenerated by --replay from seed and index)" % args.seed}) + "\n")
        for case, bundle, message in checker.failures:
            if case is None:
                continue
            index = cases_by_bundle.get(bundle)
            f.write(json.dumps({"seed": args.seed, "index": index, "case": case.describe(), "message": message}) + "\n")
            # The bundle itself, for a look with `bgtask validate` (special files as they were).
            target = os.path.join(directory, os.path.basename(bundle))
            if not os.path.exists(target):
                try:
                    build(case, directory, os.path.basename(bundle), template_lib, directory)
                except OSError:
                    pass
    print("failing cases saved for replay: %s (bundle_fuzz.py --replay %s); bundles in %s" % (replay, replay, directory))


def generate(args, base):
    rng = random.Random(args.seed)
    return [make_case(rng, base, i) for i in range(args.iterations)], rng


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bgtask", default=hc.default_bgtask(), help="the bgtask binary (default: .build/debug/bgtask); its plugin libraries are next to it")
    parser.add_argument("--iterations", type=int, default=2000, help="bundles to validate (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1): the same seed makes the same bundles")
    parser.add_argument("--duration", type=float, default=600, help="stop validating after this many seconds (default 600)")
    parser.add_argument("--timeout", type=float, default=10, help="seconds one bgtask validate may take (default 10)")
    parser.add_argument("--host-batch", type=int, default=60, help="bundles dropped into the running host (default 60; 0: no host phase)")
    parser.add_argument("--host-timeout", type=float, default=20, help="seconds bgtask apps may take (default 20)")
    parser.add_argument("--quick", action="store_true", help="a short run for CI: 250 bundles, a host batch of 20")
    parser.add_argument("--replay", metavar="FILE", help="validate the cases of a saved replay file again (regenerated from their seed and index)")
    parser.add_argument("--artifacts", metavar="DIR", help="where a failure's replay file and bundles go (default: a new temporary directory, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.host_batch, args.duration = 250, 20, min(args.duration, 15)
    args.bgtask = os.path.abspath(args.bgtask)
    hc.check_build(args.bgtask, ["Feed", "FeedShare", "Counter"])
    hc.set_child_subreaper()
    started = time.monotonic()
    scratch = hc.Scratch("bundle-fuzz")
    checker = Checker(args)
    template_lib = hc.library(args.bgtask, "Counter")
    base = base_info()
    cases_by_bundle = {}
    validated = 0
    try:
        bundles = scratch.join("bundles")
        os.makedirs(bundles)
        if args.replay:
            entries = []
            with open(args.replay) as f:
                for line in f:
                    entry = json.loads(line)
                    if "index" in entry and entry["index"] is not None:
                        entries.append(entry)
            selected = []
            for entry in entries:
                rng = random.Random(entry["seed"])
                for i in range(entry["index"] + 1):
                    case = make_case(rng, base, i)
                selected.append((entry["index"], case))
            print("replaying %d cases from %s" % (len(selected), args.replay))
            host_rng = random.Random(args.seed)
        else:
            cases, host_rng = generate(args, base)
            selected = list(enumerate(cases))
        for index, case in selected:
            if time.monotonic() - started > args.duration:
                print("duration reached after %d bundles" % validated)
                break
            name = ("Case-%05d.appex" if case.appex else "Case-%05d.app") % index
            bundle = build(case, bundles, name, template_lib, scratch.path)
            cases_by_bundle[bundle] = index
            checker.validate(case, bundle)
            validated += 1
            # Bounded disk: the bundles of a few MiB go at once.
            if not checker.failures or checker.failures[-1][1] != bundle:
                shutil.rmtree(bundle, ignore_errors=True)
        if args.host_batch and not args.replay:
            batch = [case for _, case in selected if not case.name.startswith(("huge", "limit-100k"))][:args.host_batch]
            host_phase(args, batch, scratch, template_lib, checker, host_rng)
    except Exception as error:
        checker.fail(None, scratch.path, "tool error: %r" % error)
    elapsed = time.monotonic() - started
    for case, bundle, message in checker.failures[:30]:
        print("failure: %s%s: %s" % (case.name + " " if case else "", bundle, message))
    if checker.failures:
        save_failures(args, checker, cases_by_bundle, template_lib)
    slowest = max(checker.elapsed) if checker.elapsed else 0
    print("validated %d bundles: %d valid, %d invalid; slowest validate %.2f s" % (validated, checker.counts["valid"], checker.counts["invalid"], slowest))
    if args.keep:
        print("scratch kept: %s" % scratch.path)
    else:
        scratch.remove()
    verdict = "FAIL" if checker.failures else "PASS"
    print("%s bundle_fuzz: %d bundles, %d failures, seed %d, %.1f s" % (verdict, validated, len(checker.failures), args.seed, elapsed))
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
