#!/usr/bin/env bash
# The product's main job, on the examples: builds them (Examples/build.sh) into DIR/plugins,
# starts `bgtask host` over that plugin directory with a virtual clock, then does to each app
# what its user, its server and time would do, printing every launch's record, and what the
# app printed, as the launch ends. It ends by itself in about a minute (the first build of the
# package takes longer), or on Ctrl-C; either way the host is stopped.
#
#   Examples/tour.sh DIR     DIR: plugins/, state/ (the host's) and host.log, remade each run
#
# No network is needed: the download example fetches from a web server the tour starts on
# 127.0.0.1 (python3's http.server; without python3 that step is skipped). The host and the
# server each run in a process group of their own, which the tour kills and reaps at the end.
set -euo pipefail

dir=${1:?usage: Examples/tour.sh DIR (made for the tour; remade on each run)}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$dir" in /*) ;; *) dir=$(pwd)/$dir ;; esac
if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] && [ ! -e "$dir/.bgtask-tour" ]; then
    echo "tour.sh: $dir is not empty and not a tour's directory: name a new one" >&2
    exit 64
fi
mkdir -p "$dir"
touch "$dir/.bgtask-tour"
rm -rf "$dir/state" "$dir/www" "$dir/host.log" "$dir/seen"

host_pid=""
server_pid=""
# Stops a process group: SIGTERM to its leader (the host then ends its launches and records
# them), up to 10 s to end, then SIGKILL to whatever is left of the group, and reaped.
stop_group() {
    local pid=$1 waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 100 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$host_pid" ]; then stop_group "$host_pid"; echo "tour: stopped the host (its log: $dir/host.log)"; fi
    if [ -n "$server_pid" ]; then stop_group "$server_pid"; fi
}
trap cleanup EXIT
trap 'echo; echo "tour: interrupted"; cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

echo "tour: building the examples into $dir/plugins (log: $dir/build.log; the package's first build takes ~15 minutes)"
if ! "$root/Examples/build.sh" "$dir/plugins" > "$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log" >&2
    echo "tour: the build failed (log: $dir/build.log)" >&2
    exit 1
fi
bgtask=$(cd "$root" && swift build --show-bin-path)/bgtask
export BGTASK_STATE=$dir/state

# Prints a command as it could be typed (arguments with spaces or quotes in single quotes),
# then runs it: `show --quiet ...` without its output, `show --grep RE ...` with its lines
# that match RE.
show() {
    local mode="" pattern="" word line="\$ bgtask"
    case "$1" in
        --quiet) mode=quiet; shift ;;
        --grep) mode=grep; pattern=$2; shift 2 ;;
    esac
    for word in "$@"; do
        if [[ "$word" =~ ^[A-Za-z0-9_./=:+@,-]+$ ]]; then line+=" $word"; else line+=" '${word//\'/\'\\\'\'}'"; fi
    done
    printf '%s\n' "$line"
    case "$mode" in
        quiet) "$bgtask" "$@" > /dev/null ;;
        grep) "$bgtask" "$@" | grep -E "$pattern" ;;
        *) "$bgtask" "$@" ;;
    esac
}

section() { printf '\n== %s\n' "$*"; }

