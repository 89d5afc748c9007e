"""SIGHUP reloads the configuration file (doc/configuration.md, Reloading): a
valid file applies to the requests that begin after it, while a running request
keeps its route; an invalid one changes nothing and logs each problem as
`reload: FILE:LINE:COLUMN: message`; the settings that need a restart are
logged as such and keep their value; no connection or request is dropped; the
log level and format apply; a `wait` that no route had at start needs a
restart. idemproxy_config_reloads_total{result} counts reloads.

The proxy fixture passes --listen, --admin-listen, --upstream (and --redis)
as flags, which beat the file: a test about those starts the proxy without
them and puts them in the file."""
import collections
import http.client
import json
import signal
import socket
import threading
import time
import urllib.parse

import pytest

from fixtures.client import (REPLAY, assert_problem, hone, http_request, keyed, metrics_value,
                             new_key, recv_until_closed)
from fixtures.probes import assert_free, assert_locked, pg_rows, redis_keys, start_held
from fixtures.upstream import FakeUpstream
from fixtures.waiting import free_port, in_thread, wait_for

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)

RELOADS = "idemproxy_config_reloads_total"
LAST_OK = "idemproxy_config_last_reload_successful"
NOTHING_CHANGED = "reload: the configuration has problems; nothing was changed"


# --------------------------------------------------------------------------- helpers
def log_text(p):
    """All of the proxy's stderr (Proxy.stderr() keeps only the last 30000 characters)."""
    with open(p.stderr_path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def reloads(p):
    m = p.metrics()
    return (metrics_value(m, RELOADS, {"result": "ok"}) or 0,
            metrics_value(m, RELOADS, {"result": "error"}) or 0)


def hup(p, path, ok=True, applied_line=True):
    """Sends SIGHUP and waits until the reload is done: counted ok (with its
    line "reload: PATH applied", unless the new log level hides it) or error
    (with its line "nothing was changed")."""
    ok0, err0 = reloads(p)
    if ok0 == err0 == 0:
        assert metrics_value(p.metrics(), LAST_OK) == 1, "before any reload"
    applied = "reload: %s applied" % path
    n_applied, n_failed = log_text(p).count(applied), log_text(p).count(NOTHING_CHANGED)
    p.proc.send_signal(signal.SIGHUP)
    if ok:
        wait_for(lambda: reloads(p) == (ok0 + 1, err0), timeout=10,
                 what="reload %s counted ok" % path)
        if applied_line:
            wait_for(lambda: log_text(p).count(applied) > n_applied, timeout=10,
                     what="the line '%s'" % applied)
    else:
        wait_for(lambda: reloads(p) == (ok0, err0 + 1), timeout=10,
                 what="reload %s counted error" % path)
        wait_for(lambda: log_text(p).count(NOTHING_CHANGED) > n_failed, timeout=10,
                 what="the line '%s'" % NOTHING_CHANGED)
    # The gauge the alert IdemproxyConfigReloadFailed reads: the last result.
    assert metrics_value(p.metrics(), LAST_OK) == (1 if ok else 0)


def write(path, text):
    path.write_text(text)
    return str(path)


def position(text, needle):
    """1-based (line, column) of the first occurrence of <needle> in <text>."""
    i = text.index(needle)
    line = text.count("\n", 0, i) + 1
    return line, i - (text.rfind("\n", 0, i) + 1) + 1


def requests_total(p, route, outcome):
    return metrics_value(p.metrics(), "idemproxy_requests_total",
                         {"route": route, "outcome": outcome}) or 0


def held_req(key, body=b"held"):
    return ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], body)


# --------------------------------------------------------------------------- 1. a valid file
V1 = """routes:
  - name: first
    match: {methods: [POST], path: /status/*}
    replay-header: X-First
"""

V2 = """routes:
  - name: strict
    match: {methods: [POST], path: /echo}
    require-key: true
  - name: internal
    match: {path: /internal/*}
    enforce: false
  - name: second
    match: {methods: [POST], path: /status/*}
    replay-header: X-Second
"""


