#!/usr/bin/env bash
# Builds bgtask (release) and installs it as a systemd service: the `bgtask` CLI and its
# `bgtask-runner` side by side in PREFIX/bin, stripped (the CLI finds the runner next to itself), shell
# completions for bash, zsh and fish and the man page bgtask(1) (both generated from the
# commands by swift-argument-parser: the completions by `bgtask --generate-completion-script`,
# the page by its generate-manual tool), the README (the unit's documentation), BENCHMARKS.md
# and the pages of docs/ it links to, the unit file with its paths rewritten to PREFIX, and the
# state and plugin directories. `--uninstall` removes what it installs, except the state
# directory. See docs/install.md; the unit: docs/host.md, "Running as a service". The Makefile's
# install and uninstall targets call this script.
#
# The binaries load the Swift runtime from where the toolchain that built them keeps it (their
# RUNPATH); plugins need that runtime too, so install on a machine with the same toolchain.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: Packaging/install.sh [--prefix DIR] [--user] [--destdir DIR] [--print] [--no-build] [--build-dir DIR] [--no-strip] [--uninstall]

  --prefix DIR     where the binaries go (DIR/bin) and the docs (DIR/share/doc/bgtask);
                   default /usr/local, or ~/.local with --user
  --user           install the user unit (~/.config/systemd/user/bgtask.service, for
                   systemctl --user) and ~/.local/state/bgtask, instead of the system unit
                   (/etc/systemd/system/bgtask.service) and /var/lib/bgtask
  --destdir DIR    stage every file under DIR (for packaging), leaving systemd alone;
                   default $DESTDIR
  --print          print the commands instead of running them (a dry run: nothing is built,
                   written or reloaded)
  --no-build       install what is already built instead of running swift build
  --build-dir DIR  where the built bgtask, bgtask-runner and generate-manual are;
                   default .build/release
  --no-strip       install the binaries as built, with their symbols and debug
                   information (by default they are stripped, `install -s`: a fraction of
                   the size; the unstripped ones stay in the build directory)
  --uninstall      remove what an install with the same --prefix/--user/--destdir put in
                   place (after systemctl disable --now bgtask, without --destdir), keeping
                   the state directory: its requests, records, containers and plugins

Then: systemctl enable --now bgtask (with --user: systemctl --user enable --now bgtask).
Completions go in PREFIX/share/{bash-completion/completions,zsh/site-functions,
fish/vendor_completions.d}, the man page in PREFIX/share/man/man1.
EOF
}

