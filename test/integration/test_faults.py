"""Faults: Redis killed, frozen or slow while a key is held; an upstream that
breaks its answer; a client that leaves mid-body; a proxy killed holding a lock;
every fault at once, with the unknown outcomes that keep each key to one
execution (doc/guarantees.md, Guarantees and failure behaviour; Unknown
outcomes).

Tests that kill, freeze (SIGSTOP) or pause a Redis use a private redis-server
of their own (the `private_redis` fixture), never the session's. Covered
elsewhere, not repeated here: an upstream RST (test_upstream.py
test_upstream_reset_is_502_and_never_resent), a response over --max-response
(test_limits.py test_response_over_max_response), a client leaving after its
whole request (test_heartbeat.py test_client_disconnect_does_not_cancel,
test_client_disconnect_during_upstream_wait), a dead proxy's lock expiring
under retry (test_heartbeat.py test_lock_of_killed_proxy_expires_retry_shared_redis)."""
import contextlib
import http.client
import json
import signal
import socket
import time

import pytest

from fixtures.client import (REPLAY, assert_problem, hone, keyed, metrics_value, new_key,
                             recv_until_closed)
from fixtures.load import Load
from fixtures.marks import redis_only, shared_store
from fixtures.probes import (assert_completed, assert_free, assert_locked, assert_unknown,
                             redis_keys, redis_lease_ms, redis_state, start_held, stored_lease_ms,
                             wait_completed)
from fixtures.redis import RedisServer
from fixtures.upstream import BAD_STATUS, big_body
from fixtures.waiting import in_thread, wait_for

# Also run under ThreadSanitizer (scripts/test), and on both upstream clients.
pytestmark = [pytest.mark.concurrency, pytest.mark.both_clients]

STORE_ERRORS = "idemproxy_store_errors_total"
LOCK_LOST = "idemproxy_lock_lost_total"


# --------------------------------------------------------------------------- helpers
@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test's own, which it may kill, freeze or pause."""
    srv = RedisServer(str(tmp_path)).start()
    yield srv
    srv.stop()  # thawed first if frozen: a frozen server cannot act on SIGTERM


def kill_redis(srv):
    """SIGKILL: Redis dies at once, its (non-persistent) data with it."""
    srv.kill()


def on_private_redis(proxy, srv, *args):
    """A proxy on the private Redis; its Redis-side checks read that Redis."""
    p = proxy(*args, redis_url=srv.url)
    p.rdb = srv.client()
    return p


def metric(p, name, labels=None):
    return metrics_value(p.metrics(), name, labels) or 0.0


def readyz(p):
    return p.admin_request("GET", "/readyz")[0]


def hold_req(key, body=b"held"):
    return ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], body)


def executes_once_when_free(p, key, req, timeout, path):
    """Polls req until the key is no longer in flight (a lock nobody holds may
    linger up to --lock-ttl) and the store answers; then it must execute
    exactly once, and be replayed afterwards. Returns the executed answer."""
    up = p.upstream
    before = up.hits(path)

    def attempt():
        st, h, b = p.request(*req)
        if st in (409, 503):
            code = json.loads(b)["code"]
            assert code == {409: "idempotency_key_in_use", 503: "store_unavailable"}[st], b
            assert up.hits(path) == before, "a %d reached the upstream" % st
            return None
        return st, h, b

    st, h, b = wait_for(attempt, timeout=timeout, interval=0.1,
                        what="key %s to be free" % key)
    assert hone(h, REPLAY) == "false", (st, h, b[:300])
    assert up.hits(path) == before + 1
    assert_completed(p, key, req, body=b)
    assert up.hits(path) == before + 1
    return st, h, b


def wait_store_back(p, timeout=6.0, streak=6):
    """Waits until Redis serves on every event loop's connection: /readyz 200,
    then <streak> new keys in a row executed (new connections, spread over the
    loops). Uses /status/200, so the hit counts of other paths are untouched."""
    wait_for(lambda: readyz(p) == 200, timeout=timeout, interval=0.1, what="/readyz 200")
    ok = [0]

    def serves():
        st, h, b = p.request("POST", "/status/200", [("Idempotency-Key", new_key())], b"probe")
        if st == 503:
            ok[0] = 0
            return False
        assert st == 200 and hone(h, REPLAY) == "false", (st, b[:200])
        ok[0] += 1
        return ok[0] >= streak

    wait_for(serves, timeout=timeout, interval=0.05, what="the store to serve on every loop")