def test_reload_applies_a_valid_file_to_later_requests(proxy, upstream, tmp_path):
    cfg = write(tmp_path / "idemproxy.yaml", V1)
    p = proxy("--config", cfg)

    # Before: no key needed on /echo, /internal/* enforced, X-First on /status/*.
    st, h, _ = p.request("POST", "/echo", body=b"no key")
    assert st == 201 and hone(h, REPLAY) is None, (st, h)
    k_int = new_key()
    st, h, _ = p.request(*keyed(k_int, path="/internal/a"))
    assert st == 200 and hone(h, REPLAY) == "false", (st, h)
    st, h, _ = p.request(*keyed(k_int, path="/internal/a"))
    assert st == 200 and hone(h, REPLAY) == "true", (st, h)
    k_old = new_key()
    st, h, _ = p.request(*keyed(k_old, path="/status/201"))
    assert st == 201 and hone(h, "X-First") == "false" and hone(h, "X-Second") is None, (st, h)

    write(tmp_path / "idemproxy.yaml", V2)
    hup(p, cfg)
    assert "reload: %s applied: 3 routes" % cfg in log_text(p)

    # After: the new routes, for every request that begins now.
    hits = upstream.hits()
    resp = p.request("POST", "/echo", body=b"no key")
    assert_problem(resp, 400, "idempotency_key_missing", "2.1")
    assert upstream.hits() == hits, "a keyless request on a require-key route was forwarded"
    k_int2 = new_key()
    for _ in range(2):
        st, h, _ = p.request(*keyed(k_int2, path="/internal/b"))
        assert st == 200 and hone(h, REPLAY) is None, (st, h)  # passthrough: no replay header
    assert upstream.hits("/internal/b") == 2
    k_new = new_key()
    st, h, _ = p.request(*keyed(k_new, path="/status/201"))
    assert st == 201 and hone(h, "X-Second") == "false" and hone(h, "X-First") is None, (st, h)
    assert hone(h, REPLAY) is None
    st, h, _ = p.request(*keyed(k_new, path="/status/201"))
    assert st == 201 and hone(h, "X-Second") == "true" and hone(h, "X-First") is None, (st, h)
    # A key stored before the reload is replayed under the route of the request
    # that asks now.
    before = upstream.hits()
    st, h, _ = p.request(*keyed(k_old, path="/status/201"))
    assert st == 201 and hone(h, "X-Second") == "true" and hone(h, "X-First") is None, (st, h)
    assert upstream.hits() == before

    assert requests_total(p, "strict", "missing_key") == 1
    assert requests_total(p, "internal", "passthrough") == 2
    assert requests_total(p, "second", "executed") == 1
    assert requests_total(p, "second", "replayed") == 2
    assert requests_total(p, "first", "executed") == 1
    assert "route=strict" in log_text(p)
    assert reloads(p) == (1, 0)


# --------------------------------------------------------------------------- 2. a running request
HOLD_OLD = """routes:
  - name: hold-old
    match: {methods: [POST], path: /hold}
    replay-header: X-Old
    no-cache-status: [200]
"""

HOLD_NEW = """routes:
  - name: hold-new
    match: {methods: [POST], path: /hold}
    replay-header: X-New
"""


def test_reload_running_request_keeps_its_route(proxy, upstream, tmp_path):
    """A request that began under hold-old (replay header X-Old, 200 not
    stored) finishes under it after a reload to hold-new (X-New, 200 stored);
    a request that begins after the reload runs under hold-new."""
    cfg = write(tmp_path / "idemproxy.yaml", HOLD_OLD)
    p = proxy("--config", cfg)
    key = new_key()
    first = start_held(p, key)  # the upstream has it: the key is locked

    write(tmp_path / "idemproxy.yaml", HOLD_NEW)
    hup(p, cfg)

    # A new request: hold-new's header, and its 200 is stored.
    upstream.release("free")
    k2 = new_key()
    st, h, b2 = p.request("POST", "/hold?id=free", [("Idempotency-Key", k2)], b"new")
    assert st == 200 and hone(h, "X-New") == "false" and hone(h, "X-Old") is None, (st, h)
    st, h, b = p.request("POST", "/hold?id=free", [("Idempotency-Key", k2)], b"new")
    assert st == 200 and hone(h, "X-New") == "true" and b == b2, (st, h)
    # The running one is still in flight for a duplicate.
    assert_locked(p, key, held_req(key))

    upstream.release(key)
    st, h, _ = first()
    # Its answer follows hold-old ...
    assert st == 200, (st, h)
    assert hone(h, "X-Old") == "false" and hone(h, "X-New") is None, h
    # ... and so does its storage: hold-old does not store a 200, so the lock
    # was released and the key runs again (now under hold-new).
    assert_free(p, key, held_req(key), replay_header="X-New")
    assert requests_total(p, "hold-old", "executed") == 1
    assert requests_total(p, "hold-new", "executed") == 2
    assert requests_total(p, "hold-new", "replayed") == 1
    assert requests_total(p, "hold-new", "in_flight") == 1


