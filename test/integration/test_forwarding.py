"""Forwarding: target, headers, X-Forwarded-*, Expect, hop-by-hop (README.md,
What it does with each request: Forwarding)."""
import http.client
import json
import select
import socket

import pytest

from fixtures.client import REPLAY, hone, hvalues, new_key
from fixtures.marks import store_independent
from fixtures.probes import redis_record

pytestmark = pytest.mark.both_clients  # on idemproxy's own upstream client and libcurl's


def echo_headers(body):
    return [(k, v) for k, v in json.loads(body)["headers"]]


TARGETS = [
    "/echo?a=1&a=2&b=%20+c&d=%2F",
    "/echo/%2e%2E/x;p=1?q=%41&&=",
    "/x/../echo?dot=1",
    "/echo//double?z=%zz&u=%C3%A9&s=a/b?c",
    "/echo?" + "q" * 2000,
]


@store_independent
@pytest.mark.parametrize("method,keyed", [("POST", True), ("GET", False)])
@pytest.mark.parametrize("target", TARGETS)
def test_raw_target_byte_identical(proxy, upstream, method, keyed, target):
    p = proxy()
    headers = [("Idempotency-Key", new_key())] if keyed else []
    st, h, body = p.request(method, target, headers, b"t" if keyed else None)
    assert st in (200, 201), (st, body[:300])
    assert hone(h, REPLAY) == ("false" if keyed else None)
    assert json.loads(body)["target"] == target
    assert upstream.requests[-1][1] == target
    assert upstream.hits() == 1


