"""Unknown outcomes (doc/guarantees.md, Unknown outcomes): a request that
may have run upstream without an answer being stored makes its key unknown,
and every later request with the key gets 502 idempotency_outcome_unknown
without reaching the upstream; a failure where nothing reached the upstream
releases the lock as before. Each cause against a socket that behaves that
way, on both stores: a sleep past the timeout (with and without a late
answer), a reset after the request was read, one that never accepts (a
connect timeout), a TLS handshake that fails, a name that does not resolve
(an upstream not listening is test_upstream.py's
test_upstream_unreachable_then_up), and the holder lost (SIGSTOP past
--lock-ttl, on two proxies sharing Redis), with the holder coming back. Then
the policy per route, --wait, /keys, the metrics and the log. The resets
mid-answer are test_faults.py's; the proxy killed mid-request is
test_faults.py's too."""
import json
import signal
import socket
import textwrap
import time

import pytest

from fixtures.client import (REPLAY, assert_problem, hone, http_request, keyed, metrics_value,
                             new_key)
from fixtures.marks import memory_only, redis_only, shared_store, store_independent
from fixtures.probes import (assert_completed, assert_locked, assert_unknown, redis_keys,
                             redis_state, start_held, stored_cause, stored_state)
from fixtures.proxy import run_binary
from fixtures.redis import RedisServer
from fixtures.upstream import FakeUpstream
from fixtures.waiting import in_thread, wait_for

# Also run under ThreadSanitizer (scripts/test), and on both upstream clients.
pytestmark = [pytest.mark.concurrency, pytest.mark.both_clients]


def unknown_count(p, cause, route="default"):
    return metrics_value(p.metrics(), "idemproxy_unknown_outcomes_total",
                         {"route": route, "cause": cause}) or 0.0


def outcome_count(p, outcome, route="default"):
    return metrics_value(p.metrics(), "idemproxy_requests_total",
                         {"route": route, "outcome": outcome}) or 0.0


def replayed_when_stored(p, req, timeout=6):
    """Polls <req> (409 while in flight) until it is replayed; returns the answer."""
    def probe():
        st, h, b = p.request(*req)
        if st == 409:
            return None
        assert hone(h, REPLAY) == "true", (st, h, b[:200])
        return st, h, b
    return wait_for(probe, timeout=timeout, interval=0.1, what="a replay of the late answer")


