"""Key sources (doc/configuration.md, Key sources): where a route's key comes
from (a header, several headers, a JSON pointer into the body, the
fingerprint as a fallback), keys that never collide across sources, and /keys
and the access log for derived keys.

The route files here set neither upstream nor redis: the proxy fixture passes
--upstream and --redis, which beat the file anyway (one test checks exactly
that). Requests are told apart by route through the JSON access line each of
them writes (its "route" field), read from the proxy's stderr file
(fixtures/routes.py).
"""
import json
import re
import urllib.parse

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import store_independent
from fixtures.probes import redis_keys
from fixtures.routes import call, call_raw, routed, write_config
from fixtures.waiting import wait_for


# =========================================================================== 1. key sources
KEY_ROUTES = """
    routes:
      - name: webhooks
        match: {host: hooks.test}
        key: {json: /id}
        scope-header: []
      - name: webhooks-strict
        match: {host: strict.test}
        key: {json: /id}
        require-key: true
      - name: nested
        match: {host: nested.test}
        key: {json: /data/object/id}
      - name: tiny-hooks
        match: {host: tiny.test}
        key: {json: /id}
        require-key: true
        max-body: 64
      - name: cloudevents
        match: {host: ce.test}
        key: {headers: [ce-source, ce-id]}
      - name: cloudevents-strict
        match: {host: cestrict.test}
        key: {headers: [ce-source, ce-id]}
        require-key: true
      - name: keyless
        match: {host: fp.test}
        key: {header: X-Request-Id, fallback: fingerprint}
        require-key: true
      - name: json-fallback
        match: {host: jfp.test}
        key: {json: /id, fallback: fingerprint}
      - name: whole-body
        match: {host: whole.test}
        key: {json: ""}
        require-key: true
      - name: escaped-pointer
        match: {host: escaped.test}
        key: {json: /a~1b/c~0d}
        require-key: true
      - name: array-pointer
        match: {host: array.test}
        key: {json: /items/1/id}
        require-key: true
"""


def stripe_event(evt, amount=2000):
    return json.dumps({"id": evt, "object": "event", "type": "charge.succeeded",
                       "data": {"object": {"id": "ch_" + evt, "amount": amount}}},
                      separators=(",", ":")).encode()


def test_json_key_event_delivered_twice_executes_once(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    evt = "evt_" + new_key()
    body = stripe_event(evt)
    st, h1, b1, log = call(p, "POST", "/echo", [("Stripe-Signature", "t=1,v1=aaa")], body,
                           host="hooks.test")
    assert st == 201 and hone(h1, REPLAY) == "false"
    assert (log["route"], log["outcome"], log["key"]) == ("webhooks", "executed", evt)
    # the retry: another signature, another client credential; same event
    st, h2, b2, log = call(p, "POST", "/echo", [("Stripe-Signature", "t=2,v1=bbb"),
                                                 ("Authorization", "Bearer other")], body,
                           host="hooks.test")
    assert st == 201 and hone(h2, REPLAY) == "true"
    assert (log["outcome"], log["key"]) == ("replayed", evt)
    assert b2 == b1, "a replay is byte for byte the first answer"
    assert hone(h2, "Date") == hone(h1, "Date") and hone(h2, "X-Seq") == hone(h1, "X-Seq")
    assert upstream.hits("/echo") == 1
    # another event executes
    st, h, _, _ = call(p, "POST", "/echo", body=stripe_event("evt_" + new_key()),
                       host="hooks.test")
    assert hone(h, REPLAY) == "false" and upstream.hits("/echo") == 2


def test_json_key_from_a_chunked_body(proxy, upstream, tmp_path):
    """The key is read once the whole body is in, however it arrived: a chunked
    delivery and a Content-Length one of the same event are one request."""
    p = routed(proxy, tmp_path, KEY_ROUTES)
    evt = "evt_" + new_key()
    body = stripe_event(evt)
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in parts) + b"0\r\n\r\n"
    st, h, b1, log = call(p, "POST", "/echo", [("Transfer-Encoding", "chunked")], chunked,
                          host="strict.test")
    assert st == 201 and hone(h, REPLAY) == "false" and log["key"] == evt
    assert upstream.requests[-1][3] == body
    st, h, b2, log = call(p, "POST", "/echo", body=body, host="strict.test")
    assert hone(h, REPLAY) == "true" and b2 == b1 and log["key"] == evt
    assert upstream.hits("/echo") == 1


