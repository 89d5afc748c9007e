"""Scope: one client can never replay another's response (README.md, What it
does with each request: Scope; doc/guarantees.md, Threat model)."""
import json
import re

from fixtures.client import REPLAY, hone, new_key
from fixtures.probes import redis_keys


def post(p, key, extra=(), body=b"same"):
    return p.request("POST", "/echo", [("Idempotency-Key", key)] + list(extra), body)


def test_scope_by_authorization(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    a = [("Authorization", "Bearer AAA-secret")]
    b = [("Authorization", "Bearer BBB-secret")]
    st, h, ba = post(p, key, a)
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, bb = post(p, key, b)
    assert st == 201 and hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 2
    assert json.loads(ba)["seq"] != json.loads(bb)["seq"]
    st, h, ra = post(p, key, a)
    assert hone(h, REPLAY) == "true" and ra == ba
    st, h, rb = post(p, key, b)
    assert hone(h, REPLAY) == "true" and rb == bb
    assert upstream.hits("/echo") == 2
    # A third client with the same key executes: neither record leaks to it.
    st, h, bc = post(p, key, [("Authorization", "Bearer CCC-secret")])
    assert st == 201 and hone(h, REPLAY) == "false" and bc not in (ba, bb)
    assert upstream.hits("/echo") == 3
    if p.store == "redis":
        keys = redis_keys(rdb, key)
        assert len(keys) == 3
        for k in keys:
            assert re.fullmatch(r"idem:[0-9a-f]{32}:" + re.escape(key), k), k
        # No credential in clear in the store (the echoed body holds it, by design of /echo).
        for k in rdb.scan_iter(match="*"):
            assert b"secret" not in k
            if rdb.type(k) == b"string":  # a tombstone: the fingerprint's bytes
                assert all(c not in rdb.get(k) for c in (b"AAA-secret", b"BBB-secret"))
                continue
            for field, value in rdb.hgetall(k).items():
                if field != b"body":
                    for cred in (b"AAA-secret", b"BBB-secret", b"CCC-secret"):
                        assert cred not in value, field


def test_absent_and_empty_authorization_are_different_scopes(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    st, h, _ = post(p, key)
    assert hone(h, REPLAY) == "false"
    st, h, _ = p.raw(b"POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization:\r\nIdempotency-Key: " +
                     key.encode() + b"\r\nContent-Length: 4\r\nConnection: close\r\n\r\nsame")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 2
    if p.store == "redis":
        assert len(redis_keys(rdb, key)) == 2
    st, h, _ = post(p, key)
    assert hone(h, REPLAY) == "true"
    st, h, _ = p.raw(b"POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization:\r\nIdempotency-Key: " +
                     key.encode() + b"\r\nContent-Length: 4\r\nConnection: close\r\n\r\nsame")
    assert hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 2


def test_scope_header_option(proxy, upstream, rdb):
    p = proxy("--scope-header", "X-Tenant")
    key = new_key()
    st, h, b1 = post(p, key, [("X-Tenant", "t1"), ("Authorization", "A")])
    assert hone(h, REPLAY) == "false"
    # Authorization no longer scopes: same tenant replays.
    st, h, b2 = post(p, key, [("X-Tenant", "t1"), ("Authorization", "B")])
    assert hone(h, REPLAY) == "true" and b2 == b1
    st, h, b3 = post(p, key, [("X-Tenant", "t2"), ("Authorization", "A")])
    assert hone(h, REPLAY) == "false" and b3 != b1
    assert upstream.hits("/echo") == 2


def test_repeated_scope_header_option(proxy, upstream, rdb):
    p = proxy("--scope-header", "X-Tenant", "--scope-header", "X-User")
    key = new_key()
    st, h, _ = post(p, key, [("X-Tenant", "t1"), ("X-User", "u1")])
    assert hone(h, REPLAY) == "false"
    st, h, _ = post(p, key, [("X-Tenant", "t1"), ("X-User", "u2")])
    assert hone(h, REPLAY) == "false"
    st, h, _ = post(p, key, [("X-Tenant", "t1"), ("X-User", "u1")])
    assert hone(h, REPLAY) == "true"
    # Values are framed: ("t1u", "1") is not ("t1", "u1").
    st, h, _ = post(p, key, [("X-Tenant", "t1u"), ("X-User", "1")])
    assert hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 3
    if p.store == "redis":
        assert len(redis_keys(rdb, key)) == 3