# Waits (at most 30 s) until `count` launches have ended since the last call, then prints
# their records, oldest first, each followed by what the app printed (its launch log).
touch "$dir/seen"
records() {
    local count=$1 deadline=$((SECONDS + 30)) history ids id log
    while :; do
        history=$("$bgtask" history --limit 50)
        ids=$(printf '%s\n' "$history" | awk -v seen="$dir/seen" '
            BEGIN { while ((getline id < seen) > 0) printed[id] = 1 }
            /^launch / && !($2 in printed) { print $2 }')
        if [ "$(printf '%s' "$ids" | grep -c .)" -ge "$count" ]; then break; fi
        if [ "$SECONDS" -ge "$deadline" ]; then echo "tour: waited 30 s for $count launch(es) to end"; break; fi
        sleep 0.2
    done
    # `history` lists the newest first.
    for id in $(printf '%s\n' "$ids" | tac); do
        printf '%s\n' "$history" | awk -v id="$id" '/^launch / { on = ($2 == id) } on'
        log=$(printf '%s\n' "$history" | awk -v id="$id" '/^launch / { on = ($2 == id) } on && $1 == "log:" { print $2 }')
        if [ -n "$log" ] && [ -r "$log" ]; then grep -v '^\[bgtask launch\]' "$log" | sed 's/^/  | /'; fi
        echo "$id" >> "$dir/seen"
    done
}

# The download example's server: a directory with an "episode", served on a free port of
# 127.0.0.1, written into the example's Info.plist (EpisodeURL) before the host loads it.
if command -v python3 >/dev/null; then
    mkdir -p "$dir/www"
    head -c 3000000 /dev/urandom > "$dir/www/episode-42.mp3"
    # http.server on a port the kernel picks, ending with this script however it ends
    # (PR_SET_PDEATHSIG), in a process group of its own.
    setsid python3 -u -c 'import ctypes, runpy, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM)
sys.argv = ["http.server", "0", "--bind", "127.0.0.1", "--directory", sys.argv[1]]
runpy.run_module("http.server", run_name="__main__")' "$dir/www" > "$dir/www.log" 2>&1 &
    server_pid=$!
    port=""
    for _ in $(seq 50); do
        port=$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$dir/www.log" | head -n 1)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$dir/www.log" >&2; echo "tour: the web server did not start" >&2; exit 1; }
    sed -i "s|http://127.0.0.1:[0-9]*/|http://127.0.0.1:$port/|" "$dir/plugins/Episodes.app/Info.plist"
fi

# The host, in a process group of its own; it also ends if this script is killed.
BGTASK_EXIT_WITH_PARENT=$$ setsid "$bgtask" host --plugins "$dir/plugins" --clock virtual --policy immediate > "$dir/host.log" 2>&1 &
host_pid=$!
for _ in $(seq 150); do
    "$bgtask" apps > /dev/null 2>&1 && break
    kill -0 "$host_pid" 2>/dev/null || { cat "$dir/host.log" >&2; echo "tour: the host did not start" >&2; exit 1; }
    sleep 0.2
done
section "A host over $dir/plugins (virtual clock; every command below talks to it)"
show --grep '^com\.' apps
# A phone on its charger, on Wi-Fi: this machine may have neither a battery nor a network.
show --quiet device --power on --network on

section "Feed: a refresh task, due in 15 minutes, then a processing task (BGAppRefreshTask, BGProcessingTask)"
show submit com.example.feed com.example.feed.refresh --earliest +15m
show why com.example.feed.refresh
show clock advance 15m
records 1
show submit com.example.feed com.example.feed.cleanup --type processing --requires-power
records 1

section "Export: continued processing with progress (BGContinuedProcessingTask); the user opens the app and taps Export"
show open com.example.export
show progress --wait 10s
records 1

section "Notes: background time to save a note when the user leaves the app (beginBackgroundTask)"
show open com.example.notes
records 1

section "Weather: a refresh posts a local notification (UNUserNotificationCenter); the user allows notifications"
show --grep '^notifications' device --app com.example.weather --notifications on
show submit com.example.weather com.example.weather.refresh
records 1
show notifications com.example.weather

section "Mail: a background push from the mail server (didReceiveRemoteNotification:fetchCompletionHandler:)"
printf '%s\n' '{"aps": {"content-available": 1}, "mailbox": "INBOX"}' > "$dir/push.json"
show push com.example.mail "$dir/push.json"
records 1

section "Reader: its share extension and the app share an app group; the extension asks for a refresh"
# (its record is printed with the app's, below)
show --quiet extension run com.example.reader.share --event '{"url": "https://example.com/articles/swift-on-linux"}'
records 2

section "Episodes: a background download (URLSession background configuration), carried by the host"
if [ -n "$server_pid" ]; then
    # Offline at first: the host holds the download while the app is suspended.
    show --quiet device --network off
    show submit com.example.episodes com.example.episodes.refresh
    records 1
    show transfers com.example.episodes
    show --quiet device --network on
    records 1
else
    echo "(skipped: python3, which serves the download on 127.0.0.1, is not installed)"
fi

section "Done: the records are kept in $dir/state (bgtask log --state $dir/state reads the apps' logs)"
