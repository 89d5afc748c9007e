"""in_flight: a duplicate while the first request runs (SPEC §1, §5 --wait)."""
import time

from conftest import (REPLAY, assert_problem, hone, in_thread, new_key, redis_record, wait_for)


def start_slow(p, rdb, key, ms, body=b"slow", path=None):
    """Starts a keyed POST to /slow in a thread and waits until its lock is in Redis."""
    path = path or "/slow?ms=%d" % ms
    get = in_thread(p.request, "POST", path, [("Idempotency-Key", key)], body)
    wait_for(lambda: (redis_record(rdb, key) or {}).get("state") == b"L", timeout=5,
             what="lock of %s" % key)
    return get


def test_duplicate_in_flight_is_409(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    first = start_slow(p, rdb, key, 1500)
    t0 = time.monotonic()
    resp = p.request("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"slow")
    assert time.monotonic() - t0 < 1.0, "the 409 must be answered at once"
    assert_problem(resp, 409, "idempotency_key_in_use", "2.6")
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert upstream.hits("/slow") == 1
    # After completion the duplicate is a replay.
    st2, h2, body2 = p.request("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"slow")
    assert st2 == 200 and hone(h2, REPLAY) == "true" and body2 == body
    assert upstream.hits("/slow") == 1