# Builtins only until a command is run: with --print nothing outside bash is ever executed.
case "$0" in
    */*) script_dir=${0%/*} ;;
    *) script_dir=. ;;
esac
repo=$(cd "$script_dir/.." && pwd)
prefix=""
user=0
print=0
build=1
build_dir=""
destdir="${DESTDIR:-}"
uninstall=0
strip=(-s)

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { usage >&2; exit 64; }; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --user) user=1; shift ;;
        --destdir) [ $# -ge 2 ] || { usage >&2; exit 64; }; destdir=$2; shift 2 ;;
        --destdir=*) destdir=${1#*=}; shift ;;
        --print|--dry-run) print=1; shift ;;
        --no-build) build=0; shift ;;
        --build-dir) [ $# -ge 2 ] || { usage >&2; exit 64; }; build_dir=$2; shift 2 ;;
        --build-dir=*) build_dir=${1#*=}; shift ;;
        --no-strip) strip=(); shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 64 ;;
    esac
done

if [ "$user" = 1 ]; then
    : "${HOME:?install.sh --user: HOME is not set}"
    prefix=${prefix:-$HOME/.local}
    unit_source=$repo/Packaging/systemd/user/bgtask.service
    unit_dir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user
    # The unit's state directory (%h/.local/state/bgtask): the CLI's default when
    # XDG_STATE_HOME is unset.
    state_dir=$HOME/.local/state/bgtask
    exec_prefix='%h/.local'
    systemctl=(systemctl --user)
    journalctl="journalctl --user -u bgtask"
else
    prefix=${prefix:-/usr/local}
    unit_source=$repo/Packaging/systemd/bgtask.service
    unit_dir=/etc/systemd/system
    state_dir=/var/lib/bgtask
    exec_prefix='/usr/local'
    systemctl=(systemctl)
    journalctl="journalctl -u bgtask"
fi
case "$prefix" in
    /*) ;;
    *) echo "install.sh: --prefix must be an absolute path, not '$prefix'" >&2; exit 64 ;;
esac
# The prefix goes into ExecStart= and a sed expression: no whitespace, no '|', no '\'.
case "$prefix" in
    *[[:space:]\|\\]*) echo "install.sh: --prefix '$prefix' has whitespace, '|' or '\\' (systemd's ExecStart= would need quoting)" >&2; exit 64 ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/
if [ -n "$destdir" ]; then
    case "$destdir" in
        /*) ;;
        *) destdir=$(pwd)/$destdir ;;
    esac
    destdir=${destdir%/}
fi
build_dir=${build_dir:-$repo/.build/release}
bin_dir=$prefix/bin
doc_dir=$prefix/share/doc/bgtask
# Where bash-completion, zsh and fish look for completions under a prefix (for ~/.local:
# ${XDG_DATA_HOME:-~/.local/share}, which bash-completion and fish search; zsh needs the
# directory in its fpath), and man-db for pages (PREFIX/share/man for PREFIX/bin in PATH).
bash_completion=$prefix/share/bash-completion/completions/bgtask
zsh_completion=$prefix/share/zsh/site-functions/_bgtask
fish_completion=$prefix/share/fish/vendor_completions.d/bgtask.fish
man_dir=$prefix/share/man/man1

# Prints its arguments as one shell command line: plain words as they are, others in single
# quotes (what --print shows can be pasted into a shell).
quote() {
    local separator="" word
    for word in "$@"; do
        if [[ "$word" =~ ^[A-Za-z0-9_./=:%@+,-]+$ ]]; then
            printf '%s%s' "$separator" "$word"
        else
            printf "%s'%s'" "$separator" "${word//\'/\'\\\'\'}"
        fi
        separator=" "
    done
}

# Runs a command, or prints it with --print.
run() {
    if [ "$print" = 1 ]; then
        quote "$@"; printf '\n'
    else
        "$@"
    fi
}

# Runs a command with its output into a file, or prints it with --print.
run_into() {
    local out=$1; shift
    if [ "$print" = 1 ]; then
        quote "$@"; printf ' > '; quote "$out"; printf '\n'
    else
        "$@" > "$out"
    fi
}

# systemd is there to be told (not for a staged install).
live_systemd() {
    [ -z "$destdir" ] && { [ "$print" = 1 ] || { command -v systemctl >/dev/null && [ -d /run/systemd/system ]; }; }
}

if [ "$uninstall" = 1 ]; then
    if live_systemd; then
        # Stopped like a `systemctl stop` (launches expired, recorded); not an error when the
        # unit was never enabled or is already gone.
        if [ "$print" = 1 ]; then
            quote "${systemctl[@]}" disable --now bgtask; printf ' || true\n'
        else
            "${systemctl[@]}" disable --now bgtask || true
        fi
    fi
    run rm -f "$destdir$bin_dir/bgtask" "$destdir$bin_dir/bgtask-runner" \
        "$destdir$bash_completion" "$destdir$zsh_completion" "$destdir$fish_completion" \
        "$destdir$man_dir/bgtask.1" "$destdir$unit_dir/bgtask.service"
    run rm -rf "$destdir$doc_dir"
    if live_systemd; then run "${systemctl[@]}" daemon-reload; fi
    if [ "$print" = 0 ]; then
        echo "removed bgtask from $destdir$prefix and $destdir$unit_dir/bgtask.service; kept $destdir$state_dir (requests, records, app containers, plugins): remove it yourself to have them gone" >&2
    fi
    exit 0
fi

if [ "$build" = 1 ]; then
    run swift build -c release --package-path "$repo" --product bgtask
    run swift build -c release --package-path "$repo" --product bgtask-runner
    # swift-argument-parser's man page generator (a tool of the package, built from the local
    # checkout: no network).
    run swift build -c release --package-path "$repo" --product generate-manual
fi
if [ "$print" = 0 ]; then
    for binary in bgtask bgtask-runner; do
        [ -x "$build_dir/$binary" ] || { echo "install.sh: $build_dir/$binary is not built (run without --no-build, or pass --build-dir)" >&2; exit 1; }
    done
fi

run install -d -m 0755 "$destdir$bin_dir"
# Stripped (`install -s`): symbol tables and debug information are three quarters of a release
# build's size and only a debugger needs them; it has the unstripped binaries the build
# directory keeps. The dynamic symbols the binaries run with stay.
run install "${strip[@]}" -m 0755 "$build_dir/bgtask" "$destdir$bin_dir/bgtask"
run install "${strip[@]}" -m 0755 "$build_dir/bgtask-runner" "$destdir$bin_dir/bgtask-runner"
# Completions and the man page, generated from the commands by the binary just installed.
for file in "$bash_completion" "$zsh_completion" "$fish_completion"; do
    run install -d -m 0755 "$destdir${file%/*}"
done
run_into "$destdir$bash_completion" "$build_dir/bgtask" --generate-completion-script bash
run_into "$destdir$zsh_completion" "$build_dir/bgtask" --generate-completion-script zsh
run_into "$destdir$fish_completion" "$build_dir/bgtask" --generate-completion-script fish
run chmod 0644 "$destdir$bash_completion" "$destdir$zsh_completion" "$destdir$fish_completion"
if [ "$print" = 1 ] || [ -x "$build_dir/generate-manual" ]; then
    run install -d -m 0755 "$destdir$man_dir"
    # Writes bgtask.1: every command, option and argument with its help, in mdoc.
    run "$build_dir/generate-manual" "$build_dir/bgtask" --output-directory "$destdir$man_dir"
    run chmod 0644 "$destdir$man_dir/bgtask.1"
else
    echo "install.sh: no man page: $build_dir/generate-manual is not built (swift build -c release --product generate-manual, or install without --no-build)" >&2
fi

run install -d -m 0755 "$destdir$doc_dir"
run install -m 0644 "$repo/README.md" "$destdir$doc_dir/README.md"
run install -m 0644 "$repo/BENCHMARKS.md" "$destdir$doc_dir/BENCHMARKS.md"
# The pages the README links to, at the same relative paths.
run install -d -m 0755 "$destdir$doc_dir/docs"
for page in "$repo"/docs/*.md; do
    if [ -f "$page" ]; then run install -m 0644 "$page" "$destdir$doc_dir/docs/${page##*/}"; fi