def retry_executes_once(p, key, req):
    """<req> (a /hold) ran once and its answer was never stored: once the
    store serves again, a retry executes exactly once, then replays; no lock
    was counted lost."""
    wait_store_back(p)
    assert p.upstream.hits("/hold") == 1
    executes_once_when_free(p, key, req, timeout=5, path="/hold")
    assert p.upstream.hits("/hold") == 2
    assert metric(p, LOCK_LOST) == 0


@contextlib.contextmanager
def frozen_after_answer(p, private_redis, upstream, key):
    """Holds <key>'s request at the upstream, freezes Redis (SIGSTOP: a
    partition, its data survives) and lets the upstream answer: the client
    gets the answer at once and the failed complete is counted. Yields (the
    time of the freeze, the body answered); thaws Redis on the way out."""
    first = start_held(p, key)
    errors0 = metric(p, STORE_ERRORS)
    private_redis.freeze()  # SIGSTOP
    t_stop = time.monotonic()
    try:
        upstream.release(key)
        st, h, body = first()
        assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
        assert time.monotonic() - t_stop < 1.5, "the client waited on the store"
        wait_for(lambda: metric(p, STORE_ERRORS) > errors0, timeout=3,
                 what="the failed complete to be counted")
        yield t_stop, body
    finally:
        private_redis.thaw()  # SIGCONT


def warm_up(p, n=4):
    """Opens kept-alive upstream connections, so a fault hits a reused one
    (where libcurl, left alone, would silently send the request again)."""
    for _ in range(n):
        assert p.request("GET", "/echo")[0] == 201


# ------------------------------------------------------------ 1. Redis lost mid-request
@redis_only
def test_redis_killed_in_flight_answer_kept_key_freed_retry_once_redis(proxy, upstream,
                                                                      private_redis):
    """Redis SIGKILLed between acquire and complete: the client still gets the
    upstream's answer at once; the failed complete is counted in
    idemproxy_store_errors_total; the proxy gives up within --lock-ttl; with
    Redis back (empty: it was not persistent), a retry executes exactly once."""
    p = on_private_redis(proxy, private_redis, "--lock-ttl", "2", "--store-timeout", "0.3")
    key = new_key()
    req = hold_req(key)
    first = start_held(p, key)
    errors0 = metric(p, STORE_ERRORS)
    kill_redis(private_redis)
    t_kill = time.monotonic()
    upstream.release(key)
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
    assert json.loads(body)["released"] is True
    assert time.monotonic() - t_kill < 1.5, "the client waited on the store"
    wait_for(lambda: metric(p, STORE_ERRORS) > errors0, timeout=3,
             what="the failed complete to be counted in %s" % STORE_ERRORS)
    wait_for(lambda: "giving up" in p.stderr(), timeout=6,
             what="the proxy to stop retrying the complete (--lock-ttl 2)")
    assert time.monotonic() - t_kill < 5, "the retries outlived --lock-ttl by far"
    assert_problem(p.request(*req), 503, "store_unavailable")  # Redis still down
    private_redis.start()
    assert redis_keys(p.rdb, key) == []
    retry_executes_once(p, key, req)


@redis_only
@pytest.mark.parametrize("policy", ["refuse", "retry"])
def test_redis_frozen_past_lock_ttl_lock_expires_retry_once_redis(proxy, upstream,
                                                                 private_redis, policy):
    """Redis frozen (SIGSTOP: a partition; its data survives) from before the
    upstream answers until past --lock-ttl: the client gets its answer, the
    proxy gives up, and when Redis thaws the lock's lease has run out (the
    record did not vanish with a restart): the answer was lost, so a retry
    finds the key unknown (refuse: 502, holder_lost), or executes once (retry)."""
    p = on_private_redis(proxy, private_redis, "--lock-ttl", "2", "--store-timeout", "0.3",
                         "--on-unknown-outcome", policy)
    key = new_key()
    req = hold_req(key)
    with frozen_after_answer(p, private_redis, upstream, key) as (t_stop, _):
        wait_for(lambda: "giving up" in p.stderr(), timeout=6,
                 what="the proxy to stop retrying the complete (--lock-ttl 2)")
        time.sleep(max(0.0, t_stop + 2.5 - time.monotonic()))  # past the lock's own TTL
    # The lock is still in Redis's memory, but its lease ran out while frozen.
    wait_for(lambda: redis_lease_ms(p.rdb, key) <= 0, timeout=2,
             what="the lock's lease to run out")
    if policy == "retry":
        retry_executes_once(p, key, req)
        return
    wait_store_back(p)
    assert_unknown(p, req, path="/hold")
    assert metric(p, "idemproxy_unknown_outcomes_total",
                  {"route": "default", "cause": "holder_lost"}) == 1


