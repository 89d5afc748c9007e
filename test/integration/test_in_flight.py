"""in_flight: a duplicate while the first request runs (README.md, What it does
with each request; doc/configuration.md, Holding duplicates: --wait)."""
import time

import pytest

from fixtures import probes
from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.probes import assert_completed, assert_locked, start_held

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)


def start_slow(p, rdb, key, ms, body=b"slow", path=None):
    """probes.start_slow, with the signature pending/test_wait.py still uses
    (rdb is not needed: the proxy knows its store and Redis client)."""
    assert rdb is None or rdb is p.rdb
    return probes.start_slow(p, key, ms, body=body, path=path)


def test_duplicate_in_flight_is_409(proxy, upstream):
    p = proxy()
    key = new_key()
    req = ("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"slow")
    first = probes.start_slow(p, key, 1500)
    t0 = time.monotonic()
    resp = p.request(*req)
    assert time.monotonic() - t0 < 1.0, "the 409 must be answered at once"
    assert_problem(resp, 409, "idempotency_key_in_use", "2.6")
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert upstream.hits("/slow") == 1
    # After completion the duplicate is a replay.
    st2, h2, body2 = assert_completed(p, key, req, body=body)
    assert st2 == 200
    assert upstream.hits("/slow") == 1


def test_lock_held_until_upstream_answers(proxy, upstream):
    """However long the upstream takes, every duplicate meanwhile gets 409."""
    p = proxy()
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    first = start_held(p, key)
    for _ in range(3):
        assert_locked(p, key, req)
        time.sleep(0.2)
    upstream.release(key)
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert_completed(p, key, req, body=body)
    assert upstream.hits("/hold") == 1
