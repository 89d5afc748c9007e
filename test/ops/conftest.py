"""Shared by the packaging and operations tests (test/ops), which scripts/test
runs once, after the plain build: meson install and the systemd unit, the
Debian package, the container file, the alerting rules and the dashboard."""
import os
import re
import subprocess
import sys
from http.client import HTTPConnection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "integration"))  # the integration suite's fixtures
from fixtures.waiting import free_port, wait_for  # noqa: E402,F401 (tests import them from here)
BIN = Path(os.environ.get("IDEMPROXY_BIN", ROOT / "build" / "src" / "idemproxy"))


def run(args, check=True, env=None, timeout=600, cwd=None):
    """Runs args, returns the CompletedProcess (text); on failure with check
    set, the assertion shows the command and its output."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=cwd)
    assert not check or p.returncode == 0, \
        f"{' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def project_version():
    """The version meson.build declares, the one place it is written."""
    m = re.search(r"project\('idemproxy', 'c', version: '([^']+)'",
                  (ROOT / "meson.build").read_text())
    assert m, "meson.build declares no version"
    return m.group(1)


def unit_settings(text):
    """[(key, value)] of a unit file's assignments, in order (a key may repeat)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


@pytest.fixture(scope="session")
def deb():
    """scripts/package, once: the path of the .deb it built."""
    p = run([ROOT / "scripts/package"], timeout=1200)
    path = p.stdout.strip().splitlines()[-1]
    assert path.endswith(".deb") and f"idemproxy_{project_version()}_" in path, p.stdout
    return path


def unpack(deb, how, tmp_path_factory):
    """dpkg-deb <how> (-x: the files, -e: the control files) into a new directory."""
    d = tmp_path_factory.mktemp("deb")
    run(["dpkg-deb", how, deb, d])
    return d


@pytest.fixture(scope="session")
def root(deb, tmp_path_factory):
    """A throwaway root the package is unpacked into (dpkg -x)."""
    return unpack(deb, "-x", tmp_path_factory)


def http(port, method, path, headers=None, body=None):
    """One request to 127.0.0.1:<port>: (status, body)."""
    c = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def stop(proc):
    """SIGTERM, then SIGKILL after 10 s: a process this suite started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def pg_url():
    """scripts/test's PostgreSQL (IDEMPROXY_TEST_PG_URL), else a server started
    here (test/integration/fixtures/postgres.py)."""
    if os.environ.get("IDEMPROXY_TEST_PG_URL"):
        yield os.environ["IDEMPROXY_TEST_PG_URL"]
        return
    from fixtures.postgres import PgServer
    with PgServer() as pg:
        yield pg.url


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """scripts/test's Redis (IDEMPROXY_TEST_REDIS_URL), else a redis-server
    started here on a free loopback port (test/integration/fixtures/redis.py)."""
    if os.environ.get("IDEMPROXY_TEST_REDIS_URL"):
        yield os.environ["IDEMPROXY_TEST_REDIS_URL"]
        return
    from fixtures.redis import RedisServer
    srv = RedisServer(str(tmp_path_factory.mktemp("redis"))).start()
    try:
        yield srv.url
    finally:
        srv.stop()