@redis_only
def test_redis_frozen_briefly_complete_retried_no_second_execution_redis(proxy, upstream,
                                                                        private_redis):
    """Redis frozen for less than --lock-ttl while the answer is stored: the
    complete times out, is retried in the background while the heartbeat keeps
    the lock, and lands when Redis thaws; a duplicate is then replayed: the
    dropped connections do not turn into a second execution, nor a lock_lost."""
    p = on_private_redis(proxy, private_redis, "--lock-ttl", "5", "--store-timeout", "0.3")
    key = new_key()
    req = hold_req(key)
    with frozen_after_answer(p, private_redis, upstream, key) as (t_stop, body):
        wait_for(lambda: "retrying" in p.stderr(), timeout=3, what="a retry of the complete")
        time.sleep(max(0.0, t_stop + 1.5 - time.monotonic()))
    wait_completed(p, key, req, timeout=6)
    assert_completed(p, key, req, body=body)
    assert upstream.hits("/hold") == 1
    assert "giving up" not in p.stderr()
    time.sleep(0.5)  # late replies of the dropped connections, if any, have landed
    assert redis_state(p.rdb, key) == "C"
    assert p.rdb.pttl(redis_keys(p.rdb, key)[0]) > 3600 * 1000, "the record got a lock's TTL"
    assert metric(p, LOCK_LOST) == 0, p.stderr()


# ------------------------------------------------------------ 2. Redis slow
@redis_only
def test_redis_paused_is_503_within_store_timeout_then_serves_redis(proxy, upstream,
                                                                   private_redis):
    """Redis answers nothing for 2 s (CLIENT PAUSE 2000 ALL): with --store-timeout
    0.3 enforced requests get 503 store_unavailable well within 1.5 s, never
    hang; passthrough is unaffected; after the pause the proxy serves normally,
    and no key that got a 503 executes twice."""
    p = on_private_redis(proxy, private_redis, "--store-timeout", "0.3", "--lock-ttl", "2")
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"warm")
    assert st == 201 and hone(h, REPLAY) == "false"
    ctl = private_redis.client()
    keys = [new_key() for _ in range(4)]
    t_pause = time.monotonic()
    assert ctl.execute_command("CLIENT", "PAUSE", "2000", "ALL")

    def timed(key):
        t0 = time.monotonic()
        resp = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x", timeout=10)
        return resp, time.monotonic() - t0

    getters = [in_thread(timed, k) for k in keys]
    results = [g(10) for g in getters]
    for resp, elapsed in results:
        assert_problem(resp, 503, "store_unavailable")
        assert elapsed < 1.5, "store_unavailable took %.2fs with --store-timeout 0.3" % elapsed
    assert time.monotonic() - t_pause < 1.8, "the 503s were answered only after the pause"
    assert upstream.hits("/echo") == 1
    st, h, _ = p.request("GET", "/echo")  # passthrough needs no store
    assert st == 201 and hone(h, REPLAY) is None
    assert metric(p, STORE_ERRORS) >= len(keys)
    assert metric(p, "idemproxy_requests_total",
                  {"route": "default", "outcome": "store_error"}) >= len(keys)

    # After the pause: a new key is served normally (acquire, forward, complete).
    def serves():
        k = new_key()
        st, h, b = p.request("POST", "/echo", [("Idempotency-Key", k)], b"after")
        if st == 503:
            return None
        assert st == 201 and hone(h, REPLAY) == "false", (st, b[:200])
        return k, b

    k, b = wait_for(serves, timeout=6, interval=0.2, what="the proxy to serve after the pause")
    assert time.monotonic() - t_pause < 8
    assert_completed(p, k, keyed(k, body=b"after"), body=b)
    # A key that got a 503 may find a lock its timed-out acquire left behind
    # (Redis ran it late): that expires within --lock-ttl; then it executes once.
    for key in keys:
        executes_once_when_free(p, key, keyed(key), timeout=4, path="/echo")
    assert metric(p, LOCK_LOST) == 0


