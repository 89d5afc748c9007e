"""Fixtures for the idemproxy integration suite: a real redis-server, a fake
upstream (fake_upstream.py) and a factory that starts the proxy binary.

Run: IDEMPROXY_BIN=build/src/idemproxy /usr/bin/python3 -m pytest -q test/integration
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis

sys.path.insert(0, os.path.dirname(__file__))
from fake_upstream import FakeUpstream  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IDEMPROXY_BIN = os.environ.get("IDEMPROXY_BIN", os.path.join(REPO, "build", "src", "idemproxy"))
REDIS_SERVER = "/usr/bin/redis-server"
DRAFT = "draft-ietf-httpapi-idempotency-key-header"
REPLAY = "X-Idempotency-Replayed"


# --------------------------------------------------------------------------- helpers
# Tests of features that later issues build (the memory store, --wait,
# /metrics) wait in pending/; each issue moves its file back when it lands.
collect_ignore = ["pending"]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_key():
    return "k-" + uuid.uuid4().hex


def wait_for(cond, timeout=5.0, interval=0.05, what="condition"):
    """Polls cond() until it returns a truthy value; returns it, or fails."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def hvalues(headers, name):
    """All values of header <name> (case-insensitive), in order."""
    name = name.lower()
    return [v for k, v in headers if k.lower() == name]


def hone(headers, name):
    """The single value of header <name>, None when absent; fails when repeated."""
    vals = hvalues(headers, name)
    assert len(vals) <= 1, "header %s repeated: %r" % (name, vals)
    return vals[0] if vals else None


FRAMING = {"content-length", "transfer-encoding", "connection", "keep-alive"}


def end_to_end(headers, drop=(REPLAY,)):
    """Headers without framing ones and the replay header, for comparisons."""
    dropl = {d.lower() for d in drop}
    return [(k.lower(), v) for k, v in headers if k.lower() not in FRAMING | dropl]


def assert_problem(resp, status, code, section=None):
    """resp = (status, headers, body). section: '2.1' etc. or None for about:blank."""
    st, headers, body = resp
    assert st == status, "status %d, expected %d; body %r" % (st, status, body[:500])
    ct = hone(headers, "Content-Type")
    assert ct is not None and ct.split(";")[0].strip() == "application/problem+json", ct
    obj = json.loads(body)
    for m in ("type", "title", "status", "detail", "code"):
        assert m in obj, "problem member %s missing: %r" % (m, obj)
    assert obj["status"] == status, obj
    assert obj["code"] == code, obj
    assert isinstance(obj["title"], str) and obj["title"], obj
    assert isinstance(obj["detail"], str) and obj["detail"], obj
    if section is None:
        assert obj["type"] == "about:blank", obj
    else:
        assert DRAFT in obj["type"] and obj["type"].endswith("#section-" + section), obj
    assert hone(headers, REPLAY) is None, "a problem must not carry %s" % REPLAY
    if status in (409, 503):
        assert hone(headers, "Retry-After") == "1", headers
    return obj


def http_request(host, port, method, path, headers=None, body=None, timeout=15.0):
    """One request on a fresh connection. headers: list of (name, value) or dict.
    Returns (status, [(name, value)...] in order, body bytes)."""
    if isinstance(headers, dict):
        headers = list(headers.items())
    headers = list(headers or [])
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        has_host = any(k.lower() == "host" for k, _ in headers)
        conn.putrequest(method, path, skip_host=has_host, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        if body is not None and not any(k.lower() in ("content-length", "transfer-encoding")
                                        for k, _ in headers):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
        return r.status, r.getheaders(), data
    finally:
        conn.close()


def raw_request(port, data, timeout=15.0, host="127.0.0.1"):
    """Sends raw bytes, parses one answer. Returns (status, headers, body)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        r = http.client.HTTPResponse(s)
        r.begin()
        body = r.read()
        return r.status, r.getheaders(), body
    finally:
        s.close()


def redis_keys(r, key, prefix="idem:"):
    """Store keys for idempotency key <key> (any scope)."""
    return sorted(k.decode() for k in r.scan_iter(match="%s*:%s" % (prefix, key), count=1000))


def redis_record(r, key, prefix="idem:"):
    """The hash of the single store key for <key> as {str: bytes}, or None."""
    keys = redis_keys(r, key, prefix)
    assert len(keys) <= 1, keys
    if not keys:
        return None
    h = r.hgetall(keys[0])
    return {k.decode(): v for k, v in h.items()}


def metrics_value(text, name, labels=None):
    """Sum of the samples of metric <name> (with the given label subset)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        mname = metric.split("{")[0]
        if mname != name:
            continue
        if labels:
            lab = metric[len(mname):]
            if not all('%s="%s"' % (k, v) in lab for k, v in labels.items()):
                continue
        total += float(value)
        found = True
    return total if found else None


# --------------------------------------------------------------------------- redis
class RedisServer:
    def __init__(self, logdir):
        self.port = free_port()
        self.logdir = logdir
        self.proc = None

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                           socket_connect_timeout=5)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        assert not self.running()
        log = open(os.path.join(self.logdir, "redis-%d.log" % self.port), "ab")
        deadline = time.monotonic() + 10
        while True:
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            ok = self._wait_ping(deadline)
            if ok:
                break
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start on port %d" % self.port)
            time.sleep(0.2)  # e.g. the port is briefly still in use: try again
        log.close()

    def _wait_ping(self, deadline):
        c = self.client()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if c.ping():
                    return True
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.05)
        return False

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self):
        """Stops and starts again on the same port: the store comes back empty."""
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip("no %s" % REDIS_SERVER)
    srv = RedisServer(str(tmp_path_factory.mktemp("redis")))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def rdb(redis_server):
    """A client of a running, empty redis_server (restarted if a test stopped it)."""
    if not redis_server.running():
        redis_server.start()
    c = redis_server.client()
    c.flushall()
    yield c
    if not redis_server.running():
        redis_server.start()
    c.close()