# --------------------------------------------------------------------------- 3. an invalid file
GOOD = """routes:
  - name: alpha
    match: {methods: [POST], path: /echo}
    replay-header: X-Alpha
"""

BAD = """nonsense: 1
routes:
  - name: alpha
    match: {methods: [POST], path: /echo}
    replay-header: X-Broken
    ttl: abc
    bogus: 1
  - name: Alpha
    match: {path: nowhere}
"""

NOT_YAML = """routes:
  - name: alpha
    match: {methods: [POST], path: /echo
    replay-header: X-Broken
"""

FIXED = """routes:
  - name: alpha
    match: {methods: [POST], path: /echo}
    replay-header: X-Fixed
"""


def test_reload_invalid_file_changes_nothing(proxy, upstream, tmp_path):
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, GOOD)
    p = proxy("--config", cfg)
    k1 = new_key()
    st, h, _ = p.request(*keyed(k1))
    assert st == 201 and hone(h, "X-Alpha") == "false", (st, h)

    # Every problem, each on its own line with its position.
    write(path, BAD)
    hup(p, cfg, ok=False)
    log = log_text(p)
    expected = [
        (position(BAD, "nonsense"), "unknown key 'nonsense'"),
        (position(BAD, "abc"), "ttl: 'abc' is not a positive number of seconds"),
        (position(BAD, "bogus"), "route: unknown key 'bogus'"),
        (position(BAD, "Alpha"), "name: 'Alpha' is not a route name"),
        (position(BAD, "nowhere"), "match.path: 'nowhere' is not a path"),
    ]
    for (line, col), msg in expected:
        want = "reload: %s:%d:%d: %s" % (cfg, line, col, msg)
        assert want in log, "missing %r in:\n%s" % (want, log)
    assert NOTHING_CHANGED in log
    assert "reload: %s applied" % cfg not in log
    assert reloads(p) == (0, 1)

    def unchanged():
        st, h, _ = p.request(*keyed(new_key()))
        assert st == 201 and hone(h, "X-Alpha") == "false" and hone(h, "X-Broken") is None, h
        before = upstream.hits()
        st, h, _ = p.request(*keyed(k1))
        assert st == 201 and hone(h, "X-Alpha") == "true", h
        assert upstream.hits() == before

    unchanged()

    # YAML that does not parse: libyaml's position.
    write(path, NOT_YAML)
    hup(p, cfg, ok=False)
    line, col = position(NOT_YAML, ": X-Broken")  # where libyaml finds out
    want = "reload: %s:%d:%d: did not find expected ',' or '}'" % (cfg, line, col)
    assert want in log_text(p), log_text(p)
    assert reloads(p) == (0, 2)
    unchanged()

    # No file at all.
    path.unlink()
    hup(p, cfg, ok=False)
    want = "reload: %s: cannot read the configuration file: No such file or directory" % cfg
    assert want in log_text(p), log_text(p)
    assert reloads(p) == (0, 3)
    unchanged()

    # A valid one again applies.
    write(path, FIXED)
    hup(p, cfg)
    assert reloads(p) == (1, 3)
    st, h, _ = p.request(*keyed(new_key()))
    assert st == 201 and hone(h, "X-Fixed") == "false" and hone(h, "X-Alpha") is None, h
    assert p.alive()


# --------------------------------------------------------------------------- 4. restart settings
def _served_connections(p, n):
    """n kept-alive connections, each served once; None when one was refused."""
    conns = []
    try:
        for _ in range(n):
            c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=3)
            c.request("GET", "/echo")
            r = c.getresponse()
            r.read()
            if r.status != 201:
                raise OSError("status %d" % r.status)
            conns.append(c)
        return conns
    except (OSError, http.client.HTTPException):
        for c in conns:
            c.close()
        return None


