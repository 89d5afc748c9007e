"""passthrough, executed, replayed (README.md, What it does with each
request)."""
import json

from fixtures.client import REPLAY, end_to_end, hone, hvalues, keyed, new_key
from fixtures.marks import redis_only, single_redis_server
from fixtures.probes import (assert_completed, assert_free, assert_nothing_stored, redis_keys,
                             redis_record)
from fixtures.upstream import fake_date


def test_get_is_passthrough_with_and_without_key(proxy, upstream):
    p = proxy()
    key = new_key()
    for headers in ([], [("Idempotency-Key", key)]):
        st, h, body = p.request("GET", "/echo", headers)
        assert st == 201
        assert hone(h, REPLAY) is None
        assert json.loads(body)["method"] == "GET"
    assert upstream.hits("/echo") == 2
    assert_nothing_stored(p)
    # The GET left nothing under its key: a POST with it executes (no 422).
    assert_free(p, key)


def test_post_without_key_is_passthrough(proxy, upstream):
    p = proxy()
    for _ in range(2):
        st, h, _ = p.request("POST", "/echo", body=b"x")
        assert st == 201
        assert hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 2
    assert_nothing_stored(p)


def test_executed(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    req = keyed(key, body=b'{"amount":1}')
    st, h, body = p.request(*req)
    assert st == 201
    assert hone(h, REPLAY) == "false"
    obj = json.loads(body)
    assert obj["method"] == "POST" and obj["body"] == '{"amount":1}'
    assert upstream.hits("/echo") == 1
    if p.store == "redis":
        keys = redis_keys(rdb, key)
        assert len(keys) == 1
        prefix, scope, k = keys[0].split(":", 2)
        assert prefix == "idem" and k == key
        assert len(scope) == 32 and all(c in "0123456789abcdef" for c in scope), scope
        assert rdb.pttl(keys[0]) > 0
    assert_completed(p, key, req, body=body)
    assert upstream.hits("/echo") == 1


def test_replayed_byte_for_byte(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    req = ("POST", "/echo?x=1", [("Idempotency-Key", key), ("Content-Type", "application/json")],
           b'{"amount":42}')
    st1, h1, b1 = p.request(*req)
    assert st1 == 201 and hone(h1, REPLAY) == "false"
    st2, h2, b2 = p.request(*req)
    assert st2 == 201
    assert hone(h2, REPLAY) == "true"
    assert b2 == b1
    assert json.loads(b2)["seq"] == json.loads(b1)["seq"]
    # Same headers, same order; repeated Set-Cookie kept.
    assert end_to_end(h2) == end_to_end(h1)
    assert hvalues(h2, "Set-Cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert hone(h2, "X-Upstream") == "echo"
    # The original Date, exactly once (hone fails on a repeated header).
    assert hone(h2, "Date") == hone(h1, "Date")
    assert hone(h2, "Date") == fake_date(json.loads(b1)["seq"])
    assert upstream.hits("/echo") == 1
    # Replay again: still the same.
    st3, h3, b3 = p.request(*req)
    assert (st3, b3, end_to_end(h3)) == (st1, b1, end_to_end(h1))
    assert hone(h3, REPLAY) == "true"
    assert upstream.hits("/echo") == 1
    # Each answer carries its own request's id, a replay too.
    ids = [hone(h, "X-Request-Id") for h in (h1, h2, h3)]
    assert all(ids) and len(set(ids)) == 3, ids


def test_replay_content_length_matches_body(proxy, upstream):
    p = proxy()
    key = new_key()
    p.request("POST", "/big?bytes=3000", [("Idempotency-Key", key)], b"a")
    st, h, body = p.request("POST", "/big?bytes=3000", [("Idempotency-Key", key)], b"a")
    assert st == 200 and hone(h, REPLAY) == "true"
    assert len(body) == 3000
    cl = hone(h, "Content-Length")
    assert cl is None or int(cl) == 3000
    assert upstream.hits("/big") == 1


def test_quoted_and_bare_key_are_the_same(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    st1, h1, b1 = p.request("POST", "/echo", [("Idempotency-Key", '"%s"' % key)], b"q")
    assert st1 == 201 and hone(h1, REPLAY) == "false"
    st2, h2, b2 = p.request("POST", "/echo", [("Idempotency-Key", key)], b"q")
    assert st2 == 201 and hone(h2, REPLAY) == "true"
    assert json.loads(b2)["seq"] == json.loads(b1)["seq"]
    assert upstream.hits("/echo") == 1
    if p.store == "redis":
        assert len(redis_keys(rdb, key)) == 1


def test_quoted_key_escapes_unescaped(proxy, upstream, rdb):
    """"ab\\"c" is the key ab"c (valid: 0x22 is in 0x21-0x7E)."""
    p = proxy()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", '"esc\\"q\\\\x"')], b"e")
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", '"esc\\"q\\\\x"')], b"e")
    assert st == 201 and hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 1
    if p.store == "redis":
        keys = [k.decode() for k in rdb.scan_iter(match="idem:*", count=1000)
                if not k.startswith(b"idem:t:")]  # and its tombstone's
        assert len(keys) == 1
        assert keys[0].endswith(':esc"q\\x'), keys


def test_put_and_patch_are_enforced(proxy, upstream):
    p = proxy()
    for method in ("PUT", "PATCH"):
        key = new_key()
        st, h, _ = p.request(method, "/echo", [("Idempotency-Key", key)], b"m")
        assert st == 201 and hone(h, REPLAY) == "false"
        st, h, b = p.request(method, "/echo", [("Idempotency-Key", key)], b"m")
        assert st == 201 and hone(h, REPLAY) == "true"
        assert json.loads(b)["method"] == method
    assert upstream.hits("/echo") == 2


def test_methods_option(proxy, upstream, rdb):
    p = proxy("--methods", "POST,DELETE")
    key = new_key()
    st, h, _ = p.request("PUT", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) is None
    if p.store == "redis":
        assert redis_keys(rdb, key) == []
    # (Had the PUT stored anything, the DELETE below would get a 422.)
    st, h, _ = p.request("DELETE", "/echo", [("Idempotency-Key", key)])
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, _ = p.request("DELETE", "/echo", [("Idempotency-Key", key)])
    assert st == 201 and hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 2


def test_key_and_replay_header_and_prefix_options(proxy, upstream, rdb):
    p = proxy("--key-header", "X-Request-Key", "--replay-header", "X-Replayed",
              "--key-prefix", "myapp:")
    key = new_key()
    # The default header name is now just another header: passthrough.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, "X-Replayed") is None and hone(h, REPLAY) is None
    st, h, b1 = p.request("POST", "/echo", [("X-Request-Key", key)], b"x")
    assert st == 201 and hone(h, "X-Replayed") == "false" and hone(h, REPLAY) is None
    st, h, b2 = p.request("POST", "/echo", [("X-Request-Key", key)], b"x")
    assert st == 201 and hone(h, "X-Replayed") == "true"
    assert b1 == b2
    assert upstream.hits("/echo") == 2
    if p.store == "redis":
        assert redis_keys(rdb, key) == []
        assert len(redis_keys(rdb, key, prefix="myapp:")) == 1


@single_redis_server
def test_idempotency_disabled(proxy, upstream, redis_server):
    p = proxy(env={"IDEMPOTENCY_ENABLED": "false"})
    key = new_key()
    for _ in range(2):
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 2
    assert_nothing_stored(p)
    # No store is contacted: works with Redis down (on either store).
    redis_server.stop()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 3



@redis_only
def test_redis_url_from_env(proxy, upstream, rdb, redis_server):
    p = proxy(redis_arg=False, env={"IDEMPROXY_REDIS_URL": redis_server.url})
    key = new_key()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert redis_record(rdb, key)["state"] == b"C"


@redis_only
def test_two_proxies_share_keys_through_one_redis(proxy, upstream, rdb):
    p1 = proxy()
    p2 = proxy()
    key = new_key()
    st, h, b1 = p1.request("POST", "/echo", [("Idempotency-Key", key)], b"shared")
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, b2 = p2.request("POST", "/echo", [("Idempotency-Key", key)], b"shared")
    assert st == 201 and hone(h, REPLAY) == "true"
    assert b1 == b2
    assert upstream.hits("/echo") == 1


def test_fingerprint_ignores_other_headers(proxy, upstream):
    """Only method, raw target and body make the fingerprint."""
    p = proxy()
    key = new_key()
    st, h, b1 = p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Trace", "1"),
                                            ("Content-Type", "text/plain")], b"same")
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, b2 = p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Trace", "2"),
                                            ("User-Agent", "other")], b"same")
    assert st == 201 and hone(h, REPLAY) == "true" and b2 == b1
    assert upstream.hits("/echo") == 1


def test_replay_of_204_empty_body(proxy, upstream):
    """An empty upstream body (204) is stored and replayed as empty."""
    p = proxy()
    key = new_key()
    st, h, b1 = p.request("POST", "/status/204", [("Idempotency-Key", key)], b"")
    assert st == 204 and hone(h, REPLAY) == "false"
    st, h, b2 = p.request("POST", "/status/204", [("Idempotency-Key", key)], b"")
    assert st == 204 and hone(h, REPLAY) == "true" and b2 == b""
    assert upstream.hits("/status/204") == 1
