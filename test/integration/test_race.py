"""Concurrent duplicates: exactly one execution (doc/guarantees.md, Guarantees
and failure behaviour)."""
import json
import threading

import pytest

from fixtures.client import REPLAY, hone, http_request, new_key
from fixtures.marks import shared_store
from fixtures.probes import assert_completed

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)

N = 50


def fire(p, n, path, key, body, proxies=None):
    barrier = threading.Barrier(n, timeout=20)
    results = [None] * n

    def run(i):
        target = (proxies or [p])[i % len(proxies or [p])]
        try:
            barrier.wait()
            results[i] = http_request("127.0.0.1", target.port, "POST", path,
                                      [("Idempotency-Key", key)], body, timeout=20)
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a racing request did not finish"
    for r in results:
        assert not isinstance(r, Exception), r
    return results


def check(results):
    executed = [r for r in results if hone(r[1], REPLAY) == "false"]
    assert len(executed) == 1, [(r[0], hone(r[1], REPLAY)) for r in results]
    st, _, body = executed[0]
    for r in results:
        if r[0] == 409:
            obj = json.loads(r[2])
            assert obj["code"] == "idempotency_key_in_use"
            assert hone(r[1], REPLAY) is None
        else:
            assert (r[0], r[2]) == (st, body), (r[0], r[2][:200])
            assert hone(r[1], REPLAY) in ("false", "true")
    return executed[0]


@pytest.mark.parametrize("path", ["/echo", "/slow?ms=200"])
def test_parallel_duplicates_execute_once(proxy, upstream, path):
    p = proxy()
    key = new_key()
    results = fire(p, N, path, key, b'{"pay":1}')
    _, _, body = check(results)
    assert upstream.hits(path.split("?")[0]) == 1
    assert_completed(p, key, ("POST", path, [("Idempotency-Key", key)], b'{"pay":1}'),
                     body=body)


@shared_store
def test_parallel_duplicates_across_two_proxies_shared_redis(proxy, upstream, rdb):
    p1, p2 = proxy(), proxy()
    key = new_key()
    results = fire(p1, N, "/echo", key, b"two", proxies=[p1, p2])
    check(results)
    assert upstream.hits("/echo") == 1


def test_parallel_distinct_keys_all_execute(proxy, upstream):
    p = proxy()
    keys = [new_key() for _ in range(30)]
    barrier = threading.Barrier(len(keys), timeout=20)
    results = {}

    def run(k):
        try:
            barrier.wait()
            results[k] = p.request("POST", "/echo", [("Idempotency-Key", k)], k.encode())
        except Exception as e:  # noqa: BLE001
            results[k] = e

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == len(keys)
    for k, r in results.items():
        assert not isinstance(r, Exception), r
        st, h, body = r
        assert st == 201 and hone(h, REPLAY) == "false"
        assert json.loads(body)["body"] == k
    assert upstream.hits("/echo") == len(keys)