@redis_only
def test_redis_paused_during_heartbeat_lock_kept_executed_once_redis(proxy, upstream,
                                                                     private_redis):
    """Redis paused (1.5 s) while an upstream call is held, past --store-timeout
    but within --lock-ttl: heartbeats time out, a duplicate meanwhile gets 503
    (never forwarded); once Redis answers again the lock is still the holder's,
    its answer is stored, and the key was executed exactly once."""
    p = on_private_redis(proxy, private_redis, "--lock-ttl", "3", "--store-timeout", "0.3")
    key = new_key()
    req = hold_req(key)
    first = start_held(p, key)
    ctl = private_redis.client()
    t_pause = time.monotonic()
    assert ctl.execute_command("CLIENT", "PAUSE", "1500", "ALL")
    time.sleep(0.1)
    assert_problem(p.request(*req), 503, "store_unavailable")
    assert upstream.hits("/hold") == 1
    time.sleep(max(0.0, t_pause + 2.0 - time.monotonic()))  # the pause is over
    wait_store_back(p)
    assert_locked(p, key, req)  # still the holder's: the heartbeat resumed in time
    time.sleep(max(0.0, t_pause + 3.5 - time.monotonic()))  # past one lock TTL
    assert_locked(p, key, req)
    upstream.release(key)
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
    assert_completed(p, key, req, body=body)
    assert upstream.hits("/hold") == 1
    assert metric(p, LOCK_LOST) == 0, p.stderr()


# ------------------------------------------------------------ 3. upstream breaks its answer
FAULTS = [
    pytest.param("/truncated?promise=1000&send=10", id="closed-mid-body"),
    pytest.param("/truncated?promise=5000000&send=100000", id="closed-mid-large-body"),
    pytest.param("/close", id="closed-without-answer"),
    pytest.param("/bad-chunked", id="bad-chunk-size"),
] + [pytest.param("/bad-status?kind=%s" % k, id="status-" + k) for k in BAD_STATUS]


def assert_broken(p, req):
    """A broken answer: 502 upstream_unavailable when it broke before its head
    went out, or the head and a body visibly cut (http.client's IncompleteRead)
    when it broke after (doc/guarantees.md, "Streaming"): which one depends on
    whether the break came in the read of the head."""
    try:
        resp = p.request(*req)
    except http.client.IncompleteRead:
        return "cut"
    assert_problem(resp, 502, "upstream_unavailable")
    return "problem"


@pytest.mark.parametrize("path", FAULTS)
def test_upstream_broken_answer_is_502_key_unknown(proxy, upstream, path):
    """A connection closed mid-answer, a malformed status line, bytes that
    are not HTTP: 502 upstream_unavailable, sent upstream once (never
    re-sent, even on a reused connection). The upstream had the request, so
    it may have run it: the key's outcome is unknown, and a retry gets 502
    idempotency_outcome_unknown without reaching the upstream
    (doc/guarantees.md, Unknown outcomes)."""
    p = proxy()
    warm_up(p)
    key = new_key()
    req = keyed(key, path=path, body=b"pay")
    upath = path.split("?")[0]
    t0 = time.monotonic()
    assert_broken(p, req)
    assert time.monotonic() - t0 < 5
    assert upstream.hits(upath) == 1, "an enforced request must never be re-sent"
    assert_unknown(p, req, path=upath)
    assert upstream.hits(upath) == 1
    assert metric(p, "idemproxy_requests_total",
                  {"route": "default", "outcome": "upstream_error"}) == 1
    assert metric(p, "idemproxy_requests_total",
                  {"route": "default", "outcome": "outcome_unknown"}) == 1
    assert metric(p, "idemproxy_unknown_outcomes_total",
                  {"route": "default", "cause": "upstream_reset"}) == 1
    # Passthrough gets the same, without a replay header.
    assert_broken(p, ("GET", path))
    # The proxy still serves, on fresh or reused upstream connections.
    k2 = new_key()
    st, h, b = p.request("POST", "/echo", [("Idempotency-Key", k2)], b"ok")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_completed(p, k2, keyed(k2, body=b"ok"), body=b)
    assert metric(p, "idemproxy_inflight") == 0


