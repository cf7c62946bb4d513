#!/usr/bin/env bash
# Builds every example plugin and writes its bundle under OUT:
#   Examples/build.sh OUT            (debug build)
#   CONFIGURATION=release Examples/build.sh OUT
set -euo pipefail
out=${1:?usage: Examples/build.sh OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
configuration=${CONFIGURATION:-debug}
cd "$root"
swift build -c "$configuration" --product bgtask
swift build -c "$configuration" --product bgtask-runner
for plugin in Feed Counter; do
    swift build -c "$configuration" --product "$plugin"
done
bin=$(swift build -c "$configuration" --show-bin-path)
mkdir -p "$out"
for plugin in Feed Counter; do
    "$bin/bgtask" bundle --library "$bin/lib$plugin.so" --info "Plugins/$plugin/Info.plist" --output "$out/$plugin.app"
done
echo "bundles in $out; the CLI is $bin/bgtask"