def _refused(p):
    """True when a new connection is refused or closed unanswered (or answered 503)."""
    try:
        s = socket.create_connection(("127.0.0.1", p.port), timeout=3)
    except ConnectionRefusedError:
        return True
    try:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = recv_until_closed(s, "a connection beyond --max-connections")
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.close()
    return data == b"" or data.startswith(b"HTTP/1.1 503")


def test_reload_restart_settings_keep_their_value(proxy, upstream, redis_server, tmp_path):
    """listen, admin-listen, upstream, redis, memory-max-bytes,
    max-connections (doc/configuration.md, Reloading), and key-prefix,
    store-timeout, upstream-timeout, upstream-late-timeout, client-timeout,
    admin-token-file, redis-wait-timeout and redis-password-file (main.c)
    are logged as needing a restart and keep their value; the rest of the
    file applies."""
    other = FakeUpstream().start()
    try:
        p = proxy(upstream_url=False, redis_arg=False, start=False)
        p.args = [p.args[0]] + p.args[5:]  # no --listen/--admin-listen flags: the file's
        redis_line = "redis: %s\n" % redis_server.url if p.store == "redis" else ""
        if p.store == "postgresql":  # the store's URL from the file too, not the flag
            i = p.args.index("--store")
            redis_line = "store: %s\n" % p.args[i + 1]
            del p.args[i:i + 2]
        token = tmp_path / "token"
        token.write_text("a-token-of-forty-characters-or-so-000000\n")
        start = ("listen: 127.0.0.1:%d\nadmin-listen: 127.0.0.1:%d\nupstream: %s\n%s"
                 "max-connections: 2\nupstream-timeout: 1\nkey-prefix: \"idemA:\"\n"
                 "routes:\n  - name: echo\n    match: {path: /echo}\n"
                 "    replay-header: X-Before\n"
                 % (p.port, p.admin_port, upstream.url, redis_line))
        new_port, new_admin = free_port(), free_port()
        store_key = "store" if p.store == "postgresql" else "redis"
        store_url = ("postgresql://postgres@127.0.0.1:%d/postgres" if store_key == "store"
                     else "redis://127.0.0.1:%d")
        after = (("listen: 127.0.0.1:%d\nadmin-listen: 127.0.0.1:%d\nupstream: %s\n"
                  + store_key + ": " + store_url + "\nmemory-max-bytes: 64M\n"
                  "max-connections: 100\n"
                  "key-prefix: \"idemB:\"\nstore-timeout: 2\nupstream-timeout: 10\n"
                  "upstream-late-timeout: 5\n"
                  "client-timeout: 60\nadmin-token-file: %s\nredis-wait-timeout: 0.2\n"
                  "redis-password-file: %s\n"
                  "routes:\n  - name: echo\n    match: {path: /echo}\n"
                  "    replay-header: X-After\n")
                 % (new_port, new_admin, other.url, free_port(), token, token))
        cfg = write(tmp_path / "idemproxy.yaml", start)
        p.args += ["--config", cfg]
        p.start()
        k_before = new_key()
        st, h, _ = p.request(*keyed(k_before))
        assert st == 201 and hone(h, "X-Before") == "false", (st, h)

        write(tmp_path / "idemproxy.yaml", after)
        hup(p, cfg)
        log = log_text(p)
        for name in ("listen", "admin-listen", "upstream", store_key, "memory-max-bytes",
                     "max-connections", "key-prefix", "store-timeout", "upstream-timeout",
                     "upstream-late-timeout", "client-timeout", "admin-token-file",
                     "redis-wait-timeout", "redis-password-file"):
            want = "reload: %s changed: it needs a restart, and keeps its value until then" % name
            assert want in log, "missing %r in:\n%s" % (want, log)
        assert ("reload: %s applied: 1 routes; see above for what needs a restart" % cfg) in log

        # The route applies ...
        k = new_key()
        st, h, body = p.request(*keyed(k))
        assert st == 201 and hone(h, "X-After") == "false" and hone(h, "X-Before") is None, h
        # ... through the old upstream, on the old store, under the old key prefix.
        assert upstream.received("Idempotency-Key", k) == 1
        assert other.hits() == 0
        if p.store == "redis":
            assert len(redis_keys(p.rdb, k, prefix="idemA:")) == 1
            assert redis_keys(p.rdb, k, prefix="idemB:") == []
        if p.store == "postgresql":
            assert len(pg_rows(p.pg, k, prefix="idemA:")) == 1
            assert pg_rows(p.pg, k, prefix="idemB:") == []
        before = upstream.hits()
        st, h, _ = p.request(*keyed(k_before))
        assert st == 201 and hone(h, "X-After") == "true", h  # stored under idemA:, found
        assert upstream.hits() == before
        # The admin listener is where it was, /keys still without a token, and
        # it shows the old prefix (on both stores).
        st, _, out = p.admin_request("GET", "/keys/" + urllib.parse.quote(k, safe=""))
        assert st == 200, (st, out)
        recs = json.loads(out)["records"]
        assert len(recs) == 1 and recs[0]["store_key"].startswith("idemA:"), recs
        # Nothing listens on the new addresses.
        for port in (new_port, new_admin):
            with pytest.raises(OSError):
                http_request("127.0.0.1", port, "GET", "/healthz", timeout=2)
        # upstream-timeout is still 1 s.
        t0 = time.monotonic()
        resp = p.request(*keyed(new_key(), path="/slow?ms=3000"))
        assert_problem(resp, 504, "upstream_timeout")
        assert time.monotonic() - t0 < 2.5
        # max-connections is still 2: two served connections, a third refused.
        held = wait_for(lambda: _served_connections(p, 2), timeout=10,
                        what="two served connections")
        try:
            time.sleep(0.2)
            assert _refused(p), "a third connection was served: max-connections changed"
        finally:
            for c in held:
                c.close()
        assert reloads(p) == (1, 0)
    finally:
        other.stop()


