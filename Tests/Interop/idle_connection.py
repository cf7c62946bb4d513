#!/usr/bin/env python3
"""Opens one HTTP/2 connection to a bgtask host's APNs endpoint over TLS (ALPN h2), sends the
client preface and SETTINGS, opens no stream, and waits for the host to close it.
Prints the seconds it stayed open, or "open" if it still was after LIMIT seconds.

    python idle_connection.py HOST PORT CA_FILE LIMIT_SECONDS

Driven by APNsInteropTests.swift (the idle timeout)."""
import socket
import ssl
import sys
import time

host, port, ca, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
context = ssl.create_default_context(cafile=ca)
context.set_alpn_protocols(["h2"])
raw = socket.create_connection((host, port), timeout=limit)
connection = context.wrap_socket(raw, server_hostname=host)
assert connection.selected_alpn_protocol() == "h2", connection.selected_alpn_protocol()
start = time.monotonic()
# The client preface, then an empty SETTINGS frame (length 0, type 4, flags 0, stream 0).
connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
connection.settimeout(0.2)
while time.monotonic() - start < limit:
    try:
        data = connection.recv(65536)
    except socket.timeout:
        continue
    except (ssl.SSLError, OSError):
        data = b""
    if not data:
        print(f"{time.monotonic() - start:.2f}")
        sys.exit(0)
print("open")
