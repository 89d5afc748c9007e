"""Fixtures for the idemproxy integration suite: a real redis-server, a fake
upstream (fake_upstream.py) and a factory that starts the proxy binary.

One behaviour suite, two stores: the `proxy` factory runs the proxy on the
store of the `store` fixture, parametrised "redis" and "memory", so every test
that starts a proxy runs on both (ids `test_executed[redis]`,
`test_executed[memory]`). A test narrows that with one decorator:

  @redis_only          the behaviour exists or is observable only with Redis
                       (PTTL values, hash edits, Redis down, several proxies
                       sharing one Redis); the test name must say "redis"
  @shared_store        several proxies share one store (Redis; PostgreSQL in its
                       pass); the test name must say "shared"
  @memory_only         a property of the memory store (eviction, restart);
                       the test name must say "memory"
  @store_independent   the test does not depend on the store (CLI, forwarding):
                       it runs once, on the memory store, the default

The names are checked at collection. State is checked through the helpers
assert_locked / assert_completed / assert_free / assert_nothing_stored /
wait_completed, which probe behaviour on both stores (a duplicate gets 409, is
replayed, or executes) and, on Redis, also read the hash.

On PostgreSQL: with IDEMPROXY_TEST_STORE=postgresql, the `store` fixture has a
third value, "postgresql" (a server of pg_fixtures.py, one per worker, its
table emptied before each test), and only the tests that run on it are
collected; the state probes read its rows as they read Redis's hashes.
scripts/test runs this pass once, in the plain build.

On a cluster: with IDEMPROXY_TEST_REDIS_KIND=cluster, the "redis" store is a
Redis Cluster of three masters and three replicas (redis_fixtures.ClusterSet,
started once for the session; rdb is then a redis-py RedisCluster client, which
sums DBSIZE and scans every master), and only the tests that run on it are
collected: those of the "redis" store, less the ones marked
@single_redis_server (they stop or restart the one server, or connect to its
port by another name) and those of test_redis_*.py (they start servers of
their own). scripts/test runs the suite both ways.

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
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fake_upstream import FakeUpstream  # noqa: E402
from waiting import free_port, wait_for  # noqa: E402,F401  (the suite imports them from here)
from redis_fixtures import ClusterSet  # noqa: E402
from pg_fixtures import PgServer  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IDEMPROXY_BIN = os.environ.get("IDEMPROXY_BIN", os.path.join(REPO, "build", "src", "idemproxy"))
REDIS_SERVER = "/usr/bin/redis-server"
DRAFT = "draft-ietf-httpapi-idempotency-key-header"
REPLAY = "X-Idempotency-Replayed"
ON_CLUSTER = os.environ.get("IDEMPROXY_TEST_REDIS_KIND", "server") == "cluster"
ON_PG = os.environ.get("IDEMPROXY_TEST_STORE") == "postgresql"
# scripts/test's sanitizer passes: the tests that move hundreds of MiB (heavy) run
# once, in the plain build.
SANITIZED = os.environ.get("IDEMPROXY_TEST_SANITIZED") == "1"


# --------------------------------------------------------------------------- helpers


def new_key():
    return "k-" + uuid.uuid4().hex


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


def end_to_end(headers, drop=(REPLAY, "X-Request-Id")):
    """Headers without framing ones, the replay header and the request id
    (each answer carries its own request's), for comparisons."""
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


def recv_until_closed(s, what="the connection"):
    """Reads socket <s> until the peer closes it (a reset counts); fails the
    test when the socket's timeout runs out first. Returns what was read."""
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data
    except socket.timeout:
        pytest.fail("%s was not closed within %s s" % (what, s.gettimeout()))


def redis_keys(r, key, prefix="idem:"):
    """Store keys for idempotency key <key> (any scope)."""
    return sorted(k.decode() for k in r.scan_iter(match="%s*:%s" % (prefix, key), count=1000))


def redis_lease_ms(r, key, prefix="idem:"):
    """What is left of the lease of the lock of <key>: a lock's key is kept its
    lease and then its record's TTL (the hash's "keep"), so the lease is the
    PTTL beyond keep."""
    keys = redis_keys(r, key, prefix)
    assert len(keys) == 1, keys
    return r.pttl(keys[0]) - int(r.hget(keys[0], "keep") or 0)


def redis_record(r, key, prefix="idem:"):
    """The hash of the single store key for <key> as {str: bytes}, or None."""
    keys = redis_keys(r, key, prefix)
    assert len(keys) <= 1, keys
    if not keys:
        return None
    h = r.hgetall(keys[0])
    return {k.decode(): v for k, v in h.items()}


def pg_rows(pg, key, prefix="idem:"):
    """The live rows of idempotency key <key> (any scope) as [(store key, state)]."""
    return pg.sql("SELECT key, state FROM idemproxy_keys WHERE starts_with(key, %s) "
                  "AND right(key, %s) = %s AND length(key) = %s AND expires_at > now() "
                  "ORDER BY key", (prefix, len(key) + 1, ":" + key, len(prefix) + 33 + len(key)))


def stored_state(p, key, prefix="idem:"):
    """The state the store holds for <key> ("L", "C", "U" or None) when it can
    be read (Redis, PostgreSQL); "?" on the memory store."""
    if p.store == "redis":
        return redis_state(p.rdb, key, prefix)
    if p.store == "postgresql":
        rows = pg_rows(p.pg, key, prefix)
        assert len(rows) <= 1, rows
        return rows[0][1] if rows else None
    return "?"


def stored_cause(p, key, prefix="idem:"):
    """The cause an unknown record of <key> keeps (Redis, PostgreSQL), or None."""
    if p.store == "redis":
        keys = redis_keys(p.rdb, key, prefix)
        v = p.rdb.hget(keys[0], "cause") if keys else None
        return v.decode() if v else None
    rows = pg_rows(p.pg, key, prefix)
    return p.pg.sql("SELECT cause FROM idemproxy_keys WHERE key = %s",
                    (rows[0][0],))[0][0] if rows else None


def stored_lease_ms(p, key, prefix="idem:"):
    """What is left of the lease of the lock of <key> (Redis, PostgreSQL)."""
    if p.store == "redis":
        return redis_lease_ms(p.rdb, key, prefix)
    rows = pg_rows(p.pg, key, prefix)
    assert len(rows) == 1, rows
    return p.pg.sql("SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint "
                    "FROM idemproxy_keys WHERE key = %s", (rows[0][0],))[0][0]


def redis_state(r, key, prefix="idem:"):
    """The state field of the single store key for <key> on Redis: "L", "C" or None."""
    rec = redis_record(r, key, prefix)
    if rec is None:
        return None
    return rec.get("state", b"?").decode()


# --------------------------------------------------------------------------- store probes
# The state of a key, checked by behaviour (the same on both stores) and, when the
# proxy runs on Redis, also by reading the hash, which is the stronger check.
# req is the original request, as the arguments of Proxy.request:
# (method, path, headers, body), its headers carrying the key.

def keyed(key, method="POST", path="/echo", body=b"x", header="Idempotency-Key", extra=()):
    """A request tuple for Proxy.request carrying <key>."""
    return (method, path, [(header, key)] + list(extra), body)


def _upstream_hits(p, upstream, path=None):
    up = upstream or p.upstream
    assert up is not None, "pass upstream= (the proxy does not use the upstream fixture)"
    return up, up.hits(path)


def assert_locked(p, key, req, upstream=None, prefix="idem:"):
    """In flight: on Redis the hash is a lock; on both stores a duplicate of req
    gets 409 idempotency_key_in_use at once and the upstream is not called."""
    assert stored_state(p, key, prefix) in ("L", "?"), stored_state(p, key, prefix)
    up, before = _upstream_hits(p, upstream)
    resp = p.request(*req)
    assert_problem(resp, 409, "idempotency_key_in_use", "2.6")
    assert up.hits() == before, "a duplicate of a request in flight reached the upstream"
    return resp


def assert_completed(p, key, req, body=None, upstream=None, prefix="idem:",
                     replay_header=REPLAY):
    """Completed: on Redis the hash is a completed record; on both stores a
    duplicate of req is replayed (replay header true, upstream not called), with
    <body> when given. Returns the replayed answer."""
    assert stored_state(p, key, prefix) in ("C", "?"), stored_state(p, key, prefix)
    up, before = _upstream_hits(p, upstream)
    st, h, b = p.request(*req)
    assert hone(h, replay_header) == "true", (st, h, b[:300])
    assert up.hits() == before, "a replay reached the upstream"
    if body is not None:
        assert b == body
    return st, h, b


def assert_unknown(p, req, upstream=None, path=None):
    """The key of <req> is unknown (SPEC §9): the request gets 502
    idempotency_outcome_unknown with X-Should-Retry: false, no Retry-After
    and no replay header, and never reaches the upstream (<path>'s hits, or
    all of them, unchanged). Returns the answer."""
    up, before = _upstream_hits(p, upstream, path)
    resp = p.request(*req)
    assert_problem(resp, 502, "idempotency_outcome_unknown")
    _, h, _ = resp
    assert hone(h, "X-Should-Retry") == "false", h
    assert hone(h, "Retry-After") is None and hone(h, REPLAY) is None, h
    assert up.hits(path) == before, "an unknown key reached the upstream"
    return resp


def assert_free(p, key, req=None, upstream=None, prefix="idem:", replay_header=REPLAY):
    """Nothing stored for <key> (never locked, or the lock was released): on Redis
    there is no store key; on both stores a request with the key executes (replay
    header false, the upstream is called). req defaults to a POST /echo with the
    key. The probe uses the key: it is completed afterwards. Returns the answer."""
    assert stored_state(p, key, prefix) in (None, "?"), stored_state(p, key, prefix)
    req = req or keyed(key, body=b"probe")
    up, before = _upstream_hits(p, upstream)
    st, h, b = p.request(*req)
    if st in (502, 504) and hone(h, replay_header) is None:
        # The upstream was called and failed (e.g. a timeout): a problem, without
        # the replay header.
        obj = json.loads(b)
        assert obj["code"] in ("upstream_unavailable", "upstream_timeout"), obj
    else:
        assert hone(h, replay_header) == "false", (st, h, b[:300])
    assert up.hits() == before + 1, "the request with a free key did not reach the upstream"
    return st, h, b


def assert_nothing_stored(p):
    """Nothing at all was written to the store. Redis and PostgreSQL can be
    inspected; on the memory store the caller's behavioural checks must do."""
    if p.store == "redis":
        assert p.rdb.dbsize() == 0, [k for k in p.rdb.scan_iter(count=1000)]
    if p.store == "postgresql":
        assert p.pg.sql("SELECT key FROM idemproxy_keys") == []


def wait_completed(p, key, req, timeout=10.0, upstream=None, prefix="idem:"):
    """Waits until the request running for <key> has completed, polling with
    duplicates of req (409 while it runs); then checks it as assert_completed.
    Returns the replayed answer."""
    if p.store in ("redis", "postgresql"):
        wait_for(lambda: stored_state(p, key, prefix) == "C", timeout=timeout,
                 what="%s to complete in the store" % key)
    up = upstream or p.upstream

    def done():
        before = up.hits()
        st, h, b = p.request(*req)
        if st == 409 and json.loads(b).get("code") == "idempotency_key_in_use":
            return None
        assert hone(h, REPLAY) == "true", (st, h, b[:300])
        assert up.hits() == before, "a replay reached the upstream"
        return st, h, b

    return wait_for(done, timeout=timeout, interval=0.1, what="%s to complete" % key)


def start_request(p, req, key, upstream=None, timeout=30.0):
    """Sends req in a thread and waits until the upstream has received it (so the
    key is locked: the lock is taken before forwarding). Returns in_thread's getter."""
    up = upstream or p.upstream
    headers = dict((k.lower(), v) for k, v in req[2])
    name = "Idempotency-Key"
    before = up.received(name, headers[name.lower()])
    get = in_thread(p.request, *req, timeout=timeout)
    wait_for(lambda: up.received(name, headers[name.lower()]) > before, timeout=10,
             what="the upstream to receive the request of %s" % key)
    assert stored_state(p, key) in ("L", "?"), stored_state(p, key)
    return get


def start_slow(p, key, ms, body=b"slow", path=None):
    """Starts a keyed POST to /slow?ms=<ms> in a thread; returns once the upstream
    has it (the key is locked). Returns a getter of the answer."""
    path = path or "/slow?ms=%d" % ms
    return start_request(p, ("POST", path, [("Idempotency-Key", key)], body), key)


def start_held(p, key, hold_id=None, body=b"held", upstream=None):
    """Starts a keyed POST to /hold?id=<hold_id> (default: the key), which the
    upstream answers only after upstream.release(hold_id). Returns a getter."""
    hold_id = hold_id or key
    return start_request(p, ("POST", "/hold?id=%s" % hold_id, [("Idempotency-Key", key)], body),
                         key, upstream=upstream)


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
                 "--appendonly", "no", "--daemonize", "no",
                 "--dir", self.logdir],  # whatever a test makes it write lands there
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


