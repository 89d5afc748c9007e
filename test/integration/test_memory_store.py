"""The memory store's own properties (doc/stores.md, Choosing a store;
doc/guarantees.md, Guarantees and failure behaviour): a budget that evicts
the oldest completed records and never a lock, store_unavailable when only
locks are left, nothing kept across a restart, no Redis. Everything else
about the store is in the shared suite, which runs on both stores."""
import json
import threading

import pytest

from fixtures.client import REPLAY, assert_problem, hone, keyed, new_key
from fixtures.marks import memory_only
from fixtures.probes import assert_completed, assert_free, assert_locked, start_held
from fixtures.upstream import big_body
from fixtures.waiting import wait_for

# A small budget. --memory-max-bytes must be at least twice --max-response, so the
# two are lowered together. A stored record costs about its body and headers plus
# a few hundred bytes: 64 KiB holds some 15 records of 3000 bytes, never 40.
SMALL = ("--memory-max-bytes", "64K", "--max-response", "4K")
BIG = 3000


def big_req(key):
    return keyed(key, path="/big?bytes=%d" % BIG)


def store_big(p, keys):
    for k in keys:
        st, h, body = p.request(*big_req(k))
        assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
        assert body == big_body(BIG)


@memory_only
@pytest.mark.parametrize("how", ["flag", "env"])
def test_memory_store_evicts_oldest_completed(proxy, upstream, how):
    if how == "flag":
        p = proxy(*SMALL)
    else:
        p = proxy(env={"IDEMPROXY_MEMORY_MAX_BYTES": "64K", "IDEMPROXY_MAX_RESPONSE": "4K"})
    keys = [new_key() for _ in range(60)]
    store_big(p, keys)
    # The newest records are kept.
    for k in keys[-4:]:
        assert_completed(p, k, big_req(k), body=big_body(BIG))
    # The oldest was evicted (60 x 3000 bytes cannot fit in 64 KiB): it runs again.
    assert_free(p, keys[0], big_req(keys[0]))
    assert upstream.hits("/big") == 61
    # The operator is told, with what to do about it.
    log = wait_for(lambda: "memory store full" in p.stderr() and p.stderr(), timeout=5,
                   what="the eviction warning")
    assert "evicted before their --ttl" in log and "--memory-max-bytes" in log


@memory_only
def test_memory_store_never_evicts_a_lock(proxy, upstream):
    """A request in flight keeps its lock while completed records are stored and
    evicted around it, far beyond the budget."""
    p = proxy(*SMALL)
    lock_key = new_key()
    lock_req = ("POST", "/hold?id=%s" % lock_key, [("Idempotency-Key", lock_key)], b"held")
    first = start_held(p, lock_key)  # the oldest entry of the store
    keys = [new_key() for _ in range(40)]
    store_big(p, keys[:20])
    assert_locked(p, lock_key, lock_req)
    store_big(p, keys[20:])
    assert_locked(p, lock_key, lock_req)
    # Evictions did happen meanwhile: the oldest record is gone, the newest kept.
    assert_completed(p, keys[-1], big_req(keys[-1]), body=big_body(BIG))
    assert_free(p, keys[0], big_req(keys[0]))
    upstream.release(lock_key)
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert_completed(p, lock_key, lock_req, body=body)
    assert upstream.hits("/hold") == 1


def _try_hold(p, upstream, key):
    """Sends a keyed POST /hold?id=full. Returns ("held", getter) once the upstream
    has it (the key is locked) or ("answered", response) if the proxy answered
    without calling the upstream."""
    box = {}
    done = threading.Event()

    def run():
        try:
            box["v"] = p.request("POST", "/hold?id=full", [("Idempotency-Key", key)], b"h",
                                 timeout=60)
        except BaseException as e:  # noqa: B036
            box["e"] = e
        finally:
            done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: done.is_set() or upstream.received("Idempotency-Key", key),
             timeout=10, what="an answer or an upstream call for %s" % key)
    if upstream.received("Idempotency-Key", key):
        def get(timeout=30.0):
            t.join(timeout)
            assert not t.is_alive(), "held request did not finish"
            if "e" in box:
                raise box["e"]
            return box["v"]
        return "held", get
    if "e" in box:
        raise box["e"]
    return "answered", box["v"]


