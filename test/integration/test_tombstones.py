"""Tombstones (doc/configuration.md, Tombstones): once a completed record
expires, a retry with its key, whatever its body, gets 410
idempotency_key_expired (outcome expired) and nothing runs, for
--tombstone-ttl; DELETE /keys/<key> removes a tombstone; on Redis it is a
key of its own, at most 200 bytes (MEMORY USAGE) for a 36-byte key. On every
store (IDEMPROXY_TEST_STORE=memory, postgresql; a cluster pass too)."""
import json
import re
import time
import urllib.parse

from fixtures.client import REPLAY, assert_problem, hone, keyed, metrics_value, new_key
from fixtures.marks import redis_only
from fixtures.probes import redis_keys, redis_tomb_keys
from fixtures.routes import routed
from fixtures.waiting import wait_for

from test_dialects import assert_stripe_error


def admin(p, method, key, query=""):
    st, _, body = p.admin_request(method, "/keys/" + urllib.parse.quote(key, safe="") + query)
    return st, json.loads(body)


def expire(p, key, body=b"first", ttl="1"):
    """Runs <key> once, kept <ttl> s, and waits past its TTL. Returns its request."""
    req = keyed(key, body=body, extra=[("X-TTL", ttl)])
    st, h, _ = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "false"
    time.sleep(float(ttl) + 0.5)
    return req


def test_an_expired_key_answers_410_whatever_its_body(proxy, upstream):
    p = proxy("--ttl", "1", "--tombstone-ttl", "1m")
    key = new_key()
    req = expire(p, key)
    hits = upstream.hits("/echo")
    assert_problem(p.request(*req), 410, "idempotency_key_expired")
    assert_problem(p.request(*keyed(key, body=b"another body")), 410, "idempotency_key_expired")
    assert upstream.hits("/echo") == hits  # nothing ran
    assert metrics_value(p.metrics(), "idemproxy_requests_total", {"outcome": "expired"}) == 2
    if p.store == "redis":
        assert len(redis_keys(p.rdb, key)) == 0 and len(redis_tomb_keys(p.rdb, key)) == 1
    if p.store == "postgresql":  # the expiry job empties the tombstone's row of its answer
        wait_for(lambda: p.pg.sql("SELECT head IS NULL AND body IS NULL FROM idemproxy_keys "
                                  "WHERE key LIKE %s", ("%:" + key,)) == [(True,)],
                 timeout=5, what="the tombstone's answer dropped")
        assert_problem(p.request(*req), 410, "idempotency_key_expired")


def test_tombstone_ttl_runs_out_and_zero_disables(proxy, upstream):
    short = proxy("--ttl", "1", "--tombstone-ttl", "1")
    off = proxy("--ttl", "1", "--tombstone-ttl", "0")
    k1, k2 = new_key(), new_key()
    r1 = keyed(k1, body=b"a", extra=[("X-TTL", "1")])
    r2 = keyed(k2, body=b"b", extra=[("X-TTL", "1")])
    assert short.request(*r1)[0] == 201 and off.request(*r2)[0] == 201
    time.sleep(2.3)  # past the record's 1 s; the tombstone's 1 s more is not over
    hits = upstream.hits("/echo")
    st, h, _ = off.request(*r2)
    assert st == 201 and hone(h, REPLAY) == "false"  # no tombstone: it runs again
    assert upstream.hits("/echo") == hits + 1
    time.sleep(1.0)  # past 1 s + 1 s
    st, h, _ = short.request(*r1)
    assert st == 201 and hone(h, REPLAY) == "false"


def test_delete_removes_a_tombstone(proxy, upstream):
    p = proxy("--ttl", "1")
    key = new_key()
    req = expire(p, key)
    st, out = admin(p, "GET", key)  # listed on every store, with the scope to delete it by
    assert st == 200 and len(out["records"]) == 1, out
    (rec,) = out["records"]
    assert rec["state"] == "tombstone" and 0 < rec["ttl_ms"] <= 7 * 86400 * 1000, rec
    assert re.fullmatch("[0-9a-f]{64}", rec["fingerprint"]) and "status" not in rec, rec
    scope = rec["scope"]
    if p.store == "redis":
        assert redis_tomb_keys(p.rdb, key)[0].split(":")[2] == scope
    st, out = admin(p, "DELETE", key, "?scope=" + scope)
    assert st == 200, out
    st, h, _ = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "false"  # it runs again
    st, out = admin(p, "DELETE", key, "?scope=" + scope)
    assert st == 200  # the new record
    st, out = admin(p, "DELETE", key, "?scope=" + scope)
    assert st == 404


def test_a_deleted_record_leaves_no_tombstone(proxy, upstream):
    p = proxy("--ttl", "60")
    key = new_key()
    req = keyed(key, body=b"x")
    assert p.request(*req)[0] == 201
    st, out = admin(p, "GET", key)
    scope = out["records"][0]["scope"]
    assert admin(p, "DELETE", key, "?scope=" + scope)[0] == 200
    st, h, _ = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "false"


STRIPE = """
    routes:
      - name: sdk
        errors: stripe
        ttl: 1
        tombstone-ttl: 1h
"""


def test_stripe_dialect(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, STRIPE)
    key = new_key()
    req = expire(p, key, ttl="1")
    assert_stripe_error(p.request(*req), 410, "idempotency_key_expired", "idempotency_error")


@redis_only
def test_redis_tombstone_costs_at_most_200_bytes(proxy, upstream, rdb):
    p = proxy("--ttl", "1", "--tombstone-ttl", "7d")
    key = "k" * 36
    key = key[:-len(new_key()[:8])] + new_key()[:8]  # 36 bytes, new each run
    assert len(key) == 36
    req = keyed(key, body=b"y", extra=[("X-TTL", "1")])
    assert p.request(*req)[0] == 201
    tombs = redis_tomb_keys(rdb, key)
    assert len(tombs) == 1
    usage = rdb.memory_usage(tombs[0])
    assert usage <= 200, usage
    pttl = rdb.pttl(tombs[0])
    assert 7 * 86400 * 1000 < pttl <= (7 * 86400 + 1) * 1000, pttl
    assert len(rdb.get(tombs[0])) == 32  # the fingerprint
