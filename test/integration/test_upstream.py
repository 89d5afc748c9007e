"""upstream_error: unreachable, timeout, reset; the lock is released (SPEC §1, §5)."""
import json
import time

from conftest import (REPLAY, assert_completed, assert_free, assert_problem, free_port, hone,
                      keyed, new_key, redis_keys, store_independent)
from fake_upstream import FakeUpstream


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


def test_upstream_timeout(proxy, upstream):
    p = proxy("--upstream-timeout", "0.5")
    key = new_key()
    t0 = time.monotonic()
    resp = p.request("POST", "/slow?ms=3000", [("Idempotency-Key", key)], b"x")
    elapsed = time.monotonic() - t0
    assert_problem(resp, 504, "upstream_timeout")
    assert 0.4 <= elapsed < 2.5, elapsed
    assert upstream.hits("/slow") == 1
    # The lock is free: the same key runs again (and times out again).
    st, h, _ = assert_free(p, key, keyed(key, path="/slow?ms=3000"))
    assert st == 504
    assert upstream.hits("/slow") == 2
    key2 = new_key()
    st, h, _ = p.request("POST", "/slow?ms=10", [("Idempotency-Key", key2)], b"x")
    assert st == 200 and hone(h, REPLAY) == "false"


def test_upstream_reset_is_502_and_never_resent(proxy, upstream, rdb):
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
        assert redis_keys(rdb, key) == []  # lock released (probed by behaviour below)
    # Still serving, and the key is free again.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_problem(p.request("POST", "/reset", [("Idempotency-Key", key)], b"x"), 502,
                   "upstream_unavailable")
    assert upstream.hits("/reset") == 2


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