def test_json_key_same_id_other_body_is_mismatch(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    evt = "evt_" + new_key()
    st, h, _, _ = call(p, "POST", "/echo", body=stripe_event(evt, 2000), host="hooks.test")
    assert hone(h, REPLAY) == "false"
    st, h, b, log = call(p, "POST", "/echo", body=stripe_event(evt, 2001), host="hooks.test")
    assert_problem((st, h, b), 422, "idempotency_key_mismatch", "2.2")
    assert (log["outcome"], log["key"]) == ("mismatch", evt)
    # the same id, same bytes but another target is another request too
    st, h, b, _ = call(p, "POST", "/echo?again=1", body=stripe_event(evt, 2000),
                       host="hooks.test")
    assert_problem((st, h, b), 422, "idempotency_key_mismatch", "2.2")
    assert upstream.hits() == 1


NO_JSON_KEY = [
    pytest.param(b"id=evt_1&type=charge", id="form"),
    pytest.param(b"", id="empty"),
    pytest.param(b"{}", id="no-member"),
    pytest.param(b'{"ID":"evt_1"}', id="other-case"),
    pytest.param(b'{"data":{"id":"evt_1"}}', id="deeper"),
    pytest.param(b'["evt_1"]', id="array"),
    pytest.param(b'"evt_1"', id="bare-string"),
    pytest.param(b'{"id":"evt_1"} {"id":"evt_2"}', id="two-texts"),
    pytest.param(b'{"id":"evt_1",}', id="trailing-comma"),
    pytest.param(b'{"id":"evt_1"', id="truncated"),
]


@pytest.mark.parametrize("body", NO_JSON_KEY)
def test_json_without_key_is_passthrough_or_missing(proxy, upstream, tmp_path, body):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    for i in range(2):
        st, h, b, log = call(p, "POST", "/echo", body=body, host="hooks.test")
        assert st == 201 and hone(h, REPLAY) is None, (st, h)
        assert (log["route"], log["outcome"]) == ("webhooks", "passthrough")
        assert "key" not in log
        assert upstream.requests[-1][3] == body
    assert upstream.hits("/echo") == 2
    st, h, b, log = call(p, "POST", "/echo", body=body, host="strict.test")
    obj = assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert "/id" in obj["detail"], obj
    assert (log["route"], log["outcome"]) == ("webhooks-strict", "missing_key")
    assert upstream.hits("/echo") == 2


INVALID_JSON_KEY = [
    pytest.param(b'{"id":1.5}', id="real"),
    pytest.param(b'{"id":1e3}', id="exponent"),
    pytest.param(b'{"id":1.0}', id="real-integral"),
    pytest.param(b'{"id":true}', id="true"),
    pytest.param(b'{"id":false}', id="false"),
    pytest.param(b'{"id":null}', id="null"),
    pytest.param(b'{"id":{"v":"evt_1"}}', id="object"),
    pytest.param(b'{"id":["evt_1"]}', id="array"),
    pytest.param(b'{"id":"evt 1"}', id="space"),
    pytest.param(b'{"id":""}', id="empty"),
    pytest.param(b'{"id":"evt\\t1"}', id="tab"),
    pytest.param(b'{"id":"caf\\u00e9"}', id="non-ascii"),
    pytest.param(b'{"id":"' + b"k" * 256 + b'"}', id="256-bytes"),
]


@pytest.mark.parametrize("body", INVALID_JSON_KEY)
def test_json_key_of_wrong_type_is_invalid(proxy, upstream, tmp_path, body):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    for host, route in (("hooks.test", "webhooks"), ("strict.test", "webhooks-strict"),
                        ("jfp.test", "json-fallback")):
        st, h, b, log = call(p, "POST", "/echo", body=body, host=host)
        assert_problem((st, h, b), 400, "idempotency_key_invalid", "2.1")
        assert (log["route"], log["outcome"]) == (route, "invalid_key")
    assert upstream.hits() == 0


def test_json_key_of_255_bytes_is_valid(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    evt = "k" * 250 + new_key()[-5:]
    body = json.dumps({"id": evt}).encode()
    st, h, _, log = call(p, "POST", "/echo", body=body, host="strict.test")
    assert st == 201 and hone(h, REPLAY) == "false" and log["key"] == evt
    st, h, _, _ = call(p, "POST", "/echo", body=body, host="strict.test")
    assert hone(h, REPLAY) == "true"


def test_json_integer_key(proxy, upstream, rdb, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    for n in (42, -7, 0, 9007199254740993):
        body = b'{"id": %d, "kind": "int"}' % n
        st, h, b1, log = call(p, "POST", "/echo", body=body, host="strict.test")
        assert st == 201 and hone(h, REPLAY) == "false"
        assert (log["outcome"], log["key"]) == ("executed", str(n))
        st, h, b2, log = call(p, "POST", "/echo", body=body, host="strict.test")
        assert hone(h, REPLAY) == "true" and b2 == b1 and log["key"] == str(n)
        if p.store == "redis":
            assert len(redis_keys(rdb, str(n))) == 1
    assert upstream.hits("/echo") == 4


def test_json_nested_pointer(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    cid = "ch_" + new_key()
    body = b'{"data": {"object": {"id": "%s", "amount": 1}}, "id": "evt_outer"}' % cid.encode()
    st, h, b1, log = call(p, "POST", "/echo", body=body, host="nested.test")
    assert hone(h, REPLAY) == "false" and (log["route"], log["key"]) == ("nested", cid)
    st, h, b2, _ = call(p, "POST", "/echo", body=body, host="nested.test")
    assert hone(h, REPLAY) == "true" and b2 == b1
    # only the pointer counts: /id alone is no key there
    for other in (b'{"id": "%s"}' % cid.encode(), b'{"data": {"object": {}}}',
                  b'{"data": {"object": "%s"}}' % cid.encode()):
        st, h, _, log = call(p, "POST", "/echo", body=other, host="nested.test")
        assert hone(h, REPLAY) is None and log["outcome"] == "passthrough", other
    assert upstream.hits("/echo") == 4


@pytest.mark.parametrize("host,body,key", [
    pytest.param("whole.test", b'"evt_whole"', "evt_whole", id="whole-body-string"),
    pytest.param("whole.test", b" 1234 ", "1234", id="whole-body-integer"),
    pytest.param("escaped.test", b'{"a/b": {"c~d": "evt_esc"}, "a": {"b": "no"}}', "evt_esc",
                 id="tilde-escapes"),
    pytest.param("array.test", b'{"items": [{"id": "no"}, {"id": "evt_1st"}]}', "evt_1st",
                 id="array-index"),
    # RFC 6901: on an object, "1" is a member name
    pytest.param("array.test", b'{"items": {"1": {"id": "evt_m1"}}}', "evt_m1",
                 id="object-member-1"),
])
def test_json_pointer_forms(proxy, upstream, tmp_path, host, body, key):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    st, h, b1, log = call(p, "POST", "/echo", body=body, host=host)
    assert st == 201 and hone(h, REPLAY) == "false" and log["key"] == key
    st, h, b2, _ = call(p, "POST", "/echo", body=body, host=host)
    assert hone(h, REPLAY) == "true" and b2 == b1


@pytest.mark.parametrize("host,body,code", [
    pytest.param("whole.test", b'{"id": "evt_1"}', "idempotency_key_invalid",
                 id="whole-body-object"),
    pytest.param("escaped.test", b'{"a": {"b": {"c~d": "evt_1"}}}', "idempotency_key_missing",
                 id="tilde-one-is-no-slash"),
    pytest.param("array.test", b'{"items": [{"id": "evt_0"}]}', "idempotency_key_missing",
                 id="index-past-the-end"),
    pytest.param("array.test", b'{"items": [{"id": "a"}, {"ID": "b"}]}',
                 "idempotency_key_missing", id="member-absent"),
])
def test_json_pointer_forms_finding_no_key(proxy, upstream, tmp_path, host, body, code):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    st, h, b, log = call(p, "POST", "/echo", body=body, host=host)
    obj = assert_problem((st, h, b), 400, code, "2.1")
    if code == "idempotency_key_missing":
        assert "JSON" in obj["detail"], obj
    assert upstream.hits() == 0


def test_json_body_limit_comes_before_the_key(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    pad = "p" * 80
    for body in (json.dumps({"id": "evt_ok", "pad": pad}).encode(),   # a good key
                 json.dumps({"id": 1.5, "pad": pad}).encode(),         # an invalid one
                 b"not json " + pad.encode()):                        # none at all
        assert len(body) > 64
        st, h, b, log = call(p, "POST", "/echo", body=body, host="tiny.test")
        assert_problem((st, h, b), 413, "payload_too_large")
        assert (log["route"], log["outcome"]) == ("tiny-hooks", "too_large")
    # chunked, with no Content-Length to refuse early: still 413
    body = json.dumps({"id": "evt_chunked", "pad": pad}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:40], body[40:])) + b"0\r\n\r\n"
    st, h, b, log = call(p, "POST", "/echo", [("Transfer-Encoding", "chunked")], chunked,
                         host="tiny.test")
    assert_problem((st, h, b), 413, "payload_too_large")
    assert upstream.hits() == 0
    # within the limit it is keyed
    st, h, _, log = call(p, "POST", "/echo", body=b'{"id":"evt_small"}', host="tiny.test")
    assert hone(h, REPLAY) == "false" and log["key"] == "evt_small"


# Bodies jansson parses in its own way; what is forwarded is the client's bytes
# in every case. keyed: the key found (None: jansson refuses the text, so the
# key is missing: keysource.h documents duplicates, \u0000 and integers past
# json_int_t as such).
ODD_BODIES = [
    pytest.param(b'{"id":"evt_dup","id":"evt_other"}', None, id="duplicate-members"),
    pytest.param(b'{"id":"evt_esc","note":"\\u00e9\\ud83d\\ude00\\/\\"\\\\\\b\\f"}', "evt_esc",
                 id="odd-escapes"),
    pytest.param(b'{"\\u0069d":"evt_escname"}', "evt_escname", id="escaped-member-name"),
    pytest.param(b'{"id":"evt_nul","note":"a\\u0000b"}', None, id="nul-escape"),
    pytest.param(b'{"id":"evt_big","n":123456789012345678901234567890}', None,
                 id="huge-integer"),
    pytest.param(b'{"id":"evt_real","r":1e400}', None, id="huge-real"),
    pytest.param(b'{"id":"evt_tiny","r":-1e-400,"s":0.1000000000000000000000000001}', "evt_tiny",
                 id="tiny-and-long-reals"),
    pytest.param(b' \r\n\t{ "amount" : 1.50 ,\n "id"\t:  "evt_ws" }\n ', "evt_ws",
                 id="whitespace"),
    pytest.param(b'{"id":"evt_utf8","name":"caf\xc3\xa9 \xe2\x82\xac"}', "evt_utf8",
                 id="utf8"),
    pytest.param(b'{"id":"evt_bad_utf8","name":"\xff\xfe"}', None, id="invalid-utf8"),
]


@pytest.mark.parametrize("body,key", ODD_BODIES)
def test_json_forwarded_body_is_the_clients_bytes(proxy, upstream, tmp_path, body, key):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    sent_key = '"client-sent-key"'
    st, h, b, log = call(p, "POST", "/echo", [("Idempotency-Key", sent_key),
                                               ("Content-Type", "application/json")], body,
                         host="hooks.test")
    assert st == 201, (st, b[:300])
    method, target, headers, got = upstream.requests[-1]
    assert got == body, "the forwarded body differs from the client's"
    assert json.loads(b)["body"].encode("latin-1") == body
    # the key header is forwarded as sent (it is not this route's key source)
    assert [v for k, v in headers if k.lower() == "idempotency-key"] == [sent_key]
    if key is None:
        assert hone(h, REPLAY) is None and log["outcome"] == "passthrough"
        st, h, b, _ = call(p, "POST", "/echo", body=body, host="strict.test")
        assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    else:
        assert hone(h, REPLAY) == "false" and log["key"] == key
        st, h, b2, _ = call(p, "POST", "/echo", [("Idempotency-Key", sent_key)], body,
                            host="hooks.test")
        assert hone(h, REPLAY) == "true" and b2 == b
    assert upstream.hits("/echo") == 1


def test_composite_key_delivered_twice_executes_once(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    src, cid = "/sensors/" + new_key(), "id-" + new_key()
    st, h, b1, log = call(p, "POST", "/echo", [("ce-source", src), ("ce-id", cid),
                                                ("ce-type", "reading")], b"event", host="ce.test")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert (log["route"], log["key"]) == ("cloudevents", src + " " + cid)
    # the same pair, headers in another order and name case: replayed
    st, h, b2, log = call(p, "POST", "/echo", [("CE-ID", cid), ("X-Extra", "1"),
                                                ("Ce-Source", src)], b"event", host="ce.test")
    assert hone(h, REPLAY) == "true" and b2 == b1 and log["outcome"] == "replayed"
    assert upstream.hits("/echo") == 1
    # the same pair with another body: mismatch
    st, h, b, _ = call(p, "POST", "/echo", [("ce-source", src), ("ce-id", cid)], b"other",
                       host="ce.test")
    assert_problem((st, h, b), 422, "idempotency_key_mismatch", "2.2")
    # another id, or the two values swapped: another key
    for hs in ([("ce-source", src), ("ce-id", cid + "2")], [("ce-source", cid), ("ce-id", src)]):
        st, h, _, _ = call(p, "POST", "/echo", hs, b"event", host="ce.test")
        assert hone(h, REPLAY) == "false", hs
    assert upstream.hits("/echo") == 3
    # the headers are forwarded as sent
    fwd = {k.lower(): v for k, v in upstream.requests[-1][2]}
    assert (fwd["ce-source"], fwd["ce-id"]) == (cid, src)


@pytest.mark.parametrize("headers", [
    pytest.param([("ce-id", "id1")], id="no-source"),
    pytest.param([("ce-source", "src")], id="no-id"),
    pytest.param([], id="neither"),
    pytest.param([("ce-source", "src"), ("ce-id", "id1"), ("ce-id", "id1")], id="repeated-id"),
    pytest.param([("ce-source", "src"), ("ce-source", "src2"), ("ce-id", "id1")],
                 id="repeated-source"),
])
def test_composite_key_missing_or_repeated_header(proxy, upstream, tmp_path, headers):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    for _ in range(2):
        st, h, _, log = call(p, "POST", "/echo", headers, b"event", host="ce.test")
        assert st == 201 and hone(h, REPLAY) is None
        assert (log["route"], log["outcome"]) == ("cloudevents", "passthrough")
    assert upstream.hits("/echo") == 2
    st, h, b, log = call(p, "POST", "/echo", headers, b"event", host="cestrict.test")
    obj = assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert "ce-source" in obj["detail"] and "ce-id" in obj["detail"], obj
    assert log["outcome"] == "missing_key"
    assert upstream.hits("/echo") == 2


@pytest.mark.parametrize("sent", [
    pytest.param([("X-Request-Id", "r1"), ("X-Request-Id", "r1")], id="repeated"),
    pytest.param([("X-Request-Id", "r 1")], id="malformed"),
])
def test_invalid_key_detail_names_the_routes_key_header(proxy, upstream, tmp_path, sent):
    """The key header of a route (or of --key-header) is the one an invalid_key
    answer names, not Idempotency-Key."""
    p = routed(proxy, tmp_path, KEY_ROUTES, "--key-header", "X-Tenant-Key")
    for host, headers in (("fp.test", sent),
                          ("other.test", [("X-Tenant-Key", v) for _, v in sent])):
        st, h, b, log = call(p, "POST", "/echo", headers, b"x", host=host)
        obj = assert_problem((st, h, b), 400, "idempotency_key_invalid", "2.1")
        name = "X-Request-Id" if host == "fp.test" else "X-Tenant-Key"
        assert name in obj["detail"] and "Idempotency-Key" not in obj["detail"], obj
        assert log["outcome"] == "invalid_key"
    assert upstream.hits("/echo") == 0


@pytest.mark.parametrize("value", [
    pytest.param("id 1", id="space"),
    pytest.param("", id="empty"),
    pytest.param("id\t1", id="tab"),
    pytest.param("k" * 256, id="256-bytes"),
])
def test_composite_key_invalid_value(proxy, upstream, tmp_path, value):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    for host in ("ce.test", "cestrict.test"):
        for hs in ([("ce-source", "src"), ("ce-id", value)],
                   [("ce-source", value), ("ce-id", "id1")]):
            st, h, b, log = call(p, "POST", "/echo", hs, b"event", host=host)
            assert_problem((st, h, b), 400, "idempotency_key_invalid", "2.1")
            assert log["outcome"] == "invalid_key"
    # obs-text is refused the same way
    st, h, b, _ = call_raw(p, b"POST /echo HTTP/1.1\r\nHost: ce.test\r\nce-source: src\r\n"
                              b"ce-id: caf\xc3\xa9\r\nContent-Length: 1\r\nConnection: close"
                              b"\r\n\r\nx")
    assert_problem((st, h, b), 400, "idempotency_key_invalid", "2.1")
    assert upstream.hits() == 0


def test_fingerprint_fallback(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    body = b"order=" + new_key().encode()
    # route keyless has require-key: true, which never applies with a fallback
    st, h, b1, log = call(p, "POST", "/echo", body=body, host="fp.test")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert log["route"] == "keyless" and log["outcome"] == "executed"
    fp = log["key"]
    assert re.fullmatch(r"[0-9a-f]{64}", fp), fp
    st, h, b2, log = call(p, "POST", "/echo", body=body, host="fp.test")
    assert hone(h, REPLAY) == "true" and b2 == b1 and log["key"] == fp
    assert upstream.hits("/echo") == 1
    # another body, another target, another method: other requests
    for method, path, other in (("POST", "/echo", body + b"!"), ("POST", "/echo?x", body),
                                ("PUT", "/echo", body)):
        st, h, _, log = call(p, method, path, body=other, host="fp.test")
        assert hone(h, REPLAY) == "false" and log["key"] != fp
    assert upstream.hits("/echo") == 4
    # with its key header the key is used, not the fingerprint
    key = new_key()
    st, h, _, log = call(p, "POST", "/echo", [("X-Request-Id", key)], body, host="fp.test")
    assert hone(h, REPLAY) == "false" and log["key"] == key
    st, h, b, _ = call(p, "POST", "/echo", [("X-Request-Id", key)], body + b"?", host="fp.test")
    assert_problem((st, h, b), 422, "idempotency_key_mismatch", "2.2")
    st, h, _, _ = call(p, "POST", "/echo", [("X-Request-Id", new_key())], body, host="fp.test")
    assert hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 6
    # another route's key header is no key here: the fingerprint still is
    st, h, b3, log = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], body,
                          host="fp.test")
    assert hone(h, REPLAY) == "true" and b3 == b1 and log["key"] == fp
    # an invalid key header is invalid, not replaced by the fingerprint
    st, h, b, _ = call(p, "POST", "/echo", [("X-Request-Id", '"a b"')], body, host="fp.test")
    assert_problem((st, h, b), 400, "idempotency_key_invalid", "2.1")


def test_json_key_with_fingerprint_fallback(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    body = b'{"no_id": "%s"}' % new_key().encode()
    st, h, b1, log = call(p, "POST", "/echo", body=body, host="jfp.test")
    assert hone(h, REPLAY) == "false" and re.fullmatch(r"[0-9a-f]{64}", log["key"])
    st, h, b2, _ = call(p, "POST", "/echo", body=body, host="jfp.test")
    assert hone(h, REPLAY) == "true" and b2 == b1
    st, h, _, log = call(p, "POST", "/echo", body=b"not json", host="jfp.test")
    assert hone(h, REPLAY) == "false" and re.fullmatch(r"[0-9a-f]{64}", log["key"])
    evt = "evt_" + new_key()
    st, h, _, log = call(p, "POST", "/echo", body=b'{"id": "%s"}' % evt.encode(),
                         host="jfp.test")
    assert hone(h, REPLAY) == "false" and log["key"] == evt
    assert upstream.hits("/echo") == 3


# =========================================================================== 2. no collisions
COLLIDE_ROUTES = """
    routes:
      - name: by-header
        match: {host: header.test}
      - name: by-json
        match: {host: json.test}
        key: {json: /id}
      - name: by-one-header
        match: {host: one.test}
        key: {headers: [X-Event-Id]}
      - name: by-fingerprint
        match: {host: fp.test}
        key: {header: X-Never-Sent, fallback: fingerprint}
      - name: header-or-fingerprint
        match: {host: mixed.test}
        key: {fallback: fingerprint}
"""


def admin_keys(p, key):
    st, h, body = p.admin_request("GET", "/keys/" + urllib.parse.quote(key, safe=""))
    assert st == 200, (st, body)
    out = json.loads(body)
    assert out["key"] == key
    return out["records"]


def test_keys_never_collide_across_sources(proxy, upstream, rdb, tmp_path):
    """Requests identical in method, target and body whose key text is the same
    but comes from different sources: had they one store key, the later would
    be replayed (or, for another body, get 422). Each executes, and each is
    then replayed its own answer."""
    p = routed(proxy, tmp_path, COLLIDE_ROUTES)
    first = {}  # (host, headers, body) -> first answer's body

    def execute(host, headers, body, route):
        st, h, b, log = call(p, "POST", "/echo", headers, body, host=host)
        assert st == 201 and hone(h, REPLAY) == "false", (host, st, b[:300])
        assert log["route"] == route and log["outcome"] == "executed", log
        first[(host, tuple(headers), body)] = b
        return log

    # one text, K: a client key, a JSON id, a one-header composite
    k = "evt_" + new_key()
    body_k = json.dumps({"id": k}).encode()
    execute("json.test", [], body_k, "by-json")
    execute("header.test", [("Idempotency-Key", k)], body_k, "by-header")
    execute("one.test", [("X-Event-Id", k)], body_k, "by-one-header")
    # another text, F: a fingerprint, then F sent as a client key, a composite, a JSON id
    body_f = b"pay=" + new_key().encode()
    f = execute("fp.test", [], body_f, "by-fingerprint")["key"]
    assert re.fullmatch(r"[0-9a-f]{64}", f), f
    execute("header.test", [("Idempotency-Key", f)], body_f, "by-header")
    execute("one.test", [("X-Event-Id", f)], body_f, "by-one-header")
    execute("json.test", [], json.dumps({"id": f}).encode(), "by-json")  # 422 if shared
    # on one route: a keyless request's fingerprint, then that hex as its key
    body_m = b"mixed=" + new_key().encode()
    fm = execute("mixed.test", [], body_m, "header-or-fingerprint")["key"]
    execute("mixed.test", [("Idempotency-Key", fm)], body_m, "header-or-fingerprint")
    assert upstream.hits("/echo") == 9
    # each is replayed its own answer
    for (host, headers, body), b in first.items():
        st, h, b2, log = call(p, "POST", "/echo", list(headers), body, host=host)
        assert hone(h, REPLAY) == "true" and b2 == b, (host, headers, body)
    assert upstream.hits("/echo") == 9
    # one store key each: /keys lists them apart (different scopes), on both stores
    for text, n in ((k, 3), (f, 4), (fm, 2)):
        recs = admin_keys(p, text)
        assert len(recs) == n and len({r["store_key"] for r in recs}) == n, recs
        assert len({r["scope"] for r in recs}) == n
        if p.store == "redis":
            assert len(redis_keys(rdb, text)) == n


# =========================================================================== 3. /keys and the log
def test_keys_finds_composite_and_fingerprint_keys(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    src = "src-" + new_key()
    st, h, b, log = call(p, "POST", "/echo", [("ce-source", src), ("ce-id", "id1")], b"event",
                         host="ce.test")
    assert st == 201 and log["key"] == src + " id1"
    # the parts joined with one space, percent-encoded in the path
    st, _, raw = p.admin_request("GET", "/keys/%s%%20id1" % src)
    assert st == 200, raw
    out = json.loads(raw)
    assert out["key"] == src + " id1"
    [rec] = out["records"]
    assert rec["state"] == "completed" and rec["status"] == 201
    assert rec["store_key"] == "idem:%s:%s id1" % (rec["scope"], src)
    # one part alone, or two spaces, is not that key
    assert admin_keys(p, src) == [] and admin_keys(p, "id1") == []
    st, _, _ = p.admin_request("GET", "/keys/%s%%20%%20id1" % src)
    assert st == 400
    # a fingerprint key by its hex; the record's fingerprint is that same hex
    body = b"keyless " + new_key().encode()
    st, h, b, log = call(p, "POST", "/echo", body=body, host="fp.test")
    fp = log["key"]
    [rec] = admin_keys(p, fp)
    assert rec["state"] == "completed" and rec["fingerprint"] == fp
    assert rec["store_key"] == "idem:%s:%s" % (rec["scope"], fp)
    # a JSON id by its text
    evt = "evt_" + new_key()
    call(p, "POST", "/echo", body=b'{"id":"%s"}' % evt.encode(), host="hooks.test")
    [rec] = admin_keys(p, evt)
    assert rec["state"] == "completed"


def test_access_log_shows_route_and_derived_key_json(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, KEY_ROUTES)
    evt = "evt_" + new_key()
    _, _, _, a = call(p, "POST", "/echo", body=b'{"id":"%s"}' % evt.encode(), host="hooks.test")
    _, _, _, b = call(p, "POST", "/echo", [("ce-source", "s1"), ("ce-id", "i1")], b"e",
                      host="ce.test")
    _, _, _, c = call(p, "POST", "/echo", body=b"keyless", host="fp.test")
    _, _, _, d = call(p, "POST", "/echo", [("Idempotency-Key", "k1")], b"x", host="t.test")
    _, _, _, e = call(p, "POST", "/echo", [("X-Request-Id", "rid-1")], b"x", host="fp.test")
    assert (a["route"], a["key"]) == ("webhooks", evt)
    assert (b["route"], b["key"]) == ("cloudevents", "s1 i1")
    assert c["route"] == "keyless" and re.fullmatch(r"[0-9a-f]{64}", c["key"])
    assert (d["route"], d["key"]) == ("default", "k1")
    assert (e["route"], e["key"]) == ("keyless", "rid-1")


def test_access_log_shows_route_and_derived_key_text(proxy, upstream, tmp_path):
    p = proxy("--config", str(write_config(tmp_path, KEY_ROUTES)))
    evt = "evt_" + new_key()
    p.request("POST", "/echo", [("Host", "hooks.test")], b'{"id":"%s"}' % evt.encode())
    p.request("POST", "/echo", [("Host", "fp.test")], b"keyless")
    p.request("POST", "/echo", [("Host", "nested.test")], b"{}")

    def lines():
        with open(p.stderr_path, "rb") as f:
            return [ln for ln in f.read().decode().splitlines() if " info access " in ln]

    got = wait_for(lambda: (lambda ls: ls if len(ls) == 3 else None)(lines()),
                   what="three access lines")
    assert re.search(r" 201 executed route=webhooks key=%s upstream_ms=" % re.escape(evt),
                     got[0]), got[0]
    assert re.search(r" 201 executed route=keyless key=[0-9a-f]{64} upstream_ms=", got[1]), got[1]
    assert re.search(r" 201 passthrough route=nested upstream_ms=", got[2]), got[2]


@store_independent
def test_access_log_text_keeps_a_composite_keys_fields_apart(proxy, upstream, tmp_path):
    """A composite key holds a space (its parts joined); in a text access line
    the client's header values must still not make fields of their own
    (log.c: "its fields stay apart whatever bytes a client sent")."""
    p = proxy("--config", str(write_config(tmp_path, KEY_ROUTES)))
    st, _, _ = p.request("POST", "/echo", [("Host", "ce.test"), ("ce-source", "src"),
                                           ("ce-id", "route=forged")], b"e")
    assert st == 201

    def line():
        with open(p.stderr_path, "rb") as f:
            got = [ln for ln in f.read().decode().splitlines() if " info access " in ln]
        return got[-1] if got else None

    ln = wait_for(line, what="the access line")
    fields = ln.split(" ")
    assert [f for f in fields if f.startswith("route=")] == ["route=cloudevents"], ln
    assert len([f for f in fields if f.startswith("key=")]) == 1, ln
