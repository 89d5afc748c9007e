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

# curl: the demo of scripts/run prints curl commands, and the integration suite runs them.
BUILD_PACKAGES=(gcc pkg-config meson ninja-build python3 libmicrohttpd-dev libcurl4-openssl-dev
    libhiredis-dev libjansson-dev libssl-dev curl)

# build DIR [meson options...] configures DIR once and builds it.
build() {
    local dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$IDEMPROXY_ROOT" "$@" >"$dir.setup.log" 2>&1 ||
            { cat "$dir.setup.log" >&2; echo "meson setup $dir failed" >&2; return 1; }
    fi
    ninja -C "$dir" >&2 || { echo "build in $dir failed" >&2; return 1; }
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
