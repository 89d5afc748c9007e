"""upstream_error: unreachable (the lock is released), timeout and reset (the
key's outcome is unknown, or a late answer completes it) (doc/guarantees.md,
Guarantees and failure behaviour; Unknown outcomes)."""
import json
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, keyed, metrics_value, new_key
from fixtures.marks import store_independent
from fixtures.probes import (assert_completed, assert_free, assert_locked, assert_unknown,
                             redis_keys, redis_state)
from fixtures.upstream import FakeUpstream
from fixtures.waiting import free_port, wait_for

pytestmark = pytest.mark.both_clients  # on idemproxy's own upstream client and libcurl's


def test_upstream_unreachable_then_up(proxy, rdb):
    port = free_port()
    p = proxy(upstream_url="http://127.0.0.1:%d" % port)
    key = new_key()
    req = keyed(key)
    assert_problem(p.request(*req), 502, "upstream_unavailable")
    if p.store == "redis":
        assert redis_keys(rdb, key) == []  # lock released
    # Passthrough failures are problems too.
    assert_problem(p.request("GET", "/echo"), 502, "upstream_unavailable")
    up = FakeUpstream(port).start()
    try:
        # The lock was released: the key executes.
        st, h, body = assert_free(p, key, req, upstream=up)
        assert st == 201
        assert up.hits("/echo") == 1
        assert_completed(p, key, req, body=body, upstream=up)
        assert up.hits("/echo") == 1
    finally:
        up.stop()
    # Nothing was sent: no key became unknown (doc/guarantees.md, Unknown
    # outcomes).
    assert (metrics_value(p.metrics(), "idemproxy_unknown_outcomes_total") or 0) == 0


def test_upstream_timeout(proxy, upstream):
    """504 at --upstream-timeout; the exchange goes on (--upstream-late-timeout,
    60 s by default), and its late answer completes the key: duplicates are
    replayed, never run again (doc/guarantees.md, Unknown outcomes: Late
    answers)."""
    p = proxy("--upstream-timeout", "0.5")
    key = new_key()
    req = keyed(key, path="/slow?ms=2000")
    t0 = time.monotonic()
    resp = p.request(*req)
    elapsed = time.monotonic() - t0
    assert_problem(resp, 504, "upstream_timeout")
    assert 0.4 <= elapsed < 1.5, elapsed
    assert upstream.hits("/slow") == 1
    assert_locked(p, key, req)  # still running, under its lock
    st, h, body = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(p.request(*req)),
                           timeout=5, interval=0.1, what="the late answer to be stored")
    assert hone(h, REPLAY) == "true" and json.loads(body)["slept_ms"] == 2000
    assert upstream.hits("/slow") == 1
    key2 = new_key()
    st, h, _ = p.request("POST", "/slow?ms=10", [("Idempotency-Key", key2)], b"x")
    assert st == 200 and hone(h, REPLAY) == "false"


def test_upstream_reset_is_502_and_never_resent(proxy, upstream, rdb):
    """A reset after the upstream read the request: 502, never re-sent, and
    the key's outcome is unknown: a retry gets 502 idempotency_outcome_unknown
    without reaching the upstream (doc/guarantees.md, Unknown outcomes)."""
    p = proxy()
    # Warm up kept-alive upstream connections so the reset hits a reused one
    # (libcurl would silently retry a request on a reused connection).
    for _ in range(4):
        assert p.request("GET", "/echo")[0] == 201
    key = new_key()
    assert_problem(p.request("POST", "/reset", [("Idempotency-Key", key)], b"x"), 502,
                   "upstream_unavailable")
    assert upstream.hits("/reset") == 1, "an enforced request must never be re-sent"
    if p.store == "redis":
        assert redis_state(rdb, key) == "U"
    # Still serving; the key is unknown.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_unknown(p, ("POST", "/reset", [("Idempotency-Key", key)], b"x"), path="/reset")
    assert upstream.hits("/reset") == 1


@store_independent
def test_upstream_prefix(proxy, upstream):
    p = proxy(upstream_url=upstream.url + "/api")
    st, h, body = p.request("POST", "/echo?x=1", [("Idempotency-Key", new_key())], b"x")
    assert st == 201
    assert json.loads(body)["target"] == "/api/echo?x=1"
    st, _, body = p.request("GET", "/echo")
    assert json.loads(body)["target"] == "/api/echo"


def test_upstream_stopped_mid_run(proxy, rdb):
    """Upstream goes away after serving: the kept-alive connection is dead, answer 502, no resend."""
    up = FakeUpstream().start()
    port = up.port
    p = proxy(upstream_url=up.url)
    k1 = new_key()
    assert p.request("POST", "/echo", [("Idempotency-Key", k1)], b"x")[0] == 201
    up.stop()
    k2 = new_key()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", k2)], b"x"), 502,
                   "upstream_unavailable")
    if p.store == "redis":
        assert redis_keys(rdb, k2) == []
    up2 = FakeUpstream(port).start()
    try:
        st, h, body = assert_free(p, k2, keyed(k2), upstream=up2)
        assert st == 201
        assert_completed(p, k2, keyed(k2), body=body, upstream=up2)
        assert up2.hits("/echo") == 1
    finally:
        up2.stop()