# ------------------------------------------------------------------ nothing reached the upstream
@store_independent
def test_connect_timeout_releases(proxy):
    """A listener that never accepts (its backlog full: the SYN is dropped):
    the connection is never up within --upstream-timeout: 504, released."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):  # fill the accept queue
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        time.sleep(0.2)
        p = proxy("--upstream-timeout", "0.5", upstream_url="http://127.0.0.1:%d" % port)
        key = new_key()
        t0 = time.monotonic()
        assert_problem(p.request(*keyed(key)), 504, "upstream_timeout")
        assert time.monotonic() - t0 < 2.5
        if p.store == "redis":
            assert redis_keys(p.rdb, key) == []
        assert "may have reached it" not in p.stderr()
        assert unknown_count(p, "upstream_timeout") == 0
        # Released: the next try runs (and times out connecting) again.
        assert_problem(p.request(*keyed(key)), 504, "upstream_timeout")
    finally:
        for c in fillers:
            c.close()
        srv.close()


@store_independent
def test_tls_handshake_failure_and_unresolvable_name_release(proxy):
    """https to a plain HTTP server (the handshake fails before the request is
    written) and a name that does not resolve: 502, released."""
    plain = FakeUpstream().start()
    try:
        for url in ("https://127.0.0.1:%d" % plain.port, "http://nonexistent.invalid:80"):
            p = proxy(upstream_url=url)
            key = new_key()
            assert_problem(p.request(*keyed(key)), 502, "upstream_unavailable")
            assert_problem(p.request(*keyed(key)), 502, "upstream_unavailable")  # released
            assert outcome_count(p, "upstream_error") == 2
            assert outcome_count(p, "outcome_unknown") == 0
        assert plain.hits() == 0
    finally:
        plain.stop()


# ------------------------------------------------------------------ the upstream had the request
def test_reset_after_reading_is_unknown(proxy, upstream):
    """The upstream read the request, then reset: unknown (upstream_reset):
    the retry gets 502 with X-Should-Retry: false and never reaches it; another
    payload with the key is still a mismatch; counted, logged once per key,
    and the access line of the request that made it unknown says so."""
    p = proxy()
    key = new_key()
    req = ("POST", "/reset", [("Idempotency-Key", key)], b"pay")
    assert_problem(p.request(*req), 502, "upstream_unavailable")
    for _ in range(2):
        assert_unknown(p, req, path="/reset")
    assert_problem(p.request("POST", "/reset", [("Idempotency-Key", key)], b"other"), 422,
                   "idempotency_key_mismatch", "2.2")
    assert upstream.hits("/reset") == 1
    assert unknown_count(p, "upstream_reset") == 1
    assert outcome_count(p, "outcome_unknown") == 2
    err = p.stderr()
    assert err.count("outcome unknown (upstream_reset)") == 1, err
    lines = [ln for ln in err.splitlines() if " access " in ln and key in ln]
    assert "unknown=upstream_reset" in lines[0] and " 502 upstream_error " in lines[0], lines
    assert all("unknown=" not in ln for ln in lines[1:]), lines
    assert [" 502 outcome_unknown " in ln for ln in lines[1:]] == [True, True, False], lines


def test_timeout_without_late_answer_is_unknown(proxy, upstream):
    """No answer within --upstream-timeout nor --upstream-late-timeout: 504 at
    the first, in flight until the second, then unknown (upstream_timeout)."""
    p = proxy("--upstream-timeout", "0.5", "--upstream-late-timeout", "1")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key), ("X-Request-Id", "rq-" + key)],
           b"pay")
    t0 = time.monotonic()
    assert_problem(p.request(*req), 504, "upstream_timeout")
    assert time.monotonic() - t0 < 1.2
    assert_locked(p, key, req)
    wait_for(lambda: unknown_count(p, "upstream_timeout") == 1, timeout=5,
             what="the late timeout to run out")
    assert time.monotonic() - t0 >= 1.4
    # The 504's access line went out at the timeout, without unknown=: a line
    # that greps as unknown= names the request, its client and its target
    # (doc/operations.md, Metrics and access log).
    p.wait_log("unknown=upstream_timeout", timeout=5)
    lines = [ln for ln in p.stderr().splitlines() if "unknown=upstream_timeout" in ln]
    assert len(lines) == 1, lines
    assert "request_id=rq-%s" % key in lines[0] and "client=127.0.0.1" in lines[0], lines
    assert "/hold?id=%s" % key in lines[0], lines
    upstream.release(key)  # the answer comes too late: nothing changes
    time.sleep(0.2)
    assert_unknown(p, req, path="/hold")
    assert upstream.hits("/hold") == 1
    if p.store == "redis":
        assert redis_state(p.rdb, key) == "U"


@pytest.mark.parametrize("status,stored", [(201, True), (503, False)])
def test_late_answer_completes_or_releases(proxy, upstream, status, stored):
    """A late answer within --upstream-late-timeout: cacheable, it completes
    the key (later duplicates are replayed); not cacheable, it releases it (the
    next retry runs). Neither makes the key unknown."""
    p = proxy("--upstream-timeout", "0.5", "--upstream-late-timeout", "5")
    key = new_key()
    req = keyed(key, path="/slow?ms=1500&status=%d" % status, body=b"late")
    assert_problem(p.request(*req), 504, "upstream_timeout")
    assert_locked(p, key, req)
    if stored:
        st, h, b = replayed_when_stored(p, req)
        assert st == 201 and json.loads(b)["slept_ms"] == 1500
        assert upstream.hits("/slow") == 1
    else:
        wait_for(lambda: p.request(*req)[0] != 409, timeout=6, interval=0.1,
                 what="the late 503 to release the key")
        assert upstream.hits("/slow") == 2  # released: the retry ran
    assert unknown_count(p, "upstream_timeout") == 0


def test_late_exchange_survives_the_client_and_shutdown_waits_for_it(proxy, upstream):
    """The client that got its 504 hangs up; on SIGTERM the proxy waits for
    the late exchange (within --shutdown-timeout), which completes the key."""
    p = proxy("--upstream-timeout", "0.3", "--shutdown-timeout", "5")
    key = new_key()
    req = keyed(key, path="/slow?ms=1500", body=b"late")
    assert_problem(p.request(*req), 504, "upstream_timeout")
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert time.monotonic() - t0 >= 0.8, "shutdown did not wait for the late exchange"
    if p.store == "redis":
        assert redis_state(p.rdb, key) == "C"


@shared_store
def test_shutdown_cuts_a_late_exchange_unknown_shared_redis(proxy, upstream, rdb):
    """A late exchange still running at --shutdown-timeout is cut: its key is
    unknown (upstream_timeout) for every other proxy."""
    p = proxy("--upstream-timeout", "0.3", "--shutdown-timeout", "0.5")
    other = proxy()
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"pay")
    assert_problem(p.request(*req), 504, "upstream_timeout")
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert stored_state(other, key) == "U"
    assert stored_cause(other, key) == "upstream_timeout"
    upstream.release(key)
    assert_unknown(other, req, path="/hold")


# ------------------------------------------------------------------ the holder lost
@shared_store
def test_frozen_holder_lost_then_comes_back_shared_redis(proxy, upstream, rdb):
    """Two proxies on one Redis. The first is frozen (SIGSTOP) past --lock-ttl
    while its request is at the upstream: the second finds the lease run out:
    unknown (holder_lost), 502, the upstream not called. The first thaws, gets
    its answer and completes the key with its own token: from then on
    duplicates are replayed, and the request ran once."""
    p1 = proxy("--lock-ttl", "1")
    p2 = proxy("--lock-ttl", "1")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"pay")
    first = start_held(p1, key, body=b"pay")
    p1.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: p2.request(*req)[0] != 409, timeout=5, interval=0.1,
                 what="the frozen holder's lease to run out")
        assert unknown_count(p2, "holder_lost") == 1
        assert_unknown(p2, req, path="/hold")
        upstream.release(key)
    finally:
        p1.proc.send_signal(signal.SIGCONT)
    st, h, body = first(timeout=10)
    assert st == 200 and hone(h, REPLAY) == "false"
    wait_for(lambda: stored_state(p2, key) == "C", timeout=5, what="the holder's complete")
    assert_completed(p2, key, req, body=body)
    assert upstream.hits("/hold") == 1


def test_frozen_single_proxy_never_runs_a_key_twice(proxy, upstream, rdb):
    """One proxy frozen past its lease while its request is at the upstream
    (on the memory store the store freezes with it): once thawed, its
    heartbeat and a duplicate race, so the duplicate gets 409 (the lease
    renewed first) or 502 unknown (found lapsed first), never a second
    execution, and the holder's client gets its answer."""
    p = proxy("--lock-ttl", "0.3")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"pay")
    first = start_held(p, key, body=b"pay")
    p.proc.send_signal(signal.SIGSTOP)  # the heartbeat stops with it
    time.sleep(0.8)
    p.proc.send_signal(signal.SIGCONT)
    # Thawed, its heartbeat may renew the lease before anyone looks: either
    # way the key is never run twice.
    st, h, b = p.request(*req)
    assert st in (409, 502), (st, b[:200])
    upstream.release(key)
    assert first(timeout=10)[0] == 200
    assert upstream.hits("/hold") == 1