# --------------------------------------------------------------------------- 5. nothing dropped
FLIP = """routes:
  - name: %s
    match: {methods: [POST], path: /echo}
    replay-header: %s
"""


class _CountingConnection(http.client.HTTPConnection):
    connects = 0

    def connect(self):
        self.connects += 1
        super().connect()


def test_reload_drops_no_connection_or_request(proxy, upstream, tmp_path):
    """Four clients, each on one kept-alive connection, send keyed POSTs (every
    third a duplicate of the one before) for as long as ten reloads take,
    alternating two valid files."""
    path = tmp_path / "idemproxy.yaml"
    files = [FLIP % ("flip", "X-Flip"), FLIP % ("flop", "X-Flop")]
    cfg = write(path, files[0])
    p = proxy("--config", cfg)
    stop = threading.Event()
    results = {}  # thread -> [(key, dup, status, headers, body)]
    errors = []
    conns = {}
    run = "%x" % time.monotonic_ns()

    def client(tid):
        c = _CountingConnection("127.0.0.1", p.port, timeout=15)
        conns[tid] = c
        out = results.setdefault(tid, [])
        i = 0
        try:
            while not stop.is_set():
                dup = i % 3 == 2
                n = i - 1 if dup else i
                key = "rl-%s-%d-%d" % (run, tid, n)
                c.request("POST", "/echo", body=b"body-%d" % n,
                          headers={"Idempotency-Key": key})
                r = c.getresponse()
                out.append((key, dup, r.status, r.getheaders(), r.read()))
                i += 1
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append((tid, repr(e)))
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all(len(results.get(t, ())) >= 3 for t in range(4)), timeout=10,
                 what="every client to be under way")
        for n in range(10):
            write(path, files[(n + 1) % 2])
            hup(p, cfg)
            time.sleep(0.25)
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert errors == [], errors
    assert reloads(p) == (10, 0)
    assert all(conns[t].connects == 1 for t in range(4)), \
        "a kept-alive connection was dropped: %r" % {t: conns[t].connects for t in range(4)}

    total, seen, keys = 0, set(), set()
    for tid, out in results.items():
        for key, dup, st, h, body in out:
            total += 1
            keys.add(key)
            if st == 409:  # a duplicate right after the answer, before the store completed
                assert dup, (key, st, body)
                obj = json.loads(body)
                assert obj["code"] == "idempotency_key_in_use", obj
                continue
            assert st == 201, (key, st, body[:200])
            names = [n for n in ("X-Flip", "X-Flop") if hone(h, n) is not None]
            assert len(names) == 1, (key, h)
            seen.add(names[0])
            assert hone(h, names[0]) == ("true" if dup else "false"), (key, dup, h)
            assert hone(h, REPLAY) is None, h
    assert total >= 40, "only %d requests overlapped the reloads" % total
    assert seen == {"X-Flip", "X-Flop"}, seen
    # Every key ran once (counted in one pass: upstream.received() per key is slow).
    ran = collections.Counter(v for _, _, headers, _ in list(upstream.requests)
                              for k, v in headers if k.lower() == "idempotency-key")
    assert set(ran) == keys, keys ^ set(ran)
    assert all(n == 1 for n in ran.values()), {k: n for k, n in ran.items() if n != 1}


