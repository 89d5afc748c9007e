"""store_error: Redis down, back, script cache flushed (doc/guarantees.md,
Guarantees and failure behaviour: Redis down, slow or erroring).

All Redis-only: they stop, fake or flush the Redis server. The memory store's
own store_unavailable (a budget full of locks) is in test_memory_store.py."""
import socket
import threading
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import redis_only, single_redis_server
from fixtures.probes import redis_record, start_slow
from fixtures.waiting import wait_for

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)


def readyz(p):
    return p.admin_request("GET", "/readyz")[0]


def healthz(p):
    return p.admin_request("GET", "/healthz")[0]


@single_redis_server
@redis_only
def test_redis_down_and_back(proxy, upstream, rdb, redis_server):
    p = proxy()
    # ready once its first connection to Redis is set up (a few ms after start)
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200")
    redis_server.stop()
    key = new_key()
    t0 = time.monotonic()
    resp = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert time.monotonic() - t0 < 3.0, "store_unavailable must come within --store-timeout"
    assert_problem(resp, 503, "store_unavailable")
    assert upstream.hits() == 0
    wait_for(lambda: readyz(p) == 503, timeout=5, what="/readyz 503")
    assert healthz(p) == 200
    # Passthrough needs no store.
    st, h, _ = p.request("GET", "/echo")
    assert st == 201 and hone(h, REPLAY) is None
    st, h, _ = p.request("POST", "/echo", body=b"no key")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 2

    redis_server.start()  # same port, empty store; the proxy is not restarted

    def post_works():
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        if st == 503:
            return False
        assert st == 201 and hone(h, REPLAY) == "false"
        return True

    wait_for(post_works, timeout=10, interval=0.2, what="POST to work after Redis is back")
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200")
    c = redis_server.client()
    assert redis_record(c, key)["state"] == b"C"
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 3



@redis_only
def test_redis_script_flush(proxy, upstream, rdb):
    p = proxy()
    k1 = new_key()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", k1)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    rdb.script_flush()
    # Every kind of script after a flush: acquire (new key), replay, complete.
    k2 = new_key()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", k2)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert redis_record(rdb, k2)["state"] == b"C"
    rdb.script_flush()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", k1)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true"
    rdb.script_flush()
    k3 = new_key()
    st, h, _ = p.request("POST", "/status/500", [("Idempotency-Key", k3)], b"x")  # release
    assert st == 500 and hone(h, REPLAY) == "false"
    assert redis_record(rdb, k3) is None
    assert upstream.hits("/echo") == 2


@single_redis_server
@redis_only
def test_on_store_error_passthrough_redis_down(proxy, upstream, rdb, redis_server):
    """Under passthrough a proxy whose store is down still serves: /readyz
    stays 200 and says degraded (doc/operations.md, Readiness)."""
    p = proxy("--on-store-error", "passthrough")
    wait_for(lambda: p.admin_request("GET", "/readyz")[:3:2] == (200, b"ready\n"), timeout=5,
             what="/readyz 200 ready")
    redis_server.stop()
    wait_for(lambda: p.admin_request("GET", "/readyz")[:3:2] == (200, b"degraded\n"),
             timeout=5, interval=0.1, what="/readyz 200 degraded")
    key = new_key()
    for n in (1, 2):
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert st == 201 and hone(h, REPLAY) is None
        assert upstream.hits("/echo") == n


@single_redis_server
@redis_only
def test_proxy_starts_with_redis_down(proxy, upstream, rdb, redis_server):
    redis_server.stop()
    p = proxy()  # ready = /healthz 200
    assert readyz(p) == 503
    key = new_key()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", key)], b"x"), 503,
                   "store_unavailable")
    redis_server.start()
    wait_for(lambda: readyz(p) == 200, timeout=10, interval=0.2, what="/readyz 200")
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"