# ------------------------------------------------------------------ policy, --wait, operators
def test_retry_per_route(proxy, upstream, tmp_path):
    """on-unknown-outcome per route: a webhook route retries (at least once),
    the top level refuses."""
    cfg = tmp_path / "routes.yaml"
    cfg.write_text(textwrap.dedent("""
        routes:
          - name: webhooks
            match: {methods: [PUT], path: /reset}
            on-unknown-outcome: retry
    """).lstrip())
    p = proxy("--config", str(cfg))
    hook, pay = new_key(), new_key()
    hook_req = ("PUT", "/reset", [("Idempotency-Key", hook)], b"event")
    assert_problem(p.request(*hook_req), 502, "upstream_unavailable")
    assert_problem(p.request(*hook_req), 502, "upstream_unavailable")  # ran again
    assert upstream.hits("/reset") == 2
    assert unknown_count(p, "upstream_reset", route="webhooks") == 0
    pay_req = ("POST", "/reset", [("Idempotency-Key", pay)], b"pay")
    assert_problem(p.request(*pay_req), 502, "upstream_unavailable")
    assert_unknown(p, pay_req, path="/reset")
    assert upstream.hits("/reset") == 3
    assert unknown_count(p, "upstream_reset") == 1


def test_wait_duplicates_get_the_unknown_answer(proxy, upstream):
    """Duplicates held by --wait while the first request's answer is lost get
    the 502 as soon as the key becomes unknown."""
    p = proxy("--wait", "10", "--upstream-timeout", "0.5", "--upstream-late-timeout", "0.5")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"pay")
    first = start_held(p, key, body=b"pay")
    dups = [in_thread(p.request, *req, timeout=20) for _ in range(2)]
    time.sleep(0.2)  # held by --wait
    assert_problem(first(timeout=5), 504, "upstream_timeout")
    t0 = time.monotonic()
    for d in dups:
        assert_problem(d(timeout=10), 502, "idempotency_outcome_unknown")
    assert time.monotonic() - t0 < 3
    assert upstream.hits("/hold") == 1


