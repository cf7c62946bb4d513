#!/usr/bin/env python3
"""One push written frame by frame, the way some HTTP/2 stacks write it and Apple's servers take
it: the header block split over HEADERS and two CONTINUATION frames, the authority as a `host`
header (no `:authority`), the regular headers in an unusual order (after the pseudo-headers, as
HTTP/2 requires). Prints the response's status, apns-id and whether a
DATA frame followed, as JSON.

    python raw_h2_push.py HOST PORT CA_FILE TOKEN TOPIC APNS_ID AUTHORIZATION

Driven by APNsInteropTests.swift; uses hpack (installed with h2 by scripts/install-test-deps.sh)."""
import json
import socket
import ssl
import struct
import sys

import hpack

host, port, ca, token, topic, apns_id, authorization = sys.argv[1:8]
context = ssl.create_default_context(cafile=ca)
context.set_alpn_protocols(["h2"])
connection = context.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


DATA, HEADERS, SETTINGS, CONTINUATION = 0x0, 0x1, 0x4, 0x9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
body = json.dumps({"aps": {"content-available": 1}, "episode": 140}).encode()
block = hpack.Encoder().encode([
    (":method", "POST"), (":scheme", "https"), (":path", f"/3/device/{token}"),
    ("apns-priority", "5"), ("authorization", authorization), ("apns-id", apns_id),
    ("host", f"{host}:{port}"), ("apns-push-type", "background"), ("apns-topic", topic),
    ("content-length", str(len(body))),
])
third = len(block) // 3
out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0)
out += frame(HEADERS, 0, 1, block[:third])
out += frame(CONTINUATION, 0, 1, block[third:2 * third])
out += frame(CONTINUATION, END_HEADERS, 1, block[2 * third:])
out += frame(DATA, END_STREAM, 1, body)
connection.sendall(out)

decoder = hpack.Decoder()
buffer = b""
answer = {"status": None, "apns_id": None, "headers_end_stream": None, "data_frames": 0, "goaway": False}
while True:
    try:
        chunk = connection.recv(65536)
    except socket.timeout:
        break
    if not chunk:
        break
    buffer += chunk
    done = False
    while len(buffer) >= 9:
        length = struct.unpack(">I", b"\0" + buffer[:3])[0]
        if len(buffer) < 9 + length:
            break
        kind, flags = buffer[3], buffer[4]
        stream = struct.unpack(">I", buffer[5:9])[0] & 0x7FFFFFFF
        payload = buffer[9:9 + length]
        buffer = buffer[9 + length:]
        if kind == SETTINGS and not flags & ACK:
            connection.sendall(frame(SETTINGS, ACK, 0))
        elif kind == 0x7:
            answer["goaway"] = True
            done = True
        elif kind == HEADERS and stream == 1:
            headers = dict((name.decode() if isinstance(name, bytes) else name, value.decode() if isinstance(value, bytes) else value)
                           for name, value in decoder.decode(payload))
            answer["status"] = int(headers.get(":status", 0))
            answer["apns_id"] = headers.get("apns-id")
            answer["headers_end_stream"] = bool(flags & END_STREAM)
            done = bool(flags & END_STREAM)
        elif kind == DATA and stream == 1:
            answer["data_frames"] += 1
            done = bool(flags & END_STREAM)
        elif kind == 0x3 and stream == 1:  # RST_STREAM
            answer["reset"] = struct.unpack(">I", payload)[0]
            done = True
    if done:
        break
print(json.dumps(answer))