@pytest.mark.parametrize("path", FAULTS[:3])
def test_upstream_broken_answer_retry_policy_runs_again(proxy, upstream, path):
    """--on-unknown-outcome retry keeps at-least-once: nothing stored, the lock
    released, a retry runs (and breaks) again."""
    p = proxy("--on-unknown-outcome", "retry")
    warm_up(p)
    key = new_key()
    req = keyed(key, path=path, body=b"pay")
    upath = path.split("?")[0]
    assert_broken(p, req)
    try:
        st, h, b = assert_free(p, key, req)
        assert st == 502 and json.loads(b)["code"] == "upstream_unavailable", (st, b[:200])
    except http.client.IncompleteRead:
        pass  # it ran again, and broke again after its head
    assert upstream.hits(upath) == 2
    assert metric(p, "idemproxy_unknown_outcomes_total",
                  {"route": "default", "cause": "upstream_reset"}) == 0


@pytest.mark.parametrize("late", ["0", "1"])
def test_upstream_stalls_mid_body_is_cut_key_unknown(proxy, upstream, late):
    """Headers and part of the body, then silence past --upstream-timeout: the
    client's streamed answer is cut within the bound (its head and the bytes
    sent, short of its Content-Length); the answer never completes within the
    late timeout either, so the key's outcome is unknown
    (doc/guarantees.md)."""
    p = proxy("--upstream-timeout", "0.5", "--upstream-late-timeout", late)
    key = new_key()
    req = keyed(key, path="/stall-body?ms=3000")
    t0 = time.monotonic()
    with pytest.raises(http.client.IncompleteRead) as cut:
        p.request(*req)
    assert cut.value.partial == big_body(10)
    assert 0.4 <= time.monotonic() - t0 < 2.5
    assert upstream.hits("/stall-body") == 1
    if late != "0":
        assert_locked(p, key, req)  # the exchange goes on, under its lock
    wait_for(lambda: metric(p, "idemproxy_unknown_outcomes_total",
                            {"route": "default", "cause": "upstream_timeout"}) == 1,
             timeout=5, what="the key to become unknown")
    assert time.monotonic() - t0 >= 0.5 + float(late)
    assert_unknown(p, req, path="/stall-body")
    assert upstream.hits("/stall-body") == 1


def test_response_over_capture_limit_streams_whole_and_never_reruns(proxy, upstream):
    """An answer larger than the proxy would ever hold (64 MiB with a small
    --max-response) streams to its client whole, and the key is completed
    with the too-large marker, since the upstream did run: a duplicate gets
    502 response_too_large without reaching the upstream (README: decisions)."""
    p = proxy("--max-response", "1K")
    key = new_key()
    n = (64 << 20) + 4096
    req = keyed(key, path="/big?bytes=%d" % n)
    t0 = time.monotonic()
    st, h, b = p.request(*req, timeout=30)
    assert time.monotonic() - t0 < 20
    assert st == 200 and b == big_body(n) and hone(h, REPLAY) == "false"
    assert upstream.hits("/big") == 1
    if p.store == "redis":
        assert redis_state(p.rdb, key) == "C"
    st, h, b = p.request(*req, timeout=30)
    assert st == 502 and json.loads(b)["code"] == "response_too_large", (st, b[:300])
    assert upstream.hits("/big") == 1, "the request ran twice"
    # The proxy still serves, and a response within the limit is stored.
    k2 = new_key()
    st, h, b = p.request("POST", "/big?bytes=1000", [("Idempotency-Key", k2)], b"x")
    assert st == 200 and b == big_body(1000)
    assert_completed(p, k2, keyed(k2, path="/big?bytes=1000"), body=b)


# ------------------------------------------------------------ 4. client leaves mid-body
PARTIAL = [
    pytest.param(b"Content-Length: 1000\r\n\r\n", b"", id="headers-only"),
    pytest.param(b"Content-Length: 1000\r\n\r\n", b"x" * 10, id="10-of-1000"),
    pytest.param(b"Content-Length: 1000\r\n\r\n", b"x" * 999, id="999-of-1000"),
    pytest.param(b"Transfer-Encoding: chunked\r\n\r\n", b"a\r\n0123456789\r\n", id="chunked"),
]


