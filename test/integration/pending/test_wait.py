"""PENDING (issue 4, operability): --wait. Not collected until --wait is built."""
import json
import time

from conftest import *  # noqa: F401,F403 (moved as-is from: test_in_flight.py)
from test_in_flight import start_slow


def test_wait_holds_duplicate_and_replays(proxy, upstream, rdb):
    p = proxy("--wait", "5")
    key = new_key()
    first = start_slow(p, rdb, key, 1000)
    st, h, body = p.request("POST", "/slow?ms=1000", [("Idempotency-Key", key)], b"slow")
    st1, h1, body1 = first()
    assert st1 == 200 and hone(h1, REPLAY) == "false"
    assert st == 200 and hone(h, REPLAY) == "true"
    assert body == body1
    assert upstream.hits("/slow") == 1


def test_wait_runs_out_gives_409(proxy, upstream, rdb):
    p = proxy("--wait", "0.3")
    key = new_key()
    first = start_slow(p, rdb, key, 2000)
    t0 = time.monotonic()
    resp = p.request("POST", "/slow?ms=2000", [("Idempotency-Key", key)], b"slow")
    elapsed = time.monotonic() - t0
    assert_problem(resp, 409, "idempotency_key_in_use", "2.6")
    assert 0.2 <= elapsed < 1.8, elapsed
    assert first()[0] == 200
    assert upstream.hits("/slow") == 1


def test_wait_duplicate_executes_when_first_not_stored(proxy, upstream, rdb):
    """The first ends with a 500 (not cacheable): the waiting duplicate executes."""
    p = proxy("--wait", "5", "--no-cache-status", "5xx,429,200")
    key = new_key()
    first = start_slow(p, rdb, key, 800)
    st, h, body = p.request("POST", "/slow?ms=800", [("Idempotency-Key", key)], b"slow")
    st1, h1, body1 = first()
    assert st1 == 200 and hone(h1, REPLAY) == "false"
    assert st == 200 and hone(h, REPLAY) == "false"
    assert json.loads(body)["seq"] != json.loads(body1)["seq"]
    assert upstream.hits("/slow") == 2
