#!/usr/bin/env bash
# Builds every example plugin and writes its bundle under OUT:
#   Examples/build.sh OUT            (debug build)
#   CONFIGURATION=release Examples/build.sh OUT
#
# One example per background API (the README's tour names each):
#   Feed.app      refresh and processing tasks (and an export), with its share extension
#   Export.app    continued processing, with progress
#   Notes.app     background time (beginBackgroundTask / endBackgroundTask)
#   Mail.app      background pushes (didReceiveRemoteNotification:fetchCompletionHandler:)
#   Episodes.app  background downloads (a background URLSession, handleEventsForBackgroundURLSession)
#   Weather.app   local notifications (UNUserNotificationCenter)
#   Reader.app    an app group shared with its share extension
#   Counter.app   a plugin written in C
set -euo pipefail
out=${1:?usage: Examples/build.sh OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
configuration=${CONFIGURATION:-debug}
cd "$root"
swift build -c "$configuration" --product bgtask
swift build -c "$configuration" --product bgtask-runner
apps=(Feed Export Notes Mail Episodes Weather Reader Counter)
extensions=(FeedShare ReaderShare)
for plugin in "${apps[@]}" "${extensions[@]}"; do
    swift build -c "$configuration" --product "$plugin"
done
bin=$(swift build -c "$configuration" --show-bin-path)
mkdir -p "$out"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
# An app's extensions go in its PlugIns/ (Feed.app/PlugIns/Share.appex).
mkdir -p "$staging/Feed" "$staging/Reader"
"$bin/bgtask" bundle --library "$bin/libFeedShare.so" --info Plugins/FeedShare/Info.plist --output "$staging/Feed/Share.appex"
"$bin/bgtask" bundle --library "$bin/libReaderShare.so" --info Plugins/ReaderShare/Info.plist --output "$staging/Reader/Share.appex"
for app in "${apps[@]}"; do
    extension=()
    [ -d "$staging/$app/Share.appex" ] && extension=(--extension "$staging/$app/Share.appex")
    # Replaced whole, as a host watching OUT expects (a bundle moved in, not edited in place).
    rm -rf "$staging/$app.app"
    "$bin/bgtask" bundle --library "$bin/lib$app.so" --info "Plugins/$app/Info.plist" "${extension[@]}" --output "$staging/$app.app"
    rm -rf "$out/$app.app"
    mv "$staging/$app.app" "$out/$app.app"
done
echo "bundles in $out: ${apps[*]/%/.app}; the CLI is $bin/bgtask"