@pytest.mark.parametrize("framing,sent", PARTIAL)
def test_client_gone_before_body_complete_locks_nothing(proxy, upstream, framing, sent):
    """A client that closes before its body is complete: nothing is locked,
    nothing is sent upstream, no request is left in flight."""
    p = proxy()
    key = new_key()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    try:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " + key.encode() +
                  b"\r\n" + framing + sent)
        time.sleep(0.2)  # the proxy has read what there is
    finally:
        s.close()
    wait_for(lambda: metric(p, "idemproxy_inflight") == 0, timeout=5,
             what="the gone client's request to be dropped")
    time.sleep(0.2)
    assert upstream.hits() == 0, "a partial body reached the upstream"
    if p.store == "redis":
        assert redis_keys(p.rdb, key) == []
    st, h, b = assert_free(p, key, keyed(key, body=b"x" * 1000))
    assert st == 201 and json.loads(b)["body"] == "x" * 1000
    assert upstream.hits() == 1


def test_client_stalled_mid_body_past_client_timeout_locks_nothing(proxy, upstream):
    """A client that stops mid-body and stays connected is dropped after
    --client-timeout: nothing locked, nothing sent upstream."""
    p = proxy("--client-timeout", "1")
    key = new_key()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=6)
    try:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " + key.encode() +
                  b"\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        t0 = time.monotonic()
        data = recv_until_closed(s, "the stalled client")
        assert 0.5 <= time.monotonic() - t0 < 5
        assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:100]
    finally:
        s.close()
    assert upstream.hits() == 0
    st, h, b = assert_free(p, key)
    assert st == 201


# ------------------------------------------------------------ 5. proxy killed holding a lock
@shared_store
@pytest.mark.parametrize("policy", ["refuse", "retry"])
def test_heartbeat_holds_lock_across_proxies_then_kill_frees_it_shared_redis(proxy, upstream,
                                                                            rdb, policy):
    """Two proxies on one Redis, --lock-ttl 2. While the first is alive with its
    upstream call held, the second gets 409 long past the lock TTL (the first's
    heartbeat extends it): never two executions. After a SIGKILL of the first,
    within the lock TTL, the second finds the key's outcome unknown (refuse:
    502, holder_lost), or (retry) executes it once."""
    p1 = proxy("--lock-ttl", "2", "--on-unknown-outcome", policy)
    p2 = proxy("--lock-ttl", "2", "--on-unknown-outcome", policy)
    key = new_key()
    req = hold_req(key)
    t0 = time.monotonic()
    start_held(p1, key)
    for at in (1.0, 2.5, 3.5, 4.5):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        assert_locked(p2, key, req)  # the lock outlived 2 s only by the heartbeat
        lease = stored_lease_ms(p2, key)
        assert 0 < lease <= 2000, lease
    assert upstream.hits("/hold") == 1
    assert p1.kill() == -9
    t_kill = time.monotonic()
    assert_locked(p2, key, req)  # a crash does not free the key at once...
    upstream.release(key)  # the dead proxy's upstream call ends; nobody completes it

    def executed():
        st, h, b = p2.request(*req)
        if st == 409:
            assert json.loads(b)["code"] == "idempotency_key_in_use"
            return None
        if policy == "refuse":
            assert_problem((st, h, b), 502, "idempotency_outcome_unknown")
            return b
        assert st == 200 and hone(h, REPLAY) == "false", (st, b[:200])
        return b

    body = wait_for(executed, timeout=6, interval=0.1, what="the dead proxy's lease to run out")
    assert time.monotonic() - t_kill < 2.0 + 1.0, "the lock outlived --lock-ttl"  # ...but soon
    if policy == "refuse":
        assert upstream.hits("/hold") == 1
        assert metric(p2, "idemproxy_unknown_outcomes_total",
                      {"route": "default", "cause": "holder_lost"}) == 1
        assert "unknown=holder_lost" in p2.stderr()
        assert_unknown(p2, req, path="/hold")
        assert metric(p2, "idemproxy_unknown_outcomes_total",
                      {"route": "default", "cause": "holder_lost"}) == 1  # a key, once
        return
    assert upstream.hits("/hold") == 2
    assert_completed(p2, key, req, body=body)
    assert upstream.hits("/hold") == 2
    assert metric(p2, LOCK_LOST) == 0


