"""Redis under Sentinel (SPEC 2.1): the proxy finds the master through the
sentinels, confirms it, and follows a failover without a restart. Real
servers: a master, a replica and three sentinels (redis_fixtures.py)."""
import threading
import time

import pytest

from conftest import (REPLAY, assert_problem, hone, metrics_value, new_key, redis_only,
                      wait_for)
from redis_fixtures import SentinelSet

# How long service may stop when the master dies: the sentinels need
# down-after-milliseconds (1 s) and an election (measured ~2.3 s in all for
# the set to promote the replica); the proxy then needs one question to a
# sentinel, or the +switch-master message.
FAILOVER_BOUND_S = 15.0


def readyz(p):
    return p.admin_request("GET", "/readyz")[0]


def execute(p, key, body=b"s"):
    return p.request("POST", "/echo", [("Idempotency-Key", key)], body, timeout=10)


@pytest.fixture
def sentinels(tmp_path):
    ss = SentinelSet(str(tmp_path / "sentinel")).start()
    yield ss
    ss.stop()


@redis_only
def test_sentinel_finds_the_master_and_serves_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 through the sentinels")
    key = new_key()
    st, h, body = execute(p, key)
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, body2 = execute(p, key)
    assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
    assert upstream.hits() == 1
    m = sentinels.master_client()
    assert any(k.decode().endswith(":" + key) for k in m.scan_iter(match="idem:*"))
    assert "master 'mymaster' is 127.0.0.1:%d" % sentinels.master_addr()[1] in p.stderr()


@redis_only
def test_sentinel_unknown_master_name_is_503_with_the_reason_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url(master="nosuchmaster"))
    assert_problem(execute(p, new_key()), 503, "store_unavailable")
    assert readyz(p) == 503
    assert upstream.hits() == 0
    wait_for(lambda: "none of the 3 knows the master 'nosuchmaster'" in p.stderr(), timeout=5,
             what="the reason in the log")


def load(p, stop, results):
    """New keys, one after another, until <stop>: (time, status) of each."""
    while not stop.is_set():
        try:
            st, _, _ = execute(p, new_key())
        except OSError:
            st = 0
        results.append((time.monotonic(), st))
        time.sleep(0.02)


def failover_under_load(p, sentinels, upstream, how):
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    done_key = new_key()
    st, _, body = execute(p, done_key, b"before")
    assert st == 201
    # replicated before the failover: Redis promises no more than that
    assert sentinels.master_client().wait(1, 2000) >= 1
    hits_before = upstream.hits("/echo")
    stop, results = threading.Event(), []
    t = threading.Thread(target=load, args=(p, stop, results), daemon=True)
    t.start()
    time.sleep(0.5)
    t_fail = time.monotonic()
    old = how()
    new = sentinels.wait_failover(old, timeout=FAILOVER_BOUND_S)
    assert new != old
    # service resumes without a restart of the proxy
    wait_for(lambda: any(ts > t_fail and s == 201 for ts, s in results[-20:]),
             timeout=FAILOVER_BOUND_S, what="a 201 after the failover")
    time.sleep(0.5)
    stop.set()
    t.join(10)
    resumed = min(ts for ts, s in results if ts > t_fail and s == 201) - t_fail
    statuses = {s for _, s in results}
    assert statuses <= {201, 503}, statuses  # refused while there was no master, never worse
    assert resumed < FAILOVER_BOUND_S
    # the answer completed and replicated before the failover still replays
    st, h, body2 = execute(p, done_key, b"before")
    assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
    assert p.alive()
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200 on the new master")
    assert metrics_value(p.metrics(), "idemproxy_redis_failovers_total") >= 1
    print("service resumed %.2f s after the master went (%s); %d requests, %d refused"
          % (resumed, how.__name__, len(results), sum(1 for _, s in results if s == 503)))
    return resumed, hits_before


@redis_only
def test_sentinel_master_killed_under_load_service_resumes_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    failover_under_load(p, sentinels, upstream, sentinels.kill_master)


@redis_only
def test_sentinel_master_frozen_under_load_service_resumes_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    failover_under_load(p, sentinels, upstream, sentinels.freeze_master)
    # the old master comes back as a replica: the proxy stays on the new one
    sentinels.thaw()
    time.sleep(1.0)
    for _ in range(5):
        st, _, _ = execute(p, new_key())
        assert st == 201
