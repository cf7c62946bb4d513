#!/usr/bin/env python3
"""Sends pushes to a bgtask host's APNs endpoint through a real APNs provider library from PyPI,
as a provider's server would send them to Apple: token auth (ES256 JWT), TLS, HTTP/2.

Driven by APNsInteropTests.swift, with the venv of scripts/install-test-deps.sh:

    /opt/bgtask-test-venv/bin/python apns_provider.py LIBRARY SPEC.json

LIBRARY is aioapns, kalyke (kalyke-apns, httpx2) or pyapns_client (httpx). The spec:

    {"host": "127.0.0.1", "port": 8443, "ca": "/path/ca.pem",
     "requests": [{"token": "...", "topic": "com.example.pushapp", "payload": {...},
                   "apns_id": "... or absent", "key": "/path/AuthKey.p8", "key_id": "ABC123DEFG",
                   "team": "TEAM123456", "push_type": "background", "priority": 5}, ...]}

Prints one JSON object a line, one per request, in order:
    {"status": 200 or null, "reason": "BadDeviceToken" or null, "apns_id": "..." or null,
     "error": "what went wrong outside APNs's answers" or null}

Only the library's public entry points are used; where a library does not let its caller point it
at another server (kalyke's base URL, pyapns_client's URLs) or see the response's apns-id
(pyapns_client), a subclass overrides that one attribute or wraps that one call.
"""

import asyncio
import json
import os
import ssl
import sys


def result(status=None, reason=None, apns_id=None, error=None):
    return {"status": status, "reason": reason, "apns_id": apns_id, "error": error}


async def send_aioapns(spec):
    from aioapns import APNs, NotificationRequest, PushType
    from aioapns.connection import APNsProductionClientProtocol

    # Where the library connects, and what it sends as the `host` header.
    APNsProductionClientProtocol.APNS_SERVER = spec["host"]
    APNsProductionClientProtocol.APNS_PORT = spec["port"]
    context = ssl.create_default_context(cafile=spec["ca"])
    clients = {}
    results = []
    for request in spec["requests"]:
        credentials = (request["key"], request["key_id"], request["team"])
        if credentials not in clients:
            with open(request["key"]) as file:
                key = file.read()
            clients[credentials] = APNs(key=key, key_id=request["key_id"], team_id=request["team"],
                                        topic=request["topic"], use_sandbox=False, ssl_context=context,
                                        max_connection_attempts=1)
        notification = NotificationRequest(
            device_token=request["token"], message=request["payload"],
            notification_id=request.get("apns_id"), priority=request.get("priority"),
            push_type=PushType(request.get("push_type", "background")), apns_topic=request["topic"])
        try:
            answer = await asyncio.wait_for(clients[credentials].send_notification(notification), 20)
            results.append(result(int(answer.status), answer.description or None, answer.notification_id))
        except Exception as error:  # the library's own failure: reported, not raised
            results.append(result(error=f"{type(error).__name__}: {error}"))
    return results


async def send_kalyke(spec):
    from kalyke import ApnsClient, ApnsConfig, ApnsPriority, ApnsPushType
    from kalyke.exceptions import ApnsProviderException

    base_url = f"https://{spec['host']}:{spec['port']}"

    class HostClient(ApnsClient):
        @property
        def _base_url(self):
            return base_url

    # httpx2 trusts SSL_CERT_FILE (the test's CA) for its default context.
    os.environ["SSL_CERT_FILE"] = spec["ca"]
    results = []
    for request in spec["requests"]:
        client = HostClient(use_sandbox=False, team_id=request["team"], auth_key_id=request["key_id"],
                            auth_key_filepath=request["key"])
        config = ApnsConfig(topic=request["topic"], push_type=ApnsPushType(request.get("push_type", "background")),
                            identifier=request.get("apns_id"), priority=ApnsPriority(request.get("priority", 5)))
        try:
            apns_id = await asyncio.wait_for(client.send_message(device_token=request["token"], payload=request["payload"],
                                                                 apns_config=config), 20)
            results.append(result(200, None, apns_id))
        except ApnsProviderException as error:  # APNs's refusal, as the library names it
            results.append(result(None, type(error).__name__, None))
        except Exception as error:
            results.append(result(error=f"{type(error).__name__}: {error}"))
    return results


def send_pyapns_client(spec):
    from pyapns_client import APNSClient, IOSNotification, IOSPayload
    from pyapns_client import exceptions

    class HostClient(APNSClient):
        BASE_URLS = {"bgtask": f"https://{spec['host']}:{spec['port']}"}

        def _send_request(self, headers, json_data, device_token):
            # The library's own request; the response kept so the caller sees its apns-id.
            self.last_response = super()._send_request(headers, json_data, device_token)
            return self.last_response

    results = []
    for request in spec["requests"]:
        client = HostClient(mode="bgtask", root_cert_path=spec["ca"], auth_key_path=request["key"],
                            auth_key_id=request["key_id"], team_id=request["team"])
        payload = dict(request["payload"])
        aps = payload.pop("aps", {})
        notification = IOSNotification(
            payload=IOSPayload(content_available=bool(aps.get("content-available")), custom=payload or None),
            topic=request["topic"], apns_id=request.get("apns_id"), priority=str(request.get("priority", 5)),
            push_type=request.get("push_type", "background"))
        try:
            client.push(notification=notification, device_token=request["token"])
            response = client.last_response
            results.append(result(response.status_code, None, response.headers.get("apns-id")))
        except exceptions.APNSConnectionException as error:
            results.append(result(error=f"{type(error).__name__}: connection failed"))
        except exceptions.APNSException as error:
            reason = type(error).__name__.removesuffix("Exception")
            results.append(result(error.status_code, reason, error.apns_id))
        except Exception as error:
            results.append(result(error=f"{type(error).__name__}: {error}"))
        finally:
            client.close()
    return results


def main():
    library = sys.argv[1]
    with open(sys.argv[2]) as file:
        spec = json.load(file)
    if library == "aioapns":
        results = asyncio.run(send_aioapns(spec))
    elif library == "kalyke":
        results = asyncio.run(send_kalyke(spec))
    elif library == "pyapns_client":
        results = send_pyapns_client(spec)
    else:
        sys.exit(f"unknown library {library}: aioapns, kalyke or pyapns_client")
    for line in results:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