@memory_only
def test_memory_store_full_of_locks_is_503_then_recovers(proxy, upstream):
    """Locks are never evicted: once they fill the budget, a new key gets 503
    store_unavailable (Retry-After: 1) and the upstream is not called; when the
    requests finish, their records can be evicted and new keys work again."""
    p = proxy("--memory-max-bytes", "8K", "--max-response", "1K")
    held = []
    refused = None
    for _ in range(400):  # a lock costs a few hundred bytes: 8 KiB is full long before
        key = new_key()
        kind, v = _try_hold(p, upstream, key)
        if kind == "answered":
            refused = v
            break
        held.append((key, v))
    assert refused is not None, "400 locks did not fill an 8 KiB budget"
    assert held, "not even one lock fitted in the budget"
    assert_problem(refused, 503, "store_unavailable")
    # Still full: a new key is refused at once, without calling the upstream...
    before = upstream.hits()
    assert_problem(p.request(*keyed(new_key())), 503, "store_unavailable")
    assert upstream.hits() == before
    # ...while the locks stand, and requests that need no store still pass.
    k0 = held[0][0]
    assert_locked(p, k0, ("POST", "/hold?id=full", [("Idempotency-Key", k0)], b"h"))
    st, h, _ = p.request("GET", "/echo")
    assert st == 201 and hone(h, REPLAY) is None
    assert p.admin_request("GET", "/healthz")[0] == 200
    upstream.release("full")
    for _, get in held:
        st, h, body = get()
        assert st == 200 and hone(h, REPLAY) == "false", (st, body[:200])
    assert upstream.hits("/hold") == len(held)

    # Recovered: once the finished requests are completed (in the background: the
    # clients do not wait for it), their records can be evicted and a new key
    # executes. Until then a new key may still get the 503.
    def new_key_executes():
        key = new_key()
        st, h, body = p.request(*keyed(key))
        if st == 503:
            assert_problem((st, h, body), 503, "store_unavailable")
            return None
        assert st == 201 and hone(h, REPLAY) == "false", (st, body[:200])
        return key, body

    key, body = wait_for(new_key_executes, timeout=15, interval=0.2,
                         what="a new key to execute once the locks are gone")
    assert_completed(p, key, keyed(key), body=body)


@memory_only
def test_memory_store_forgets_everything_on_restart(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, body = p.request(*keyed(key))
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_completed(p, key, keyed(key), body=body)
    p.restart()
    st, h, body2 = assert_free(p, key, keyed(key))
    assert json.loads(body2)["seq"] != json.loads(body)["seq"]
    assert upstream.hits("/echo") == 2


@memory_only
def test_two_memory_proxies_do_not_share_keys(proxy, upstream):
    """Each process has its own memory store (sharing needs Redis)."""
    p1, p2 = proxy(), proxy()
    key = new_key()
    st, h, b1 = p1.request(*keyed(key))
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, b2 = assert_free(p2, key, keyed(key))
    assert json.loads(b2)["seq"] != json.loads(b1)["seq"]
    assert_completed(p1, key, keyed(key), body=b1)
    assert_completed(p2, key, keyed(key), body=b2)


@memory_only
def test_memory_store_never_touches_redis(proxy, upstream, rdb, redis_server):
    """No --redis: the memory store is used, and Redis is never contacted, even
    though one runs (the proxy fixture also checks dbsize at teardown)."""
    conns = rdb.info("stats")["total_connections_received"]
    p = proxy()
    key = new_key()
    req = keyed(key, body=b"mem")
    st, h, b1 = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_completed(p, key, req, body=b1)
    assert_problem(p.request(*keyed(key, body=b"other")), 422, "idempotency_key_mismatch", "2.2")
    held = new_key()
    get = start_held(p, held)
    assert_locked(p, held, ("POST", "/hold?id=%s" % held, [("Idempotency-Key", held)], b"held"))
    upstream.release(held)
    assert get()[0] == 200
    assert upstream.hits("/echo") == 1
    assert rdb.dbsize() == 0
    assert rdb.info("stats")["total_connections_received"] == conns, "the proxy connected to Redis"
    # And it does not need it: with Redis down it is ready and keeps its records.
    redis_server.stop()
    assert p.admin_request("GET", "/readyz")[0] == 200
    assert_completed(p, key, req, body=b1)
    key2 = new_key()
    st, h, _ = assert_free(p, key2, keyed(key2))
    assert st == 201


@memory_only
def test_memory_store_answer_over_half_the_budget_kept_as_marker(proxy, upstream):
    """Locks may take half the budget, so an answer must fit in the other half.
    One that is within --max-response but not within half the budget (with its
    headers and overhead) is kept as the too-large marker: the client gets its
    answer, a duplicate gets 502 response_too_large, and it never runs twice."""
    p = proxy("--memory-max-bytes", "8K", "--max-response", "4K")
    key = new_key()
    req = keyed(key, path="/big?bytes=4000")
    st, h, body = p.request(*req)
    assert st == 200 and hone(h, REPLAY) == "false" and body == big_body(4000)

    def marker():
        r = p.request(*req)
        return r if r[0] == 502 else None  # 409 until the marker is stored

    obj = assert_problem(wait_for(marker, timeout=10, what="the too-large marker"), 502,
                         "response_too_large")
    assert "not executed again" in obj["detail"] or "was not executed" in obj["detail"], obj
    assert upstream.hits("/big") == 1
    assert "larger than the store can hold" in p.stderr()
    # A smaller answer under the same budget is stored and replayed as usual.
    k2 = new_key()
    st, h, body = p.request(*keyed(k2, path="/big?bytes=2000"))
    assert st == 200 and hone(h, REPLAY) == "false"
    assert_completed(p, k2, keyed(k2, path="/big?bytes=2000"), body=big_body(2000))
