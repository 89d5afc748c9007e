# Shared by scripts/test, scripts/run and scripts/bench: sourced, not run.
# Installs the Debian packages that are missing, and builds.

IDEMPROXY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3 # Debian's interpreter: it sees python3-pytest and python3-redis

# ensure_packages PKG... installs the missing ones with apt-get (needs root or sudo).
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "==> installing missing packages: ${missing[*]}" >&2
    $sudo apt-get update -qq >&2 || { echo "apt-get update failed: can this machine reach Debian's mirrors?" >&2; return 1; }
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        { echo "apt-get install ${missing[*]} failed" >&2; return 1; }
}

# curl: the demo of scripts/run prints curl commands, and the integration suite runs them;
# libcjose-dev: bearer tokens verified for scope: jwt (doc/configuration.md, Scope).
BUILD_PACKAGES=(gcc pkg-config meson ninja-build python3 libmicrohttpd-dev libgnutls28-dev libcurl4-openssl-dev
    libhiredis-dev libjansson-dev libssl-dev libyaml-dev libpq-dev libhttp-parser-dev libcjose-dev
    curl)

# build DIR [meson options...] configures DIR (again from scratch when it was
# configured with other options or another compiler) and builds it: all of
# it, or the ninja targets BUILD_ONLY names.
build() {
    local dir=$1 want have
    shift
    want="${CC:+CC=$CC }meson setup $*"
    have=$(cat "$dir/.idemproxy-setup" 2>/dev/null || echo "an earlier version of this script")
    if [ -f "$dir/build.ninja" ] && [ "$want" != "$have" ]; then
        echo "==> $dir: set up again for '$want' (it was set up by '$have')" >&2
        rm -rf "$dir"
    fi
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$IDEMPROXY_ROOT" "$@" >"$dir.setup.log" 2>&1 ||
            { cat "$dir.setup.log" >&2; echo "meson setup $dir failed" >&2; return 1; }
        echo "$want" >"$dir/.idemproxy-setup"
    fi
    # shellcheck disable=SC2086 # BUILD_ONLY: a list of ninja targets
    ninja -C "$dir" ${BUILD_ONLY:-} >&2 || { echo "build in $dir failed" >&2; return 1; }
}

say() { echo "==> $*" >&2; }

# running PID succeeds while PID exists and has not exited (a zombie has).
# (Builtins only: a signal that reaches the script while it waits for a
# foreground child that then exits normally is dropped by bash, so the demo's
# polling loop must not run one: a Ctrl-C sent to scripts/run alone was lost.)
running() {
    local s
    { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
    s=${s##*) }
    [ "${s%% *}" != Z ]
}

# stop_pid PID SECONDS [NAME]: SIGTERM (an nginx master stops its workers),
# SIGKILL after SECONDS (saying so when NAME is given); returns the exit status
# of PID, a child of this shell.
stop_pid() {
    local pid=$1 secs=$2 name=${3:-} i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return; }
    for ((i = 0; i < secs * 10; i++)); do
        running "$pid" || break
        sleep 0.1
    done
    if running "$pid"; then
        [ -n "$name" ] && say "$name (pid $pid) did not stop within $secs s: killing it"
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
}

# free_port prints a TCP port that is free on 127.0.0.1 right now.
free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# port_is_free PORT succeeds when a server could listen on 127.0.0.1:PORT now.
port_is_free() {
    "$PY" - "$1" <<'PYEOF' 2>/dev/null
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no obstacle
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1)
PYEOF
}

# The libFuzzer targets of test/fuzz/ (scripts/fuzz, and a short run in scripts/test).
# libfuzzer-14-dev is Debian's libFuzzer; clang links the copy in libclang-rt-14-dev.
FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev libfuzzer-14-dev)
mapfile -t FUZZ_TARGETS <"$IDEMPROXY_ROOT/test/fuzz/targets.txt" # test/fuzz/meson.build reads it too