def test_delete_resolves_an_unknown_key(proxy, upstream):
    """DELETE /keys/<key> releases an unknown key: its next retry runs."""
    p = proxy()
    key = new_key()
    req = ("POST", "/reset", [("Idempotency-Key", key)], b"pay")
    assert_problem(p.request(*req), 502, "upstream_unavailable")
    st, h, b = p.admin_request("GET", "/keys/%s" % key)
    assert st == 200, b
    rec = json.loads(b)["records"][0]
    assert rec["state"] == "unknown" and rec["cause"] == "upstream_reset", rec
    assert rec["route"] == "default" and rec["method"] == "POST" and rec["target"] == "/reset"
    st, _, b = p.admin_request("DELETE", "/keys/%s?scope=%s" % (key, rec["scope"]))
    assert st == 200, b
    assert "deleted by the operator at 127.0.0.1" in p.stderr()
    assert_problem(p.request(*req), 502, "upstream_unavailable")  # ran again
    assert upstream.hits("/reset") == 2


def keys_call(p, method, path, body=None):
    headers = [("Content-Type", "application/json")] if body is not None else None
    st, h, b = http_request("127.0.0.1", p.admin_port, method, path, headers,
                            json.dumps(body).encode() if isinstance(body, dict) else body, 5.0)
    return st, json.loads(b)


def test_keys_list_unknown_then_put_resolves(proxy, upstream):
    """GET /keys?state=unknown lists the unknown keys (key, scope, route, cause,
    method, target, age), page by page; PUT /keys/<key>?scope= completes one
    with the operator's answer, which its duplicates then get as a replay;
    only an unknown key takes one (409 otherwise); both are logged with the
    operator's address."""
    p = proxy()
    k1, k2, k3 = new_key(), new_key(), new_key()
    for k in (k1, k2):
        assert p.request("POST", "/reset?n=1", [("Idempotency-Key", k)], b"pay")[0] == 502
    assert p.request(*keyed(k3))[0] == 201
    found, cursor, pages = {}, None, 0
    while True:
        st, out = keys_call(p, "GET", "/keys?state=unknown" + (
            "&cursor=" + cursor if cursor else ""))
        assert st == 200, out
        pages += 1
        for r in out["records"]:
            found[r["key"]] = r
        cursor = out["next_cursor"]
        if cursor is None:
            break
        assert pages < 100
    assert set(found) == {k1, k2}, found
    r = found[k1]
    assert (r["state"], r["cause"], r["route"], r["method"], r["target"]) == (
        "unknown", "upstream_reset", "default", "POST", "/reset?n=1"), r
    assert r["age_ms"] >= 0 and len(r["scope"]) == 32
    assert keys_call(p, "GET", "/keys?state=locked")[0] == 400

    answer = {"status": 201, "headers": [["Content-Type", "application/json"], ["X-Op", "yes"]],
              "body": '{"id": "pay_1"}'}
    path = "/keys/%s?scope=%s" % (k1, r["scope"])
    assert keys_call(p, "PUT", path, b"{not json")[0] == 400
    assert keys_call(p, "PUT", path, {"status": 99})[0] == 400
    st, out = keys_call(p, "PUT", path, answer)
    assert st == 200, out
    assert "resolved by the operator at 127.0.0.1" in p.stderr()
    st, h, b = p.request("POST", "/reset?n=1", [("Idempotency-Key", k1)], b"pay")
    assert (st, hone(h, REPLAY), hone(h, "X-Op"), b) == (201, "true", "yes", b'{"id": "pay_1"}')
    date = hone(h, "Date")  # the resolution's, kept: every replay carries the same one
    time.sleep(1.1)
    st, h, _ = p.request("POST", "/reset?n=1", [("Idempotency-Key", k1)], b"pay")
    assert st == 201 and [v for n, v in h if n.lower() == "date"] == [date], h
    not_unknown = (409, "conflict")
    st, out = keys_call(p, "PUT", path, answer)  # not unknown any more
    assert (st, out.get("code")) == not_unknown, out
    scope3 = keys_call(p, "GET", "/keys/%s" % k3)[1]["records"][0]["scope"]
    st, out = keys_call(p, "PUT", "/keys/%s?scope=%s" % (k3, scope3), answer)
    assert (st, out.get("code")) == not_unknown, out
    b64 = {"status": 200, "body_base64": "AAEC/w=="}
    scope2 = found[k2]["scope"]
    assert keys_call(p, "PUT", "/keys/%s?scope=%s" % (k2, scope2), b64)[0] == 200
    st, h, b = p.request("POST", "/reset?n=1", [("Idempotency-Key", k2)], b"pay")
    assert (st, b) == (200, b"\x00\x01\x02\xff")
    assert upstream.hits("/reset") == 2
    st, out = keys_call(p, "GET", "/keys?state=unknown")
    assert out["records"] == [] or all(r["key"] not in (k1, k2) for r in out["records"])


