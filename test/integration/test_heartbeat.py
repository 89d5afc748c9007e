"""Lock heartbeat, fencing of a stale holder, client disconnect
(doc/guarantees.md, Guarantees and failure behaviour)."""
import json
import socket
import time

import pytest

from fixtures.client import REPLAY, hone, metrics_value, new_key
from fixtures.marks import redis_only, shared_store
from fixtures.probes import (assert_completed, assert_locked, redis_keys, redis_lease_ms,
                             start_held, start_slow, wait_completed)
from fixtures.waiting import wait_for

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)


def test_heartbeat_keeps_lock(proxy, upstream, rdb):
    """A request running far past --lock-ttl keeps its lock."""
    p = proxy("--lock-ttl", "1")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    t0 = time.monotonic()
    first = start_held(p, key)
    for at in (1.5, 2.2, 3.0):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        assert_locked(p, key, req)  # lock lost at <at> s otherwise
        if p.store == "redis":
            lease = redis_lease_ms(rdb, key)
            assert 0 < lease <= 1000, lease
    upstream.release(key)
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert_completed(p, key, req, body=body)
    assert upstream.hits("/hold") == 1
    assert "lock_lost" not in p.stderr()


@redis_only
def test_stale_holder_does_not_overwrite_redis_hash_edit(proxy, upstream, rdb):
    p = proxy("--lock-ttl", "1")
    key = new_key()
    first = start_slow(p, key, 2500)
    skey = redis_keys(rdb, key)[0]
    own = rdb.hget(skey, "token")
    assert own and len(own) >= 16
    foreign = b"f" * len(own) if own != b"f" * len(own) else b"e" * len(own)
    # Another holder took the lock (as if ours had expired).
    keep = int(rdb.hget(skey, "keep"))
    rdb.hset(skey, "token", foreign)
    rdb.pexpire(skey, keep + 30000)
    st, h, body = first()
    assert st == 200, "the stale holder's client gets its own upstream answer"
    assert hone(h, REPLAY) == "false"
    time.sleep(0.3)  # let any (wrong) late write land
    rec = {k: v for k, v in rdb.hgetall(skey).items()}
    assert rec.get(b"token") == foreign, rec
    assert rec.get(b"state") == b"L", rec
    assert rdb.pttl(skey) > keep + 20000, "the foreign lock's TTL was changed"
    # Counted as lock_lost once, in the log and the metric, though both the
    # heartbeat and the complete found the lock gone.
    assert p.stderr().count("lock_lost") == 1, p.stderr()
    assert metrics_value(p.metrics(), "idemproxy_lock_lost_total") == 1
    # A duplicate now sees the foreign lock as in flight.
    st, _, _ = p.request("POST", "/slow?ms=2500", [("Idempotency-Key", key)], b"slow")
    assert st == 409
    assert upstream.hits("/slow") == 1


@redis_only
def test_stale_holder_after_delete_redis_hash_edit(proxy, upstream, rdb):
    """The lock vanished (expired) and nobody took it: complete must not recreate it."""
    p = proxy("--lock-ttl", "1")
    key = new_key()
    first = start_slow(p, key, 1500)
    skey = redis_keys(rdb, key)[0]
    rdb.delete(skey)
    rdb.hset(skey, mapping={"state": "L", "token": "someone-else-0123456789", "fp": "x",
                            "keep": "60000"})
    rdb.pexpire(skey, 90000)
    assert first()[0] == 200
    time.sleep(0.3)
    assert rdb.hget(skey, "state") == b"L"
    assert rdb.hget(skey, "token") == b"someone-else-0123456789"


@shared_store
def test_lock_of_killed_proxy_expires_retry_shared_redis(proxy, upstream, rdb):
    """A proxy that dies holding a lock stops its heartbeat: another proxy on the
    same Redis sees the key in flight, then (--on-unknown-outcome retry) takes
    it over within --lock-ttl. (Under refuse it is unknown: test_faults.py.)"""
    p1 = proxy("--lock-ttl", "2", "--on-unknown-outcome", "retry")
    p2 = proxy("--lock-ttl", "2", "--on-unknown-outcome", "retry")
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    start_held(p1, key)
    assert p1.kill() == -9
    t_kill = time.monotonic()
    assert_locked(p2, key, req)
    upstream.release(key)  # the dead proxy's upstream call ends; nobody completes it

    def executed():
        st, h, body = p2.request(*req)
        if st == 409:
            assert json.loads(body)["code"] == "idempotency_key_in_use"
            return None
        assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
        return True

    wait_for(executed, timeout=8, interval=0.1, what="the dead proxy's lock to expire")
    assert time.monotonic() - t_kill < 6, "the lock outlived --lock-ttl by far"
    assert upstream.hits("/hold") == 2
    assert_completed(p2, key, req)


def test_client_disconnect_does_not_cancel(proxy, upstream):
    p = proxy()
    key = new_key()
    body = b"gone"
    req = (b"POST /slow?ms=800 HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " + key.encode() +
           b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    s.sendall(req)
    s.close()
    t0 = time.monotonic()
    # The gone client's request reaches the upstream before any duplicate is
    # sent: connections may be served by different event loops, in any order.
    wait_for(lambda: upstream.hits("/slow") == 1, timeout=5, what="the upstream call")
    wait_completed(p, key, ("POST", "/slow?ms=800", [("Idempotency-Key", key)], body),
                   timeout=6)
    assert time.monotonic() - t0 >= 0.5
    assert upstream.hits("/slow") == 1


def test_client_disconnect_during_upstream_wait(proxy, upstream):
    """Disconnect after the lock is taken and the upstream call runs."""
    p = proxy()
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"z")
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    s.sendall(b"POST /hold?id=" + key.encode() + b" HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " +
              key.encode() + b"\r\nContent-Length: 1\r\n\r\nz")
    wait_for(lambda: upstream.hits("/hold") == 1, timeout=5, what="the upstream call")
    s.close()
    time.sleep(0.2)  # let the proxy notice the disconnect
    assert_locked(p, key, req)  # still running for the gone client
    upstream.release(key)
    wait_completed(p, key, req, timeout=6)
    assert upstream.hits("/hold") == 1