# build_fuzz DIR configures DIR once with clang-14, ASan+UBSan and the fuzz
# targets, and builds it. c_args instrument libidem for coverage as well.
build_fuzz() {
    CC=clang-14 build "$1" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
        -Dbuildtype=debugoptimized -Dc_args="-fsanitize=fuzzer-no-link"
}

# fuzz_max_len TARGET prints the longest input worth trying on TARGET.
fuzz_max_len() {
    case $1 in
    fuzz_idemkey) echo 1024 ;;  # a key is at most 255 bytes, plus scope lines
    fuzz_config) echo 2048 ;;   # a command line
    fuzz_target) echo 8192 ;;   # a long request target
    *) echo 16384 ;;            # header blocks and stored records
    esac
}

# run_fuzz DIR TARGET SECONDS runs the built TARGET of DIR over its seed corpus
# test/fuzz/corpus/TARGET (the regression cases), then fuzzes for SECONDS. New
# inputs go to DIR/corpus/TARGET (test/fuzz is only read), what fails to
# DIR/crashes/TARGET-*, the output to DIR/TARGET.log. Fails when TARGET found
# something (crash, sanitizer report, leak, timeout, failed check), printing
# the input and how to run it again.
run_fuzz() {
    local dir=$1 t=$2 secs=$3 exe work crashes log rc
    exe=$dir/test/fuzz/$t
    work=$dir/corpus/$t
    crashes=$dir/crashes
    log=$dir/$t.log
    [ -x "$exe" ] || { echo "$t: $exe is not built" >&2; return 1; }
    mkdir -p "$work" "$crashes"
    # UBSan only reports by default: make it fail the run.
    ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1" \
        timeout $((secs + 120)) "$exe" -max_total_time="$secs" -max_len="$(fuzz_max_len "$t")" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/$t-" \
        "$work" "$IDEMPROXY_ROOT/test/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "$t: clean, $(sed -n 's/^stat::number_of_executed_units: *//p' "$log") runs in $secs s," \
            "corpus $(find "$work" -type f | wc -l) inputs" >&2
        return 0
    fi
    local found
    found=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')
    echo "$t: FAILED (exit $rc); from $log:" >&2
    grep -E "ERROR|FUZZ_CHECK|SUMMARY|runtime error|==[0-9]+==" "$log" | head -20 >&2
    if [ -n "$found" ]; then
        echo "$t: input $found; run it again with: $exe $found" >&2
        echo "  (keep it as test/fuzz/corpus/$t/regress-<what> once fixed)" >&2
    fi
    return 1
}

# ensure_promtool sets PROMTOOL to Prometheus' promtool (contrib/prometheus'
# rules and contrib/grafana's queries are checked with it). It comes from
# Debian's prometheus package, which is downloaded and unpacked under
# build-tools/, not installed: installing it would start a Prometheus server.
ensure_promtool() {
    PROMTOOL=$(command -v promtool) && return 0
    local dir="$IDEMPROXY_ROOT/build-tools/prometheus" tmp
    PROMTOOL="$dir/usr/bin/promtool"
    [ -x "$PROMTOOL" ] && return 0
    say "downloading Debian's prometheus package for its promtool (unpacked in $dir, not installed)"
    tmp=$(mktemp -d) || return 1
    if ! { apt-get update -qq >&2 && (cd "$tmp" && apt-get download -qq prometheus >&2 2>/dev/null); }; then
        rm -rf "$tmp"
        echo "apt-get download prometheus failed: can this machine reach Debian's mirrors?" >&2
        return 1
    fi
    rm -rf "$dir" && mkdir -p "$dir" && dpkg-deb -x "$tmp"/prometheus_*.deb "$dir"
    rm -rf "$tmp"
    [ -x "$PROMTOOL" ] || { echo "the prometheus package had no usr/bin/promtool" >&2; return 1; }
}