class ClusterServer:
    """The suite's Redis as a Redis Cluster: what the tests use of RedisServer
    (url, client(), running()), on a ClusterSet."""

    def __init__(self, workdir):
        self.cluster = ClusterSet(workdir)

    @property
    def url(self):
        return self.cluster.seed_url(seeds=len(self.cluster.masters()))

    def client(self):
        c = self.cluster.client()
        # redis-py sends DBSIZE to one node of a cluster: the tests mean all of it
        c.dbsize = lambda: c.execute_command("DBSIZE", target_nodes=c.PRIMARIES)
        return c

    def running(self):
        return True

    def start(self):
        self.cluster.start()

    def stop(self):
        self.cluster.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip("no %s" % REDIS_SERVER)
    if ON_CLUSTER:
        srv = ClusterServer(str(tmp_path_factory.mktemp("cluster")))
    else:
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
    def __init__(self, args, env, logdir, name, store=None, rdb=None, upstream=None, pg=None):
        self.store = store  # "redis", "memory" or "postgresql"
        self.rdb = rdb  # client of the suite's Redis (for Redis-side checks)
        self.pg = pg  # the suite's PgServer, on "postgresql"
        self.upstream = upstream  # the FakeUpstream it forwards to, if the fixture's
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

    def _ports_taken(self):
        """After a start that failed: was it because another process took one
        of the free ports picked for it (free_port() can only say what was
        free)? If so, and the ports are the factory's own, it picks new ones."""
        own = ["--listen", "127.0.0.1:%d" % self.port, "--admin-listen",
               "127.0.0.1:%d" % self.admin_port]
        err = self.stderr()
        if self.args[1:5] != own or ("another process listens on it" not in err
                                     and "cannot listen there" not in err):
            return False
        self.port = free_port()
        self.admin_port = free_port()
        while self.admin_port == self.port:
            self.admin_port = free_port()
        self.args[2] = "127.0.0.1:%d" % self.port
        self.args[4] = "127.0.0.1:%d" % self.admin_port
        return True

    def start(self, ready_timeout=10.0, tries=3):
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                self.proc = None  # reported here, not again at teardown
                if self._ports_taken() and tries > 1:
                    return self.start(ready_timeout, tries - 1)
                pytest.fail("idemproxy exited with %d during start-up:\n%s"
                            % (self.returncode, self.stderr()))
            try:
                st, _, _ = http_request("127.0.0.1", self.admin_port, "GET", "/healthz",
                                        timeout=1.0)
                # Another process may have taken the admin port and answer
                # for it while this one fails to start: it must still run.
                if st == 200 and self.proc.poll() is None:
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

    def wait_log(self, needle, timeout=5.0):
        """Waits, bounded, until <needle> is in the proxy's stderr, and returns
        that text: a line written at start-up may come after the listeners
        answer, so a test never reads it right after start without waiting."""
        return wait_for(lambda: needle in self.stderr() and self.stderr(), timeout=timeout,
                        what="%r in the log" % needle)

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

    def kill(self):
        """SIGKILL (a crash): nothing is completed or released. Returns -9."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.returncode = self.proc.returncode
        self.proc = None
        return self.returncode

    def restart(self, ready_timeout=10.0):
        """SIGTERM (must exit 0), then the same command line again, same ports."""
        rc = self.stop()
        assert rc == 0, "exit status %s on SIGTERM:\n%s" % (rc, self.stderr())
        return self.start(ready_timeout)

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


STORES = ("redis", "memory", "postgresql") if ON_PG else ("redis", "memory")


@pytest.fixture(params=STORES)
def store(request):
    """The store the proxy factory uses by default: "redis" or "memory" (and
    "postgresql" in the PostgreSQL pass)."""
    return request.param


# The two upstream clients (doc/performance.md): idemproxy's own HTTP/1.1
# exchange, the default for http://, and libcurl (--upstream-client curl).
CLIENTS = ("own", "curl")


@pytest.fixture
def upstream_client(request):
    """The client the proxy factory asks for: "own" unless the test's module
    is marked both_clients, which runs its tests on each."""
    return getattr(request, "param", "own")


def pytest_generate_tests(metafunc):
    if (metafunc.definition.get_closest_marker("both_clients")
            and "proxy" in metafunc.fixturenames):
        metafunc.parametrize("upstream_client", CLIENTS, indirect=True)


@pytest.fixture(scope="session")
def pg_server():
    """The suite's PostgreSQL server (one per worker), for the PostgreSQL pass."""
    with PgServer() as pg:
        yield pg


