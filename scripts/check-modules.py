#!/usr/bin/env python3
"""The module boundaries as SwiftPM reads Package.swift (`swift package describe --type json`).

The compiler holds the modules apart once Package.swift declares them; this check keeps
Package.swift from quietly giving a module back what it must not see (the test kit the store,
the launch module the daemon), and keeps files and modules small enough to read:

  - what each module may reach, directly or through others (its transitive target and product
    dependencies), and what it may not;
  - no Swift file under Sources/ over 600 lines; no module of the host over 5,500 lines.

Usage: scripts/check-modules.py [DESCRIBE.json]   (runs `swift package describe` when not given)
Exit status 1 with every violation named when one is found.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# module: what it must never reach (targets or products, transitively).
FORBIDDEN = {
    "BGTaskControl": {"BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "BGTaskDashboard", "GRDB", "NIOCore", "NIOPosix", "AsyncHTTPClient", "Logging"},
    "BGTaskStore": {"BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "NIOCore", "AsyncHTTPClient"},
    "BGTaskLaunch": {"BGTaskStore", "BGTaskTransfers", "BGTaskHost", "GRDB", "NIOCore", "AsyncHTTPClient"},
    "BGTaskTransfers": {"BGTaskHost"},
    # The dashboard reads the host only through its answers: no store, no launches, no daemon.
    "BGTaskDashboard": {"BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "GRDB"},
    # App developers' tests: the protocol and its client, never the daemon's store or network stack.
    "BackgroundTasksTestKit": {"BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "BGTaskDashboard", "Hummingbird", "GRDB", "NIOCore", "NIOPosix", "NIOHTTP2", "AsyncHTTPClient", "Crypto"},
    # The child process and the SDK: nothing of the host.
    "bgtask-runner": {"BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "GRDB", "NIOCore", "Logging"},
    "BackgroundTasks": {"BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskHost", "BGTaskModel", "GRDB", "NIOCore", "Logging"},
}
HOST_MODULES = ["BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskDashboard", "BGTaskHost"]
FILE_LINES, MODULE_LINES = 600, 5500


def main():
    if len(sys.argv) > 1:
        describe = json.load(open(sys.argv[1]))
    else:
        out = subprocess.run(["swift", "package", "describe", "--type", "json"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        describe = json.loads(out)
    targets = {t["name"]: t for t in describe["targets"]}
    problems = []

    def reach(name, seen=None):
        seen = set() if seen is None else seen
        target = targets.get(name)
        if target is None:
            return seen
        for dep in target.get("target_dependencies", []) + target.get("product_dependencies", []):
            if dep not in seen:
                seen.add(dep)
                reach(dep, seen)
        return seen

    for module, forbidden in FORBIDDEN.items():
        if module not in targets:
            problems.append(f"Package.swift: no target {module}")
            continue
        bad = sorted(reach(module) & forbidden)
        if bad:
            problems.append(f"Package.swift: {module} reaches {', '.join(bad)}, which it must not")

    sizes = {}
    for directory, _, files in os.walk(os.path.join(ROOT, "Sources")):
        for name in files:
            if not name.endswith(".swift"):
                continue
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as handle:
                lines = sum(1 for _ in handle)
            rel = os.path.relpath(path, ROOT)
            if lines > FILE_LINES:
                problems.append(f"{rel}: {lines} lines, over {FILE_LINES}")
            module = rel.split(os.sep)[1]
            sizes[module] = sizes.get(module, 0) + lines
    for module in HOST_MODULES:
        print(f"{module:16s} {sizes.get(module, 0):6d} lines")
        if sizes.get(module, 0) > MODULE_LINES:
            problems.append(f"Sources/{module}: {sizes[module]} lines, over {MODULE_LINES}")

    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("module boundaries hold")


if __name__ == "__main__":
    main()