# --------------------------------------------------------------------------- 6. log level, format
LOGS = """log-level: %s
log-format: %s
routes:
  - name: logs
    match: {methods: [POST], path: /echo}
"""


def test_reload_applies_log_level_and_format(proxy, upstream, tmp_path):
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, LOGS % ("info", "text"))
    p = proxy("--config", cfg)
    k1 = new_key()
    assert p.request(*keyed(k1))[0] == 201
    assert "access POST /echo 201 executed route=logs key=%s" % k1 in log_text(p)

    # warn: no access line for later requests (it is written before the answer).
    write(path, LOGS % ("warn", "text") + "max-connections: 77\n")
    hup(p, cfg)  # "applied" is written at the level in force until then: info
    assert "reload: max-connections changed" in log_text(p)  # warnings still show
    k2 = new_key()
    assert p.request(*keyed(k2))[0] == 201
    assert p.request(*keyed(k2))[0] == 201
    assert k2 not in log_text(p)

    # info again, as JSON: one JSON object per line, with the route.
    write(path, LOGS % ("info", "json"))
    # (the "applied" line is written before the new level and format apply:
    # under warn, it is not written at all)
    hup(p, cfg, applied_line=False)
    k3 = new_key()
    assert p.request(*keyed(k3))[0] == 201
    lines = [json.loads(l) for l in log_text(p).splitlines() if l.startswith("{") and k3 in l]
    assert len(lines) == 1, log_text(p)[-2000:]
    a = lines[0]
    assert a["msg"] == "access" and a["route"] == "logs" and a["key"] == k3, a
    assert a["outcome"] == "executed" and a["status"] == 201, a
    assert k2 not in log_text(p)


def test_reload_applies_key_header_on_store_error_and_shutdown_timeout(proxy, upstream, tmp_path):
    """key-header, on-store-error and shutdown-timeout need no restart: a
    reload applies them, and says nothing of a restart."""
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, "key-header: K-One\nshutdown-timeout: 10\n")
    p = proxy("--config", cfg)
    k1 = new_key()
    assert hone(p.request(*keyed(k1, header="K-One"))[1], REPLAY) == "false"
    assert hone(p.request(*keyed(k1, header="K-One"))[1], REPLAY) == "true"

    write(path, "key-header: K-Two\nshutdown-timeout: 0.5\non-store-error: passthrough\n")
    hup(p, cfg)
    log = log_text(p)
    for name in ("key-header", "shutdown-timeout", "on-store-error"):
        assert "reload: %s changed" % name not in log, log[-2000:]
    # The new header is the key now; the old one is any header (passthrough).
    k2 = new_key()
    assert hone(p.request(*keyed(k2, header="K-Two"))[1], REPLAY) == "false"
    assert hone(p.request(*keyed(k2, header="K-Two"))[1], REPLAY) == "true"
    st, h, _ = p.request(*keyed(k1, header="K-One"))
    assert st == 201 and hone(h, REPLAY) is None, (st, h)
    # And the drain waits the new --shutdown-timeout.
    assert p.stop() == 0
    assert "open requests (up to 0.5 s)" in log_text(p), log_text(p)[-2000:]


# --------------------------------------------------------------------------- 7. wait
NO_WAIT = """routes:
  - name: plain
    match: {path: /echo}
"""

ADDS_WAIT = """routes:
  - name: plain
    match: {path: /echo}
  - name: waiter
    match: {methods: [POST], path: /hold}
    wait: 5
"""