@pytest.fixture
def pgdb(request):
    """The suite's PgServer with the proxy's table emptied (when it exists)."""
    pg = request.getfixturevalue("pg_server")
    pg.sql("DO $$ BEGIN IF to_regclass('idemproxy_keys') IS NOT NULL THEN "
           "TRUNCATE idemproxy_keys; END IF; END $$")
    return pg


def redis_only(fn):
    """Runs the test on the Redis store only; its name must say "redis" (why)."""
    return pytest.mark.parametrize("store", ["redis"])(fn)


def shared_store(fn):
    """Runs the test on the stores several proxies can share: Redis, and
    PostgreSQL in its pass; its name must say "shared" (why). It may read
    the store only through the probes (stored_state)."""
    return pytest.mark.parametrize("store", ["redis", "postgresql"] if ON_PG else ["redis"])(fn)


def memory_only(fn):
    """Runs the test on the memory store only; its name must say "memory" (why)."""
    return pytest.mark.parametrize("store", ["memory"])(fn)


def single_redis_server(fn):
    """The test stops or restarts the suite's one Redis server, or reaches it
    by another name: it does not run on a cluster (IDEMPROXY_TEST_REDIS_KIND)."""
    return pytest.mark.single_redis_server(fn)


def heavy(fn):
    """The test moves hundreds of MiB: it runs in the plain build only, not in
    scripts/test's sanitizer passes (IDEMPROXY_TEST_SANITIZED=1)."""
    return pytest.mark.heavy(fn)


