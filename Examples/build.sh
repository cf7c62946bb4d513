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
for plugin in Feed FeedShare Counter; do
    swift build -c "$configuration" --product "$plugin"
done
bin=$(swift build -c "$configuration" --show-bin-path)
mkdir -p "$out"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
# Feed.app carries its share extension in PlugIns/Share.appex.
"$bin/bgtask" bundle --library "$bin/libFeedShare.so" --info Plugins/FeedShare/Info.plist --output "$staging/Share.appex"
"$bin/bgtask" bundle --library "$bin/libFeed.so" --info Plugins/Feed/Info.plist --extension "$staging/Share.appex" --output "$out/Feed.app"
"$bin/bgtask" bundle --library "$bin/libCounter.so" --info Plugins/Counter/Info.plist --output "$out/Counter.app"
echo "bundles in $out; the CLI is $bin/bgtask"
