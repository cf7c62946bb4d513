#!/usr/bin/env python3
"""Opens one HTTP/2 connection to a bgtask host's APNs endpoint over TLS (ALPN h2), sends the
client preface and SETTINGS, and waits for the host to close it. Mode `idle` opens no stream;
mode `stalled` opens one (HEADERS without END_STREAM) and never ends it. Prints JSON: after how
many seconds the stream was reset (`reset`, RST_STREAM on stream 1) and the connection closed
(`closed`), null for what did not happen within LIMIT seconds.

    python idle_connection.py HOST PORT CA_FILE LIMIT_SECONDS [idle|stalled]

Driven by APNsInteropTests.swift (the idle and request timeouts)."""
import json
import socket
import ssl
import struct
import sys
import time

host, port, ca, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "idle"
context = ssl.create_default_context(cafile=ca)
context.set_alpn_protocols(["h2"])
raw = socket.create_connection((host, port), timeout=limit)
connection = context.wrap_socket(raw, server_hostname=host)
assert connection.selected_alpn_protocol() == "h2", connection.selected_alpn_protocol()


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


start = time.monotonic()
# The client preface, then an empty SETTINGS frame.
out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(0x4, 0, 0)
if mode == "stalled":
    import hpack
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "https"), (":path", "/3/device/" + "0" * 64),
                                    (":authority", host)])
    out += frame(0x1, 0x4, 1, block)  # HEADERS, END_HEADERS, no END_STREAM: the request never ends
connection.sendall(out)
connection.settimeout(0.2)
answer = {"reset": None, "closed": None}
buffer = b""
while time.monotonic() - start < limit:
    try:
        data = connection.recv(65536)
    except socket.timeout:
        continue
    except (ssl.SSLError, OSError):
        data = b""
    if not data:
        answer["closed"] = round(time.monotonic() - start, 2)
        break
    buffer += data
    while len(buffer) >= 9:
        length = struct.unpack(">I", b"\0" + buffer[:3])[0]
        if len(buffer) < 9 + length:
            break
        kind, stream = buffer[3], struct.unpack(">I", buffer[5:9])[0] & 0x7FFFFFFF
        if kind == 0x3 and stream == 1 and answer["reset"] is None:
            answer["reset"] = round(time.monotonic() - start, 2)
        buffer = buffer[9 + length:]
print(json.dumps(answer))