# --------------------------------------------------------------------------- upstream
@pytest.fixture
def upstream():
    srv = FakeUpstream().start()
    yield srv
    srv.stop()


# --------------------------------------------------------------------------- proxy
def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("IDEMPROXY_") and not k.startswith("IDEMPOTENCY_")}
    env.update(extra or {})
    return env


def run_binary(args, env=None, timeout=10):
    """Runs the binary to completion (for CLI tests). Returns CompletedProcess."""
    return subprocess.run([IDEMPROXY_BIN] + list(args), env=clean_env(env), capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class Proxy:
    def __init__(self, args, env, logdir, name):
        self.port = free_port()
        self.admin_port = free_port()
        while self.admin_port == self.port:
            self.admin_port = free_port()
        self.args = [IDEMPROXY_BIN, "--listen", "127.0.0.1:%d" % self.port,
                     "--admin-listen", "127.0.0.1:%d" % self.admin_port] + list(args)
        self.env = clean_env(env)
        self.name = name
        self.stderr_path = os.path.join(logdir, name + ".stderr")
        self.stdout_path = os.path.join(logdir, name + ".stdout")
        self.proc = None
        self.returncode = None

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def admin(self):
        return "http://127.0.0.1:%d" % self.admin_port

    def start(self, ready_timeout=10.0):
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                self.proc = None  # reported here, not again at teardown
                pytest.fail("idemproxy exited with %d during start-up:\n%s"
                            % (self.returncode, self.stderr()))
            try:
                st, _, _ = http_request("127.0.0.1", self.admin_port, "GET", "/healthz",
                                        timeout=1.0)
                if st == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("idemproxy not ready after %.0fs:\n%s" % (ready_timeout,
                                                                      self.stderr()))
            time.sleep(0.05)

    def stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        return text if len(text) < 30000 else "...\n" + text[-30000:]

    def request(self, method, path, headers=None, body=None, timeout=15.0):
        return http_request("127.0.0.1", self.port, method, path, headers, body, timeout)

    def admin_request(self, method, path, timeout=5.0):
        return http_request("127.0.0.1", self.admin_port, method, path, None, None, timeout)

    def raw(self, data, timeout=15.0):
        return raw_request(self.port, data, timeout)

    def metrics(self):
        st, _, body = self.admin_request("GET", "/metrics")
        assert st == 200
        return body.decode()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=15.0):
        """SIGTERM, then waits. Returns the exit status (-9 if it had to be killed)."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                self.returncode = -9
                self.proc = None
                return self.returncode
        self.returncode = self.proc.returncode
        self.proc = None
        return self.returncode


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "setup"):
        for p in getattr(item, "_idem_proxies", []):
            rep.sections.append(("idemproxy %s stderr (%s)" % (p.name, " ".join(p.args[1:])),
                                 p.stderr()))


@pytest.fixture
def proxy(request, upstream, redis_server, rdb, tmp_path):
    """proxy(*extra_args, env=None, upstream_url=None, redis_url=None, memory=False,
    start=True): starts idemproxy against the upstream and redis fixtures.
    upstream_url=False omits --upstream; memory=True omits --redis."""
    started = []
    request.node._idem_proxies = started

    def factory(*extra, env=None, upstream_url=None, redis_url=None, memory=False, start=True):
        args = [] if upstream_url is False else ["--upstream", upstream_url or upstream.url]
        if not memory:
            args += ["--redis", redis_url or redis_server.url]
        args += list(extra)
        p = Proxy(args, env, str(tmp_path), "proxy%d" % len(started))
        started.append(p)
        if start:
            p.start()
        return p

    yield factory
    bad = []
    for p in started:
        if p.proc is None:
            continue
        rc = p.stop()
        if rc != 0:
            bad.append((p, rc))
    if bad:
        pytest.fail("\n".join("idemproxy %s exited with %s on SIGTERM (expected 0):\n%s"
                              % (p.name, rc, p.stderr()) for p, rc in bad))


def in_thread(fn, *args, **kwargs):
    """Runs fn in a daemon thread; returns a getter that joins (bounded) and
    returns fn's result or re-raises its exception."""
    box = {}

    def run():
        try:
            box["v"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: B036
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def get(timeout=20.0):
        t.join(timeout)
        assert not t.is_alive(), "background request did not finish in %.0fs" % timeout
        if "e" in box:
            raise box["e"]
        return box["v"]

    return get