def store_independent(fn):
    """The test does not depend on the store: it runs once, on the memory store
    (the default store)."""
    return pytest.mark.store_independent(pytest.mark.parametrize("store", ["memory"])(fn))


def pytest_configure(config):
    config.addinivalue_line("markers", "store_independent: the test runs once, on the "
                            "memory store, because it does not depend on the store")
    config.addinivalue_line("markers", "single_redis_server: the test needs the suite's Redis "
                            "to be one server; it does not run on a cluster")
    config.addinivalue_line("markers", "heavy: the test moves hundreds of MiB: plain build only")
    config.addinivalue_line("markers", "both_clients: the module's tests run on both upstream "
                            "clients, idemproxy's own and libcurl's (plain pass, memory store)")
    config.addinivalue_line("markers", "concurrency: the test exercises threads racing (duplicates, "
                            "--wait, reload, heartbeats, failover): scripts/test runs it under "
                            "ThreadSanitizer too")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that runs on one store only says why in its name."""
    bad = set()
    for item in items:
        if "store" not in getattr(item, "fixturenames", ()):
            continue
        for m in item.iter_markers("parametrize"):
            names = m.args[0]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
            if list(names) != ["store"]:
                continue
            values = sorted(set(m.args[1]))
            name = item.originalname or item.name
            if "postgresql" in values and "memory" not in values and "shared" not in name:
                bad.add("%s: runs on the shared stores only, its name must say shared"
                        % item.nodeid)
            elif values == ["redis"] and "redis" not in name:
                bad.add("%s: runs on Redis only, its name must say redis" % item.nodeid)
            elif (values == ["memory"] and "memory" not in name
                  and item.get_closest_marker("store_independent") is None):
                bad.add("%s: runs on the memory store only, its name must say memory "
                        "(or mark it @store_independent)" % item.nodeid)
    if bad:
        raise pytest.UsageError("\n".join(sorted(bad)))
    # libcurl's client runs the both_clients tests in the plain pass, once:
    # on the memory store, or on the store a test is bound to.
    drop = []
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params or params.get("upstream_client") != "curl":
            continue
        name = item.originalname or item.name
        if (SANITIZED or ON_PG or ON_CLUSTER
                or (params.get("store") == "redis" and "redis" not in name
                    and "shared" not in name)):
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
    if SANITIZED:
        drop = [i for i in items if i.get_closest_marker("heavy")]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [i for i in items if i not in drop]
    if ON_PG:
        # The PostgreSQL pass: the tests of the "postgresql" store only.
        keep = [i for i in items if getattr(i, "callspec", None) is not None
                and i.callspec.params.get("store") == "postgresql"]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep
    if ON_CLUSTER:
        # The cluster pass: the tests of the suite's Redis store, now a cluster.
        keep, drop = [], []
        for item in items:
            callspec = getattr(item, "callspec", None)
            on_redis = callspec is not None and callspec.params.get("store") == "redis"
            # test_redis_*.py start Redis servers of their own (TLS, Sentinel, a cluster)
            own_servers = item.module.__name__.startswith("test_redis_")
            if (on_redis and not own_servers
                    and not item.get_closest_marker("single_redis_server")):
                keep.append(item)
            else:
                drop.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "setup"):
        for p in getattr(item, "_idem_proxies", []):
            rep.sections.append(("idemproxy %s stderr (%s)" % (p.name, " ".join(p.args[1:])),
                                 p.stderr()))


@pytest.fixture
def proxy(request, store, upstream, redis_server, rdb, tmp_path, upstream_client):
    """proxy(*extra_args, env=None, upstream_url=None, redis_url=None, store=None,
    redis_arg=None, start=True): starts idemproxy against the upstream fixture, on
    the store of the `store` fixture unless store= says otherwise, and on the
    upstream client of the `upstream_client` fixture.
    upstream_url=False omits --upstream. On "redis", --redis is the suite's Redis
    (or redis_url); on "memory" there is no --redis. redis_arg=False omits --redis
    even on Redis (the URL then comes from env)."""
    started = []
    request.node._idem_proxies = started
    default_store = store

    def factory(*extra, env=None, upstream_url=None, redis_url=None, store=None,
                redis_arg=None, start=True):
        kind = store or ("redis" if redis_url else default_store)
        assert kind in STORES, kind
        if redis_arg is None:
            redis_arg = kind == "redis"
        args = [] if upstream_url is False else ["--upstream", upstream_url or upstream.url]
        if redis_arg:
            args += ["--redis", redis_url or redis_server.url]
        pg = request.getfixturevalue("pgdb") if kind == "postgresql" else None
        if pg is not None:
            args += ["--store", pg.url]
        if upstream_client == "curl":
            args += ["--upstream-client", "curl"]
        args += list(extra)
        p = Proxy(args, env, str(tmp_path), "proxy%d" % len(started), store=kind, rdb=rdb,
                  upstream=upstream if upstream_url in (None, False) else None, pg=pg)
        started.append(p)
        if start:
            p.start()
        return p

    yield factory
    upstream.release_all()  # a /hold left waiting would hold the drain
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
    # A proxy on the memory store never writes to Redis.
    if started and all(p.store == "memory" for p in started) and redis_server.running():
        assert rdb.dbsize() == 0, "a memory-store proxy wrote to Redis: %r" % (
            [k for k in rdb.scan_iter(count=1000)],)


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


def readyz(p):
    """The status of p's /readyz."""
    return p.admin_request("GET", "/readyz")[0]


def executes_then_replays(p, upstream, body=b"x"):
    """A new key executes once and its duplicate is replayed. Returns the key."""
    key = new_key()
    before = upstream.hits()
    st, h, b = p.request("POST", "/echo", [("Idempotency-Key", key)], body)
    assert st == 201 and hone(h, REPLAY) == "false", (st, h, b)
    st2, h2, b2 = p.request("POST", "/echo", [("Idempotency-Key", key)], body)
    assert st2 == 201 and hone(h2, REPLAY) == "true" and b2 == b
    assert upstream.hits() == before + 1
    return key


def refused_503(p, upstream, *needles):
    """A store that cannot be used: 503 store_unavailable, /readyz 503, the
    upstream untouched, and each needle in the log."""
    before = upstream.hits()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x"), 503,
                   "store_unavailable")
    assert upstream.hits() == before
    wait_for(lambda: readyz(p) == 503, timeout=5, what="/readyz 503")
    for n in needles:
        wait_for(lambda: n in p.stderr(), timeout=5, what="%r in the log" % n)