# ------------------------------------------------------------------ a store that will lose records
def durable(p):
    return metrics_value(p.metrics(), "idemproxy_store_durable")


@redis_only
def test_redis_durability_is_read_at_each_connect(proxy, tmp_path):
    """INFO persistence (and CONFIG GET appendfsync where allowed) at start and
    after each reconnect: no append-only file, or appendfsync no, is a warning
    and idemproxy_store_durable 0; appendonly yes with everysec is 1."""
    srv = RedisServer(str(tmp_path))
    srv.start()
    try:
        p = proxy(redis_url=srv.url)  # the suite's servers run without an append-only file
        wait_for(lambda: "no append-only file" in p.stderr(), timeout=5,
                 what="the warning of a Redis without an append-only file")
        assert durable(p) == 0
        c = srv.client()
        c.config_set("appendonly", "yes")
        c.config_set("appendfsync", "everysec")
        c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # a reconnect
        wait_for(lambda: durable(p) == 1, timeout=5, what="the store to read as durable")
        assert "keeps its writes in an append-only file" in p.stderr()
        c.config_set("appendfsync", "no")
        c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        wait_for(lambda: durable(p) == 0, timeout=5, what="appendfsync no to be seen")
        assert "appendfsync no" in p.stderr()
        assert p.request(*keyed(new_key()))[0] == 201  # it serves all along
    finally:
        srv.stop()


@memory_only
def test_memory_store_says_a_restart_forgets(proxy):
    p = proxy()
    assert "a restart forgets every key" in p.wait_log("a restart forgets every key")
    assert durable(p) == 0


@redis_only
def test_heartbeat_keeps_the_lease_at_maxmemory_noeviction_redis(proxy, upstream, tmp_path):
    """Redis full (maxmemory, noeviction): a growing HSET is refused, PEXPIRE
    is not. The lease lives in the key's TTL, so the heartbeat (a bare
    PEXPIRE) keeps a running request's lock through several --lock-ttl: its
    duplicates get 409, never a lapsed lease (holder_lost); new keys get 503."""
    srv = RedisServer(str(tmp_path))
    srv.start()
    try:
        c = srv.client()
        p = proxy("--lock-ttl", "1", redis_url=srv.url)
        p.rdb = c  # its Redis-side checks read this Redis
        key = new_key()
        req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"pay")
        first = start_held(p, key, body=b"pay")
        used = int(c.info("memory")["used_memory"])
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", str(used + 256 * 1024))
        def fill():  # until Redis refuses even a small write
            for size in (4096, 512, 64, 1):
                for _ in range(10000):
                    try:
                        c.set("f:%s" % new_key(), b"x" * size)
                    except Exception as e:  # redis.exceptions.OutOfMemoryError
                        assert "OOM" in str(e), e
                        break
                else:
                    raise AssertionError("Redis never refused a write")

        fill()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.5:  # past three leases
            st, _, b = p.request(*req)
            assert st == 409, (st, b[:200])
            fill()  # still full
            time.sleep(0.3)
        fill()
        assert_problem(p.request(*keyed(new_key())), 503, "store_unavailable")  # HSET refused
        assert unknown_count(p, "holder_lost") == 0
        c.config_set("maxmemory", "0")  # room again: the answer can be stored
        upstream.release(key)
        st, h, body = first(timeout=10)
        assert st == 200 and hone(h, REPLAY) == "false"
        wait_for(lambda: redis_state(c, key) == "C", timeout=5,
                 what="the answer to be stored")
        assert upstream.hits("/hold") == 1
    finally:
        srv.stop()


def test_route_on_unknown_outcome_is_checked(tmp_path):
    """The route key takes refuse or retry; anything else is the file's
    problem, at its line and column, with exit 2."""
    path = tmp_path / "routes.yaml"
    path.write_text("routes:\n  - name: w\n    match: {path: /w}\n    on-unknown-outcome: maybe\n")
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert ("%s:4:25: on-unknown-outcome: 'maybe' is not a valid choice (use refuse or retry)"
            % path).encode() in r.stderr, r.stderr
    path.write_text("on-unknown-outcome: retry\nupstream-late-timeout: 0\nroutes:\n"
                    "  - name: w\n    match: {path: /w}\n    on-unknown-outcome: refuse\n")
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--check-config", "--config", str(path)])
    assert r.returncode == 0, (r.stdout, r.stderr)
