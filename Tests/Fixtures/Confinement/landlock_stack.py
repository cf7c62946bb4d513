#!/usr/bin/env python3
"""Runs a command with Landlock's stack of domains already full, so that no process it starts
can add one more: a launch's own Landlock domain then fails to apply for a real reason (the
kernel's E2BIG at landlock_restrict_self), which is how the tests see confinement fail closed.

    landlock_stack.py COMMAND [ARG...]

Each of the 16 domains (the kernel's most, LANDLOCK_MAX_NUM_LAYERS) handles only the right to
make block devices, so the command itself is otherwise unhindered. Python's standard library
only (ctypes); x86-64 and aarch64 share Landlock's system-call numbers."""

import ctypes
import os
import sys

SYS_CREATE_RULESET, SYS_RESTRICT_SELF = 444, 446
ACCESS_FS_MAKE_BLOCK = 1 << 11
MAX_LAYERS = 16
PR_SET_NO_NEW_PRIVS = 38


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"landlock_stack: prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    attr = RulesetAttr(ACCESS_FS_MAKE_BLOCK)
    for layer in range(MAX_LAYERS):
        fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
        if fd < 0:
            sys.exit(f"landlock_stack: create_ruleset: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(SYS_RESTRICT_SELF, fd, 0) != 0:
            sys.exit(f"landlock_stack: restrict_self (layer {layer + 1}): {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