@redis_only
def test_store_error_answer_is_fast_with_unroutable_redis(proxy, upstream, rdb):
    """A store that does not answer at all (accepts, never replies): --store-timeout bounds it."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = lsock.accept()
                held.append(c)
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        p = proxy("--store-timeout", "0.5",
                  redis_url="redis://127.0.0.1:%d" % lsock.getsockname()[1])
        t0 = time.monotonic()
        resp = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
        assert time.monotonic() - t0 < 3.0
        assert_problem(resp, 503, "store_unavailable")
        assert upstream.hits() == 0
        assert p.stop() == 0, p.stderr()
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        lsock.close()


@single_redis_server
@redis_only
def test_redis_lost_after_upstream_answered(proxy, upstream, rdb, redis_server):
    """Redis dies while the upstream runs: the client still gets the upstream's
    answer, and completing the key is retried in the background."""
    p = proxy("--lock-ttl", "2")
    key = new_key()
    first = start_slow(p, key, 1000)
    redis_server.stop()
    t0 = time.monotonic()
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
    assert time.monotonic() - t0 < 2.5, "the client waited on the store retries"
    assert upstream.hits("/slow") == 1
    wait_for(lambda: "retrying" in p.stderr(), timeout=3, what="a background retry of complete")


@single_redis_server
@redis_only
def test_redis_by_host_name_redis(proxy, upstream, rdb, redis_server):
    """--redis with a host name: it is looked up off the event loops (at start and
    with every readiness PING) and the loops connect to its address."""
    p = proxy(redis_url="redis://localhost:%d" % redis_server.port)
    wait_for(lambda: readyz(p) == 200, timeout=10, interval=0.2, what="/readyz 200")
    key = new_key()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert redis_record(rdb, key)["state"] == b"C"
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true"


@redis_only
def test_redis_host_name_that_does_not_resolve_is_503_redis(proxy, upstream):
    """A name that does not resolve: the proxy starts, is not ready, and answers
    enforced requests 503 store_unavailable at once; nothing reaches the upstream."""
    p = proxy(redis_url="redis://no-such-host.invalid:6379")
    assert readyz(p) == 503
    t0 = time.monotonic()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x"), 503,
                   "store_unavailable")
    assert time.monotonic() - t0 < 3.0
    assert upstream.hits() == 0
    st, h, _ = p.request("GET", "/echo")  # passthrough is unaffected
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 1
    # said as such in the log, not as a refused connection (doc/stores.md,
    # Pointing idemproxy at Redis)
    err = p.stderr()
    assert "no-such-host.invalid does not resolve" in err, err
    assert "the store's host name does not resolve" in err, err
    assert "Connection refused" not in err and "No route to host" not in err, err


def log_lines(p, needle):
    """The lines of the whole log (p.stderr() keeps only its end) with <needle>."""
    with open(p.stderr_path, encoding="utf-8", errors="replace") as f:
        return [ln for ln in f.read().splitlines() if needle in ln]


@single_redis_server
@redis_only
def test_log_stays_readable_through_a_redis_outage(proxy, upstream, rdb, redis_server):
    """200 requests while Redis is down: the failure is logged once, then
    counted; the count comes within 10 s (and a second), not 200 lines."""
    p = proxy()
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200")
    redis_server.stop()
    try:
        for _ in range(200):
            assert p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")[0] == 503
        failed = log_lines(p, "store acquire of key")
        assert len(failed) == 1, failed
        assert "Connection refused" in failed[0], failed  # the reason, as the system said it
        wait_for(lambda: log_lines(p, "store failures ("), timeout=13, interval=0.2,
                 what="the count of the failures not logged")
        summary = log_lines(p, "store failures (")
        assert len(summary) == 1 and ": 199 more in the last 1" in summary[0], summary
        assert len(log_lines(p, " warn ")) < 10, log_lines(p, " warn ")
        assert len(log_lines(p, " info access ")) == 200  # one access line each, still
    finally:
        redis_server.start()


@single_redis_server
@redis_only
def test_redis_error_is_named_as_redis_sent_it_redis(proxy, upstream, rdb):
    """A command Redis refuses (an ACL without the scripts) is logged with
    Redis's own error, not as a protocol error."""
    rdb.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all",
                        "-evalsha", "-eval")
    try:
        p = proxy(redis_url=redis_url_with_user(rdb, "noscript", "pw"))
        for _ in range(3):
            assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x"),
                           503, "store_unavailable")
        failed = log_lines(p, "store acquire of key")
        assert len(failed) == 1 and "NOPERM" in failed[0], p.stderr()
        assert "protocol error" not in p.stderr().lower()
        assert upstream.hits() == 0
    finally:
        rdb.execute_command("ACL", "DELUSER", "noscript")


def redis_url_with_user(rdb, user, password):
    kw = rdb.connection_pool.connection_kwargs
    return "redis://%s:%s@%s:%d" % (user, password, kw["host"], kw["port"])
