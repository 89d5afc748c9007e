"""Request ids and the access line (doc/operations.md, Metrics and access
log): a client's id is kept when it
is 1-200 bytes of 0x21-0x7E, else one is made; it is forwarded upstream,
set on every answer (executions, replays, problems, passthrough) and logged
with the client's address; a refused request gets one log line."""
import json
import re

import pytest

from fixtures.client import REPLAY, assert_problem, hone, hvalues, new_key, raw_request
from fixtures.marks import store_independent
from fixtures.waiting import wait_for

pytestmark = pytest.mark.both_clients  # on idemproxy's own upstream client and libcurl's

MADE = re.compile(r"^[0-9a-f]{32}$")


def access_lines(p):
    return [ln for ln in p.stderr().splitlines() if " info access " in ln]


def forwarded_ids(body):
    return [v for k, v in json.loads(body)["headers"] if k.lower() == "x-request-id"]


def test_request_id_kept_forwarded_and_echoed_on_replays(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, body = p.request("POST", "/echo", [("Idempotency-Key", key),
                                              ("X-Request-Id", "order-7f3a")], b"x")
    assert st == 201 and hone(h, "X-Request-Id") == "order-7f3a"
    assert forwarded_ids(body) == ["order-7f3a"]
    # The replay answers with its own request's id, not the first one's.
    st, h, body2 = p.request("POST", "/echo", [("Idempotency-Key", key),
                                               ("x-request-id", "retry-1")], b"x")
    assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
    assert hvalues(h, "X-Request-Id") == ["retry-1"]
    # Without one, one is made, each time another.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    made = hone(h, "X-Request-Id")
    assert MADE.match(made), made
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert MADE.match(hone(h, "X-Request-Id")) and hone(h, "X-Request-Id") != made
    assert upstream.hits("/echo") == 1
    wait_for(lambda: len(access_lines(p)) == 4, what="four access lines")
    lines = access_lines(p)
    assert lines[0].endswith(" request_id=order-7f3a client=127.0.0.1"), lines[0]
    assert " replayed " in lines[1] and " request_id=retry-1 client=127.0.0.1" in lines[1]
    assert (" request_id=%s " % made) in lines[2]


@store_independent
def test_request_id_on_problems_and_passthrough(proxy, upstream):
    p = proxy("--max-body", "10")
    key = new_key()
    # a problem the proxy answers itself
    resp = p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Request-Id", "big-1")],
                     b"x" * 100)
    assert_problem(resp, 413, "payload_too_large")
    assert hone(resp[1], "X-Request-Id") == "big-1"
    # a mismatch and a 409 come from the pipeline too
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"a")
    resp = p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Request-Id", "mm-1")], b"b")
    assert_problem(resp, 422, "idempotency_key_mismatch", "2.2")
    assert hone(resp[1], "X-Request-Id") == "mm-1"
    # passthrough: forwarded and echoed
    st, h, body = p.request("GET", "/echo", [("X-Request-Id", "get-1")])
    assert st == 201 and hone(h, "X-Request-Id") == "get-1"
    assert forwarded_ids(body) == ["get-1"]
    # an upstream error
    st, h, _ = p.request("GET", "/reset", [("X-Request-Id", "reset-1")])
    assert st == 502 and hone(h, "X-Request-Id") == "reset-1"


@store_independent
@pytest.mark.parametrize("value", [
    "has space", "x" * 201, "caf\u00e9", "tab\there", "del\x7fx",
])
def test_request_id_out_of_range_is_replaced(proxy, upstream, value):
    """A value outside 0x21-0x7E, or too long, is not forwarded nor echoed:
    one is made in its place, and the upstream sees that one only (a control
    byte makes the request malformed: its 400 carries a made id too)."""
    p = proxy()
    raw_value = value.encode("utf-8")
    req = (b"GET /echo HTTP/1.1\r\nHost: a\r\nX-Request-Id: " + raw_value
           + b"\r\nConnection: close\r\n\r\n")
    st, h, body = raw_request(p.port, req)
    ids = hvalues(h, "X-Request-Id")
    assert len(ids) == 1 and MADE.match(ids[0]), h
    if "\x7f" in value:
        assert st == 400 and upstream.hits() == 0
    else:
        assert st == 201, body[:300]
        assert forwarded_ids(body) == ids
    wait_for(lambda: access_lines(p), what="the access line")
    assert (" request_id=%s client=127.0.0.1" % ids[0]) in access_lines(p)[0]


@store_independent
def test_two_request_ids_are_replaced_by_one(proxy, upstream):
    p = proxy()
    st, h, body = p.request("GET", "/echo", [("X-Request-Id", "a"), ("X-Request-Id", "b")])
    assert st == 201
    rid = hone(h, "X-Request-Id")
    assert MADE.match(rid) and forwarded_ids(body) == [rid]


@store_independent
def test_request_id_header_renamed_and_disabled(proxy, upstream):
    p = proxy("--request-id-header", "X-Correlation-Id")
    st, h, body = p.request("GET", "/echo", [("X-Correlation-Id", "c-1"),
                                             ("X-Request-Id", "left-alone")])
    assert hone(h, "X-Correlation-Id") == "c-1" and hone(h, "X-Request-Id") is None
    assert forwarded_ids(body) == ["left-alone"]
    p.stop()
    p = proxy("--request-id-header", "")
    st, h, body = p.request("GET", "/echo", [("X-Request-Id", "as sent")])
    assert hone(h, "X-Request-Id") is None
    assert forwarded_ids(body) == ["as sent"]
    wait_for(lambda: access_lines(p), what="an access line")
    assert "request_id=" not in access_lines(p)[0]


@store_independent
def test_a_refused_request_has_one_log_line(proxy, upstream):
    p = proxy("--log-format", "json")
    st, _, _ = raw_request(p.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k\r\n"
                       b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n"
                       b"X-Request-Id: bad-1\r\nConnection: close\r\n\r\n0\r\n\r\n")
    assert st == 400

    def logged():
        return [json.loads(ln) for ln in p.stderr().splitlines() if ln.startswith("{")]

    wait_for(lambda: any(j["msg"] == "access" for j in logged()), what="the access line")
    # After the start-up lines, the refusal's one line.
    after_start = [j for j in logged() if "listening on" not in j["msg"]
                   and "without Idempotency-Key" not in j["msg"]]
    assert len(after_start) == 1, after_start
    line = after_start[0]
    assert line["msg"] == "access" and line["status"] == 400
    assert line["request_id"] == "bad-1" and line["client"] == "127.0.0.1"
    assert "Content-Length" in line["reason"] or "Transfer-Encoding" in line["reason"], line
    assert upstream.hits() == 0