def test_reload_wait_when_none_waited_at_start_needs_a_restart(proxy, upstream, tmp_path):
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, NO_WAIT)
    p = proxy("--config", cfg)
    write(path, ADDS_WAIT)
    hup(p, cfg)
    want = ("reload: route waiter: wait needs a restart (no route waited at start, so the "
            "notifications of --wait are not subscribed to); it answers 409 at once until then")
    assert want in log_text(p), log_text(p)

    key = new_key()
    first = start_held(p, key)
    t0 = time.monotonic()
    assert_locked(p, key, held_req(key))  # 409 idempotency_key_in_use, upstream not called
    assert time.monotonic() - t0 < 1.0, "the duplicate was held"
    upstream.release(key)
    st, h, _ = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert requests_total(p, "waiter", "in_flight") == 1
    assert requests_total(p, "waiter", "executed") == 1


WAITS_AT_START = """routes:
  - name: plain
    match: {path: /echo}
    wait: 5
"""

WAITS_TOO = """routes:
  - name: plain
    match: {path: /echo}
    wait: 5
  - name: waiter
    match: {methods: [POST], path: /hold}
    wait: 5
"""


def test_reload_wait_on_a_new_route_when_one_waited_at_start(proxy, upstream, tmp_path):
    """The contrast: with a route that waited at start, a route given `wait`
    by a reload holds its duplicates and replays them."""
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, WAITS_AT_START)
    p = proxy("--config", cfg)
    write(path, WAITS_TOO)
    hup(p, cfg)
    assert "wait needs a restart" not in log_text(p)

    key = new_key()
    first = start_held(p, key)
    dup = in_thread(p.request, *held_req(key), timeout=30)
    time.sleep(0.5)
    assert requests_total(p, "waiter", "in_flight") == 0  # held, not answered
    upstream.release(key)
    st1, h1, b1 = first()
    st, h, b = dup()
    assert st1 == 200 and hone(h1, REPLAY) == "false", h1
    assert st == 200 and hone(h, REPLAY) == "true" and b == b1, (st, h)
    assert upstream.hits("/hold") == 1
    assert requests_total(p, "waiter", "replayed") == 1


TWO_WAITERS = """routes:
  - name: plain
    match: {path: /echo}
  - name: waiter-a
    match: {methods: [POST], path: /a}
    wait: 5
  - name: waiter-b
    match: {methods: [POST], path: /b}
    wait: 5
  - name: short-lock
    match: {methods: [POST], path: /c}
    lock-ttl: 5
"""


def test_reload_logs_every_route_whose_wait_or_lock_ttl_needs_a_restart(proxy, upstream,
                                                                          tmp_path):
    """Each route that answers differently from its file until a restart is
    named in the log, not only the last one."""
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, NO_WAIT)
    p = proxy("--config", cfg)
    write(path, TWO_WAITERS)
    hup(p, cfg)
    log = log_text(p)
    for name in ("waiter-a", "waiter-b"):
        want = "reload: route %s: wait needs a restart" % name
        assert want in log, "missing %r in:\n%s" % (want, log)
    want = "reload: route short-lock: a lock-ttl shorter than at start (30000 ms) needs a restart"
    assert want in log, "missing %r in:\n%s" % (want, log)


def test_reload_max_response_past_the_start_capture_needs_a_restart(proxy, upstream, tmp_path):
    """The upstream clients cap an answer at start (4 x the largest
    max-response, at least 64 MiB): a reload whose route asks for more says
    that it needs a restart; one within the cap does not."""
    path = tmp_path / "idemproxy.yaml"
    cfg = write(path, "routes:\n  - {name: a, match: {path: /a}}\n")
    p = proxy("--config", cfg)
    write(path, "routes:\n  - {name: a, match: {path: /a}, max-response: 8M}\n")
    hup(p, cfg)
    assert "max-response this large needs a restart" not in log_text(p)
    write(path, "memory-max-bytes: 256M\n"
                "routes:\n  - {name: a, match: {path: /a}, max-response: 20M}\n")
    hup(p, cfg)
    assert "reload: a max-response this large needs a restart" in log_text(p)
    assert p.request(*keyed(new_key()))[0] == 201  # the rest applied, still serving