done

# The unit, with ExecStart= and Documentation= pointing into the prefix.
run install -d -m 0755 "$destdir$unit_dir"
run_into "$destdir$unit_dir/bgtask.service" sed \
    -e "s|^ExecStart=$exec_prefix/bin/bgtask |ExecStart=$bin_dir/bgtask |" \
    -e "s|^Documentation=file:///usr/local/share/doc/bgtask/|Documentation=file://$doc_dir/|" \
    "$unit_source"
run chmod 0644 "$destdir$unit_dir/bgtask.service"

# The state directory (the database, the control socket, containers, logs): owner-only for a
# user unit; traversable by others for the system unit, whose apps run as their own uids and
# pass through it to their containers (what is inside stays owner-only). And the plugin
# directory the unit reads bundles from.
state_mode=0711
[ "$user" = 1 ] && state_mode=0700
run install -d -m "$state_mode" "$destdir$state_dir"
run install -d -m 0755 "$destdir$state_dir/plugins"

if [ -z "$destdir" ]; then
    if live_systemd; then
        run "${systemctl[@]}" daemon-reload
    else
        echo "install.sh: systemd is not running here: run '${systemctl[*]} daemon-reload' where it is" >&2
    fi
fi

next="${systemctl[*]} enable --now bgtask; logs: $journalctl"
if [ "$print" = 1 ]; then
    echo "# then: $next"
else
    echo "installed bgtask in $bin_dir and $destdir$unit_dir/bgtask.service; plugins go in $state_dir/plugins" >&2
    echo "start it: $next" >&2
fi