@store_independent
def test_forwarded_headers(proxy, upstream):
    p = proxy()
    key = new_key()
    st, _, body = p.request("POST", "/echo", [
        ("Host", "api.example.test:8443"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("Idempotency-Key", key),
        ("X-End-To-End", "kept"),
        ("Authorization", "Bearer t"),
        ("Content-Type", "application/json"),
    ], b'{"a":1}')
    assert st == 201
    obj = json.loads(body)
    h = echo_headers(body)
    assert obj["method"] == "POST" and obj["body"] == '{"a":1}'
    assert hvalues(h, "Host") == ["api.example.test:8443"]
    assert hvalues(h, "X-Forwarded-For") == ["10.0.0.1, 127.0.0.1"]
    assert hvalues(h, "X-Forwarded-Proto") == ["http"]
    assert hvalues(h, "X-Forwarded-Host") == ["api.example.test:8443"]
    assert hvalues(h, "Idempotency-Key") == [key]
    assert hvalues(h, "X-End-To-End") == ["kept"]
    assert hvalues(h, "Authorization") == ["Bearer t"]
    assert hvalues(h, "Content-Type") == ["application/json"]
    assert hvalues(h, "Content-Length") == ["7"] or hvalues(h, "Transfer-Encoding") == ["chunked"]


@store_independent
def test_forwarded_for_without_incoming_chain(proxy, upstream):
    p = proxy()
    st, _, body = p.request("GET", "/echo", [("Host", "h.test")])
    h = echo_headers(body)
    assert hvalues(h, "X-Forwarded-For") == ["127.0.0.1"]
    assert hvalues(h, "X-Forwarded-Host") == ["h.test"]
    assert hvalues(h, "X-Forwarded-Proto") == ["http"]
    assert hvalues(h, "Host") == ["h.test"]


@store_independent
def test_client_cannot_spoof_proto_and_host(proxy, upstream):
    p = proxy()
    st, _, body = p.request("GET", "/echo", [("Host", "real.test"),
                                             ("X-Forwarded-Proto", "https"),
                                             ("X-Forwarded-Host", "evil.test")])
    h = echo_headers(body)
    assert hvalues(h, "X-Forwarded-Proto") == ["http"]
    assert hvalues(h, "X-Forwarded-Host") == ["real.test"]


def expect_request(port, key, body):
    """Sends headers with Expect: 100-continue, waits (bounded) for the interim
    answer, then the body. Returns (status, headers, body) of the final answer."""
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(body)
    if key:
        head += b"Idempotency-Key: " + key.encode() + b"\r\n"
    head += b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        s.sendall(head)
        select.select([s], [], [], 2.0)  # the 100 Continue, if any; parsed below
        s.sendall(body)
        r = http.client.HTTPResponse(s)
        r.begin()  # skips 100 Continue
        return r.status, r.getheaders(), r.read()
    finally:
        s.close()


@store_independent
@pytest.mark.parametrize("keyed", [True, False])
def test_expect_not_forwarded(proxy, upstream, keyed):
    p = proxy()
    key = new_key() if keyed else None
    st, h, body = expect_request(p.port, key, b"e" * 3000)
    assert st == 201
    assert hone(h, REPLAY) == ("false" if keyed else None)
    obj = json.loads(body)
    assert obj["body"] == "e" * 3000
    assert hvalues(echo_headers(body), "Expect") == []
    assert upstream.hits("/echo") == 1


@store_independent
def test_hop_by_hop_request_headers_not_forwarded(proxy, upstream):
    p = proxy()
    key = new_key()
    req = (b"POST /echo HTTP/1.1\r\nHost: t\r\n"
           b"Connection: keep-alive, X-Hop-Custom\r\n"
           b"X-Hop-Custom: secret\r\n"
           b"Keep-Alive: timeout=5\r\n"
           b"TE: trailers\r\n"
           b"Proxy-Authorization: Basic eDp5\r\n"
           b"X-End: yes\r\n"
           b"Idempotency-Key: " + key.encode() + b"\r\n"
           b"Content-Length: 2\r\n\r\nhi")
    st, h, body = p.raw(req)
    assert st == 201 and hone(h, REPLAY) == "false"
    fwd = echo_headers(body)
    names = [k.lower() for k, _ in fwd]
    for hop in ("x-hop-custom", "keep-alive", "te", "proxy-authorization", "upgrade",
                "trailer", "expect"):
        assert hop not in names, (hop, fwd)
    for v in hvalues(fwd, "Connection"):
        assert "x-hop-custom" not in v.lower(), fwd
    assert hvalues(fwd, "X-End") == ["yes"]
    assert json.loads(body)["body"] == "hi"


def check_no_private(h):
    names = [k.lower() for k, _ in h]
    assert "x-private" not in names, h
    assert "keep-alive" not in names, h
    for v in hvalues(h, "Connection"):
        assert "x-private" not in v.lower(), h
    assert hvalues(h, "X-Public") == ["yes"]


def test_connection_listed_response_headers_stripped(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    st, h, b1 = p.request("POST", "/connection-header", [("Idempotency-Key", key)], b"x")
    assert st == 200 and hone(h, REPLAY) == "false"
    check_no_private(h)
    st, h, b2 = p.request("POST", "/connection-header", [("Idempotency-Key", key)], b"x")
    assert st == 200 and hone(h, REPLAY) == "true" and b2 == b1
    check_no_private(h)
    # Not stored either (the replay above shows it; on Redis, read the record too).
    if p.store == "redis":
        head = redis_record(rdb, key)["head"]
        assert b"secret" not in head and b"X-Private" not in head and b"timeout=5" not in head
    # Passthrough answers are cleaned too.
    st, h, _ = p.request("GET", "/connection-header")
    assert st == 200 and hone(h, REPLAY) is None
    check_no_private(h)
    assert upstream.hits("/connection-header") == 2


def test_chunked_upstream_answer_replayed(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, b1 = p.request("POST", "/chunked", [("Idempotency-Key", key)], b"x")
    assert st == 200 and hone(h, REPLAY) == "false"
    assert b1 == b"hello chunked world 1"
    st, h, b2 = p.request("POST", "/chunked", [("Idempotency-Key", key)], b"x")
    assert st == 200 and hone(h, REPLAY) == "true" and b2 == b1
    assert len(hvalues(h, "Transfer-Encoding")) <= 1
    assert upstream.hits("/chunked") == 1


def test_keep_alive_client_connection(proxy, upstream):
    """Several requests on one client connection, keyed and not."""
    p = proxy()
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=15)
    try:
        key = new_key()
        bodies = []
        for i in range(4):
            conn.request("POST", "/echo", body=b"ka", headers={"Idempotency-Key": key})
            r = conn.getresponse()
            bodies.append(r.read())
            assert r.status == 201
            assert r.getheader(REPLAY) == ("false" if i == 0 else "true")
            conn.request("GET", "/echo")
            r = conn.getresponse()
            r.read()
            assert r.status == 201 and r.getheader(REPLAY) is None
        assert len(set(bodies)) == 1
    finally:
        conn.close()
    assert upstream.hits("/echo") == 5


@store_independent
def test_upstream_connections_reused(proxy, upstream):
    p = proxy()
    for _ in range(10):
        assert p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")[0] == 201
    assert upstream.hits("/echo") == 10
    assert upstream.connections <= 5, "upstream connections are not kept alive: %d" % (
        upstream.connections)


@store_independent
def test_head_and_other_methods_pass(proxy, upstream):
    p = proxy()
    st, h, body = p.request("HEAD", "/echo")
    assert st == 201 and body == b""
    st, _, body = p.request("OPTIONS", "/echo")
    assert st == 201 and json.loads(body)["method"] == "OPTIONS"
    st, _, body = p.request("DELETE", "/echo", [("Idempotency-Key", new_key())])
    assert st == 201 and json.loads(body)["method"] == "DELETE"
