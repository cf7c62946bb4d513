#!/usr/bin/env bash
# Installs what the test suite drives besides the package itself: real APNs provider client
# libraries from PyPI, in a venv at a fixed path the tests look for (APNsInteropTests.swift).
# Idempotent and quiet: a venv that already has every library at its pinned version is left as is.
#   aioapns       asyncio + h2 (sends the authority as a `host` header, JWT iat a number)
#   kalyke-apns   httpx2 over HTTP/2 (JWT iat a numeric string)
#   pyapns_client httpx over HTTP/2, synchronous
# and what the dashboard's tests drive (DashboardTests.swift):
#   selenium         drives Debian's chromium (headless) through chromium-driver
#   prometheus_client  its parser reads /metrics
# Called by .ci/run; run it by hand (as root) before `swift test` on a new machine.
set -euo pipefail
venv="${BGTASK_TEST_VENV:-/opt/bgtask-test-venv}"
requirements=(aioapns==4.0 kalyke-apns==1.5.0 pyapns_client==2.0.6 selenium==4.51.0 prometheus_client==0.26.0)
stamp="$venv/.bgtask-requirements"
wanted="$(printf '%s\n' "${requirements[@]}")"
# A real browser for the dashboard's tests, from Debian.
browser=()
for package in chromium chromium-driver; do
    dpkg -s "$package" >/dev/null 2>&1 || browser+=("$package")
done
if [ ${#browser[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${browser[@]}" >/dev/null
fi
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    exit 0
fi
python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}"
printf '%s\n' "$wanted" > "$stamp"
