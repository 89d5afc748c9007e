"""Error dialects (doc/configuration.md, Error dialects): a route's
`errors: stripe` answers the proxy's own errors as Stripe's SDKs expect
them, the top-level setting applies to the default route, and the other
routes keep RFC 9457 problems.

The route files here set neither upstream nor redis: the proxy fixture passes
--upstream and --redis, which beat the file anyway (one test checks exactly
that). Requests are told apart by route through the JSON access line each of
them writes (its "route" field), read from the proxy's stderr file
(fixtures/routes.py).
"""
import json

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import store_independent
from fixtures.probes import start_request
from fixtures.routes import call, call_raw, routed
from fixtures.waiting import free_port


# --------------------------------------------------------------------------- helpers
def assert_stripe_error(resp, status, code, etype):
    """resp = (status, headers, body): the stripe dialect (doc/configuration.md,
    Error dialects)."""
    st, h, body = resp[:3]
    assert st == status, (st, body[:300])
    ct = hone(h, "Content-Type")
    assert ct is not None and ct.split(";")[0].strip() == "application/json", ct
    obj = json.loads(body)
    assert list(obj) == ["error"], obj
    err = obj["error"]
    assert set(err) == {"type", "code", "message"}, obj
    assert err["type"] == etype and err["code"] == code, obj
    assert isinstance(err["message"], str) and err["message"], obj
    assert hone(h, REPLAY) is None, "a problem must not carry %s" % REPLAY
    return obj


# =========================================================================== 6. the stripe dialect
DIALECT_ROUTES = """
    routes:
      - name: sdk
        match: {host: sdk.test}
        errors: stripe
        require-key: true
        max-body: 100
      - name: plain
        match: {host: plain.test}
        require-key: true
        max-body: 100
"""

KEY_PROBLEMS = {"idempotency_key_missing", "idempotency_key_invalid",
                "idempotency_key_mismatch", "idempotency_key_in_use"}


def check_dialect(resp, host, status, code, section=None):
    if host == "sdk.test":
        etype = "idempotency_error" if code in KEY_PROBLEMS else "api_error"
        assert_stripe_error(resp, status, code, etype)
    else:
        assert_problem(resp[:3], status, code, section)
    return resp[0], hone(resp[1], "Retry-After")


def test_stripe_dialect_on_a_route(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, DIALECT_ROUTES)
    seen = {}
    for host in ("sdk.test", "plain.test"):
        out = []
        out.append(check_dialect(call(p, "POST", "/echo", body=b"x", host=host), host, 400,
                                 "idempotency_key_missing", "2.1"))
        out.append(check_dialect(call(p, "POST", "/echo", [("Idempotency-Key", '"a b"')], b"x",
                                      host=host), host, 400, "idempotency_key_invalid", "2.1"))
        key = new_key()
        st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host=host)
        assert st == 201
        out.append(check_dialect(call(p, "POST", "/echo", [("Idempotency-Key", key)], b"y",
                                      host=host), host, 422, "idempotency_key_mismatch", "2.2"))
        out.append(check_dialect(call(p, "POST", "/echo", [("Idempotency-Key", new_key())],
                                      b"z" * 101, host=host), host, 413, "payload_too_large"))
        key = new_key()
        req = ("POST", "/hold?id=" + key, [("Idempotency-Key", key), ("Host", host)], b"held")
        first = start_request(p, req, key)
        out.append(check_dialect(call(p, *req[:2], req[2][:1], req[3], host=host), host, 409,
                                 "idempotency_key_in_use", "2.6"))
        upstream.release(key)
        assert first()[0] == 200
        out.append(check_dialect(call(p, "POST", "/reset", [("Idempotency-Key", new_key())],
                                      b"x", host=host), host, 502, "upstream_unavailable"))
        seen[host] = out
    # the same statuses and Retry-After in both dialects
    assert seen["sdk.test"] == seen["plain.test"]
    assert [s for s, _ in seen["sdk.test"]] == [400, 400, 422, 413, 409, 502]
    assert dict(seen["sdk.test"])[409] == "1"
    # a request malformed at the HTTP level is answered in its route's dialect too
    for host in ("sdk.test", "plain.test"):
        st, h, b, log = call_raw(p, b"POST /echo HTTP/1.1\r\nHost: " + host.encode() +
                                 b"\r\nX-Odd: a\x01b\r\nContent-Length: 1\r\n\r\nx")
        check_dialect((st, h, b), host, 400, "bad_request")
        assert hone(h, "Connection") == "close" and log["outcome"] == "bad_request"
        assert log["route"] == host.split(".")[0]
    # answers that are not errors are the upstream's, whatever the dialect
    st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x",
                       host="sdk.test")
    assert st == 201 and hone(h, "Content-Type") == "application/json"


@store_independent
def test_stripe_dialect_store_unavailable(proxy, upstream, tmp_path):
    """Redis unreachable: the 503 of each dialect (the proxy starts anyway)."""
    dead = "redis://127.0.0.1:%d" % free_port()
    p = routed(proxy, tmp_path, DIALECT_ROUTES, "--store-timeout", "0.5", redis_url=dead)
    r1 = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x", host="sdk.test")
    assert_stripe_error(r1, 503, "store_unavailable", "api_error")
    r2 = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x", host="plain.test")
    assert_problem(r2[:3], 503, "store_unavailable")
    assert hone(r1[1], "Retry-After") == hone(r2[1], "Retry-After") == "1"
    assert r1[3]["outcome"] == r2[3]["outcome"] == "store_error"
    assert upstream.hits() == 0


def test_top_level_errors_stripe_applies_to_the_default_route(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, """
        errors: stripe
        require-key: true
        routes:
          - name: inherits
            match: {path: /inherit/*}
          - name: problems
            match: {path: /problem/*}
            errors: problem
    """)
    st, h, b, log = call(p, "POST", "/echo", body=b"x", host="t.test")
    assert_stripe_error((st, h, b), 400, "idempotency_key_missing", "idempotency_error")
    assert log["route"] == "default"
    st, h, b, log = call(p, "POST", "/inherit/x", body=b"x", host="t.test")
    assert_stripe_error((st, h, b), 400, "idempotency_key_missing", "idempotency_error")
    assert log["route"] == "inherits"
    st, h, b, log = call(p, "POST", "/problem/x", body=b"x", host="t.test")
    assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert log["route"] == "problems"
    assert upstream.hits() == 0
