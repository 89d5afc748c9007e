"""--wait (issue 4; doc/configuration.md, Holding duplicates: --wait): a
duplicate that arrives while the first request runs is held, without a
thread, until the first ends: it then gets the replay, or (the first stored
nothing) one duplicate executes; when the wait runs out it gets the 409."""
import json
import threading
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import redis_only, shared_store
from fixtures.probes import start_held
from fixtures.waiting import in_thread, wait_for

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)


def held_req(key, body=b"held"):
    return ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], body)


def proxy_threads(p):
    with open("/proc/%d/status" % p.proc.pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_wait_holds_duplicate_and_replays(proxy, upstream):
    p = proxy("--wait", "10")
    key = new_key()
    first = start_held(p, key)
    dup = in_thread(p.request, *held_req(key), timeout=30)
    time.sleep(0.3)  # the duplicate is held, not answered
    upstream.release(key)
    st1, h1, body1 = first()
    st, h, body = dup()
    assert st1 == 200 and hone(h1, REPLAY) == "false"
    assert st == 200 and hone(h, REPLAY) == "true"
    assert body == body1
    assert upstream.hits("/hold") == 1


def test_wait_runs_out_gives_409(proxy, upstream):
    p = proxy("--wait", "0.3")
    key = new_key()
    first = start_held(p, key)
    t0 = time.monotonic()
    resp = p.request(*held_req(key))
    elapsed = time.monotonic() - t0
    assert_problem(resp, 409, "idempotency_key_in_use", "2.6")
    assert 0.25 <= elapsed < 3, elapsed
    upstream.release(key)
    assert first()[0] == 200
    assert upstream.hits("/hold") == 1


def test_wait_duplicate_executes_when_first_not_stored(proxy, upstream):
    """The first's answer is not cacheable (here 200 is listed in
    --no-cache-status): the key is released and the held duplicate executes."""
    p = proxy("--wait", "10", "--no-cache-status", "5xx,429,200")
    key = new_key()
    first = start_held(p, key)
    dup = in_thread(p.request, *held_req(key), timeout=30)
    time.sleep(0.3)
    upstream.release(key)
    st1, h1, body1 = first()
    # The duplicate is now upstream itself, held like the first was: let it go.
    wait_for(lambda: upstream.hits("/hold") == 2, timeout=10, what="the duplicate to execute")
    upstream.release(key)
    st, h, body = dup()
    assert st1 == 200 and hone(h1, REPLAY) == "false"
    assert st == 200 and hone(h, REPLAY) == "false"
    assert json.loads(body)["seq"] != json.loads(body1)["seq"]
    assert upstream.hits("/hold") == 2


def test_wait_one_duplicate_takes_a_released_key_the_others_keep_waiting(proxy, upstream):
    p = proxy("--wait", "10", "--no-cache-status", "5xx,429,200")
    key = new_key()
    first = start_held(p, key)
    dups = [in_thread(p.request, *held_req(key), timeout=30) for _ in range(5)]
    time.sleep(0.5)
    upstream.release(key)  # answers the first, and later ones as they arrive
    results = [first()] + [d() for d in dups]
    # Not stored: each took the released key in turn and ran; none got a 409.
    assert [r[0] for r in results] == [200] * 6
    assert all(hone(r[1], REPLAY) == "false" for r in results)
    assert len({json.loads(r[2])["seq"] for r in results}) == 6
    assert upstream.hits("/hold") == 6


def test_wait_200_duplicates_cost_no_thread_each(proxy, upstream):
    p = proxy("--wait", "20")
    key = new_key()
    first = start_held(p, key)
    threads_before = proxy_threads(p)
    results = [None] * 200
    barrier = threading.Barrier(201)

    def dup(i):
        barrier.wait()
        results[i] = p.request(*held_req(key), timeout=60)

    ts = [threading.Thread(target=dup, args=(i,), daemon=True) for i in range(200)]
    for t in ts:
        t.start()
    barrier.wait()
    # All 200 are held: none answered, the upstream saw only the first.
    time.sleep(1.5)
    assert all(r is None for r in results)
    assert upstream.hits("/hold") == 1
    assert proxy_threads(p) == threads_before, "a thread per held duplicate?"
    upstream.release(key)
    st1, _, body1 = first()
    for t in ts:
        t.join(30)
    assert all(r is not None for r in results)
    for st, h, body in results:
        assert st == 200 and hone(h, REPLAY) == "true" and body == body1
    assert upstream.hits("/hold") == 1


def test_wait_off_by_default_gives_409_at_once(proxy, upstream):
    p = proxy()
    key = new_key()
    first = start_held(p, key)
    assert_problem(p.request(*held_req(key)), 409, "idempotency_key_in_use", "2.6")
    upstream.release(key)
    assert first()[0] == 200


def test_wait_sigterm_answers_held_duplicates(proxy, upstream):
    """On SIGTERM a held duplicate is not kept for its whole --wait: it gets
    the 409 and the proxy drains."""
    p = proxy("--wait", "60", "--shutdown-timeout", "20")
    key = new_key()
    first = start_held(p, key)
    dup = in_thread(p.request, *held_req(key), timeout=30)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.proc.send_signal(15)
    assert_problem(dup(), 409, "idempotency_key_in_use", "2.6")
    assert time.monotonic() - t0 < 10
    upstream.release(key)
    assert first()[0] == 200
    assert p.stop() == 0


@shared_store
def test_wait_across_two_proxies_shared_redis(proxy, upstream, rdb):
    """The first runs on one instance, the duplicate is held by another: the
    completing script's notification (pub/sub) wakes it with the replay."""
    a = proxy()
    b = proxy("--wait", "10")
    if b.store == "redis":
        wait_for(lambda: rdb.pubsub_numsub("idemproxy:done")[0][1] >= 1, timeout=10,
                 what="the --wait instance to subscribe")
    else:  # PostgreSQL: its service connection LISTENs before it is ready
        wait_for(lambda: b.admin_request("GET", "/readyz")[0] == 200, timeout=10,
                 what="the --wait instance to LISTEN")
    key = new_key()
    first = start_held(a, key)
    dup = in_thread(b.request, *held_req(key), timeout=30)
    time.sleep(0.3)
    upstream.release(key)
    st1, _, body1 = first()
    st, h, body = dup()
    assert st1 == 200 and st == 200 and hone(h, REPLAY) == "true" and body == body1
    assert upstream.hits("/hold") == 1


@redis_only
def test_wait_subscribes_only_with_wait_redis_pubsub(proxy, upstream, rdb):
    proxy()
    time.sleep(0.3)
    assert rdb.pubsub_numsub("idemproxy:done")[0][1] == 0
    proxy("--wait", "1")
    wait_for(lambda: rdb.pubsub_numsub("idemproxy:done")[0][1] == 1, timeout=10,
             what="one subscriber")