# --------------------------------------------------- 6. every fault at once
# (doc/guarantees.md, Guarantees and failure behaviour: The fault test)
FAULT_KEYS = 240
FAULT_DUPLICATES = 4


def fault_path(i):
    """Key i's request: most answer at once, some answer late (after the 504,
    within the late timeout), some never in time, some reset after reading."""
    kind = i % 20
    if kind < 12:
        return "/slow?ms=20"
    if kind < 15:
        return "/slow?ms=700"   # 504 at 0.3 s, answered within the late 0.7 s
    if kind < 17:
        return "/slow?ms=2500"  # nor within the late timeout: unknown (or run again)
    return "/reset"


@shared_store
@pytest.mark.parametrize("policy", [
    "refuse",
    # the contrast, smaller, and once: that retries run lost answers again needs no cluster
    pytest.param("retry", marks=pytest.mark.single_redis_server)])
def test_unknown_outcome_fault_mix_shared_redis(proxy, upstream, rdb, policy):
    """Two proxies on one store, concurrent duplicates of many keys sent to
    either, a proxy SIGKILLed (and replaced) and one SIGSTOPped past
    --lock-ttl while requests of theirs are at the upstream, upstream calls
    that time out with and without a late answer, and resets after the
    request was read; on PostgreSQL, the server killed (SIGKILL) and started
    again as well: it keeps what it committed. Every execution is counted by
    the upstream. refuse: no key executes twice. retry: some do (at least
    once, by choice)."""
    import random

    args = ("--lock-ttl", "1", "--upstream-timeout", "0.3", "--upstream-late-timeout", "0.7",
            "--store-timeout", "0.5", "--on-unknown-outcome", policy)
    proxies = [proxy(*args), proxy(*args)]
    keys = [(new_key(), fault_path(i))
            for i in range(FAULT_KEYS if policy == "refuse" else FAULT_KEYS // 3)]
    rng = random.Random(24)
    work = [(k, path) for k, path in keys for _ in range(FAULT_DUPLICATES)]
    rng.shuffle(work)
    # Each duplicate as an SDK sends it: retried on 409, 503, 502/504 of the
    # upstream and a dead or frozen proxy (at any proxy running), until
    # replayed, answered, refused as unknown, or out of time; with retry, fewer
    # tries (a lost answer's key runs again on each).
    load = Load(proxies, workers=24, work=work, tries=8 if policy == "refuse" else 4,
                body=b"pay", timeout=2.5, pace_s=0, bound_s=60).start()
    time.sleep(1.5)
    assert proxies[1].kill() == -9          # a crash, requests of its own at the upstream
    time.sleep(0.5)
    proxies.append(proxy(*args))            # its replacement
    time.sleep(1.0)
    if proxies[0].store == "postgresql":    # the store crashes, and comes back
        proxies[0].pg.kill()
        time.sleep(0.5)
        proxies[0].pg.start()
    frozen = proxies[0]
    frozen.proc.send_signal(signal.SIGSTOP)  # past --lock-ttl: its leases run out
    time.sleep(1.6)
    frozen.proc.send_signal(signal.SIGCONT)
    assert load.join(60)
    time.sleep(3.0)  # late answers and the thawed holder's calls land

    execs = upstream.executions()
    twice = sorted(k for k, n in execs.items() if n > 1)
    results = load.by_key()  # each duplicate's last answer
    unknown = sum(1 for rs in results.values() if any(a.code == "idempotency_outcome_unknown"
                                                      for a in rs))
    causes = {c: sum(metric(q, "idemproxy_unknown_outcomes_total", {"cause": c})
                     for q in proxies if q.proc is not None)
              for c in ("upstream_timeout", "upstream_reset", "holder_lost")}
    print("fault mix (%s): %d keys, %d executed, %d executed twice or more, %d answered "
          "outcome_unknown; keys made unknown by the live proxies: %r"
          % (policy, len(keys), len(execs), len(twice), unknown, causes))
    assert len(results) == len(keys)
    assert len(execs) >= len(keys) * 0.9, "the load did not reach the upstream"
    if policy == "refuse":
        assert twice == [], [(k, execs[k]) for k in twice[:5]]
        assert unknown > 0, "no key became unknown: the faults did not bite"
    else:
        assert twice, "retry runs a request whose answer was lost again: none did"
        assert unknown == 0
