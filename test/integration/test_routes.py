"""Routes (doc/configuration.md, Configuration file: The file): how a
request finds its route (methods, the raw path, exact or prefix, the host and
its port, the absolute form), the settings a route gives it, and the route
label of the metrics. Key sources are in test_key_sources.py, the error
dialects in test_dialects.py, the file on the command line in
test_config_file.py.

The route files here set neither upstream nor redis: the proxy fixture passes
--upstream and --redis, which beat the file anyway (one test checks exactly
that). Requests are told apart by route through the JSON access line each of
them writes (its "route" field), read from the proxy's stderr file
(fixtures/routes.py).
"""
import json

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.marks import redis_only
from fixtures.probes import redis_keys, start_request
from fixtures.proxy import run_binary
from fixtures.routes import call, call_raw, check_lines, routed, write_config
from fixtures.waiting import in_thread, wait_for


# --------------------------------------------------------------------------- helpers
def route_of(p, method, path, host="t.test", headers=()):
    """The route a request (keyless, tiny body for methods that take one) ran under."""
    body = b"x" if method in ("POST", "PUT", "PATCH") else None
    return call(p, method, path, headers, body, host=host)[3]["route"]


# =========================================================================== 1. matching
MATCH_ROUTES = """
    routes:
      - name: first
        match: {methods: [POST], path: /m/first}
        require-key: true
      - name: shadowed
        match: {path: /m/first}
        enforce: false
      - name: special
        match: {path: /m/pre/special}
      - name: prefix
        match: {path: /m/pre/*}
      - name: never
        match: {path: /m/pre/late}
      - name: exact
        match: {path: /m/exact}
      - name: raw
        match: {path: /m/a%2Fb}
      - name: raw-space
        match: {path: /m/pay%20ments}
      - name: puts
        match: {methods: [put, PATCH], path: /m/methods}
      - name: host
        match: {host: API.Example.com, path: /m/host}
      - name: hostport
        match: {host: "api.example.com:8443", path: /m/hostport}
"""


def test_route_first_match_wins(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    # POST /m/first matches "first" (require-key) before "shadowed" (enforce: false)
    st, h, b, log = call(p, "POST", "/m/first", body=b"x", host="t.test")
    assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert (log["route"], log["outcome"]) == ("first", "missing_key")
    assert upstream.hits() == 0
    key = new_key()
    st, h, b, log = call(p, "POST", "/m/first", [("Idempotency-Key", key)], b"x", host="t.test")
    assert st == 200 and hone(h, REPLAY) == "false"
    assert (log["route"], log["outcome"], log["key"]) == ("first", "executed", key)
    # a method "first" does not take falls to the next route that matches
    st, h, b, log = call(p, "PUT", "/m/first", [("Idempotency-Key", key)], b"x", host="t.test")
    assert st == 200 and hone(h, REPLAY) is None
    assert (log["route"], log["outcome"]) == ("shadowed", "passthrough")
    # an exact route listed before a prefix wins; one listed after it never matches
    assert route_of(p, "GET", "/m/pre/special") == "special"
    assert route_of(p, "GET", "/m/pre/late") == "prefix"
    assert upstream.hits() == 4


def test_route_methods(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    # match.methods are upper-cased from the file ("put")
    assert route_of(p, "PUT", "/m/methods") == "puts"
    assert route_of(p, "PATCH", "/m/methods") == "puts"
    assert route_of(p, "POST", "/m/methods") == "default"
    assert route_of(p, "GET", "/m/methods") == "default"
    assert route_of(p, "DELETE", "/m/methods") == "default"


@pytest.mark.parametrize("path,route", [
    ("/m/exact", "exact"),
    ("/m/exact?x=1", "exact"),          # the query is no part of the path
    ("/m/exact?", "exact"),
    ("/m/exact/", "default"),
    ("/m/exactly", "default"),
    ("/m/Exact", "default"),            # byte for byte: case matters in a path
    ("/m/exac", "default"),
    ("/m/pre", "prefix"),               # /m/pre/* is the prefix itself...
    ("/m/pre/", "prefix"),              # ...and everything below
    ("/m/pre/a/b/c?q=1", "prefix"),
    ("/m/pre?next=/m/pre/x", "prefix"),
    ("/m/prex", "default"),             # not /m/prex
    ("/m/pr", "default"),
    ("/m/pre%2Fx", "default"),          # not decoded: %2F is no slash
    ("//m/pre", "default"),
    ("/elsewhere", "default"),
])
def test_route_exact_path_and_prefix(proxy, upstream, tmp_path, path, route):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    assert route_of(p, "GET", path) == route
    # ...and the target is forwarded as sent, whatever the route (Python's
    # http.server folds a leading "//" itself: that one is not checked)
    if not path.startswith("//"):
        assert upstream.requests[-1][1] == path


def test_route_path_is_raw_bytes_not_decoded(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    assert route_of(p, "GET", "/m/a%2Fb") == "raw"
    assert route_of(p, "GET", "/m/a%2Fb?c=%2F") == "raw"
    assert route_of(p, "GET", "/m/a/b") == "default"      # what %2F decodes to
    assert route_of(p, "GET", "/m/a%2fb") == "default"    # the same byte, other hex case
    assert route_of(p, "GET", "/m/a%252Fb") == "default"  # encoded twice
    assert route_of(p, "GET", "/m/%61%2Fb") == "default"  # "a" encoded
    assert route_of(p, "GET", "/m/exact%3Fx") == "default"  # an encoded ? is no query
    assert route_of(p, "GET", "/m/pay%20ments") == "raw-space"
    assert route_of(p, "GET", "/m/pay+ments") == "default"
    assert route_of(p, "GET", "/m/pay%2520ments") == "default"
    assert route_of(p, "GET", "/m/pay%20Ments") == "default"
    # a decoded space cannot even be a route's path (nor sent in a request line)
    bad = write_config(tmp_path, 'routes:\n  - name: a\n    match: {path: "/m/pay ments"}\n')
    r = run_binary(["--check-config", "--config", str(bad), "--upstream", "http://127.0.0.1:1"])
    assert r.returncode == 2
    [(line, _, msg)] = check_lines(r.stderr, bad)
    assert line == 3 and "match.path" in msg, msg


def test_route_host_case_and_port(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    # a pattern without a port: any case, with or without a port
    for host in ("api.example.com", "API.EXAMPLE.COM", "Api.Example.Com:8080",
                 "api.example.com:443"):
        assert route_of(p, "GET", "/m/host", host=host) == "host", host
    for host in ("api.example.com.evil.test", "xapi.example.com", "api.example.co",
                 "api.example.com:80:80x", "other.test"):
        assert route_of(p, "GET", "/m/host", host=host) == "default", host
    # the right host on another path is not that route
    assert route_of(p, "GET", "/m/hostx", host="api.example.com") == "default"
    # a pattern with a port wants that port, in any case
    assert route_of(p, "GET", "/m/hostport", host="api.example.com:8443") == "hostport"
    assert route_of(p, "GET", "/m/hostport", host="API.example.COM:8443") == "hostport"
    for host in ("api.example.com", "api.example.com:443", "api.example.com:84430"):
        assert route_of(p, "GET", "/m/hostport", host=host) == "default", host
    # no Host at all (HTTP/1.0): no host route
    st, _, _, log = call_raw(p, b"GET /m/host HTTP/1.0\r\n\r\n")
    assert st == 200 and log["route"] == "default"


def test_route_absolute_form_routes_on_its_path_and_authority(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)

    def absolute(target, host):
        return (b"POST " + target + b" HTTP/1.1\r\nHost: " + host +
                b"\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx")

    # the authority names the host, whatever the Host header says
    st, _, _, log = call_raw(p, absolute(b"http://API.example.com:9000/m/host?x=1",
                                         b"elsewhere.test"))
    assert st == 200 and log["route"] == "host"
    assert upstream.requests[-1][1] == "/m/host?x=1"
    st, _, _, log = call_raw(p, absolute(b"http://elsewhere.test/m/host", b"api.example.com"))
    assert st == 200 and log["route"] == "default"
    # its path (not the whole target) is what routes; require-key applies there
    st, h, b, log = call_raw(p, absolute(b"http://t.test/m/first", b"t.test"))
    assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert log["route"] == "first"
    st, _, _, log = call_raw(p, absolute(b"https://t.test/m/pre/a?b", b"t.test"))
    assert st == 200 and log["route"] == "prefix"
    assert upstream.requests[-1][1] == "/m/pre/a?b"


def test_request_matching_no_route_is_default(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, MATCH_ROUTES)
    key = new_key()
    st, h, b1, log = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="t.test")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert (log["route"], log["outcome"], log["key"]) == ("default", "executed", key)
    st, h, b2, log = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="t.test")
    assert hone(h, REPLAY) == "true" and b2 == b1
    assert (log["route"], log["outcome"]) == ("default", "replayed")
    # the default route has the top-level settings: no key required
    st, h, _, log = call(p, "POST", "/echo", body=b"x", host="t.test")
    assert st == 201 and hone(h, REPLAY) is None
    assert (log["route"], log["outcome"]) == ("default", "passthrough")


# =========================================================================== 2. per-route settings
SETTINGS_ROUTES = """
    routes:
      - name: internal
        match: {host: internal.test}
        enforce: false
      - name: payments
        match: {host: pay.test}
        require-key: true
      - name: small
        match: {host: small.test}
        max-body: 100
      - name: nocache
        match: {host: nc.test}
        no-cache-status: [404]
      - name: renamed
        match: {host: rh.test}
        replay-header: X-Replayed-Here
      - name: shared
        match: {host: shared.test}
        scope-header: []
      - name: deletes
        match: {host: del.test}
        methods: [DELETE]
      - name: short
        match: {host: short.test}
        ttl: 120
      - name: capped
        match: {host: capped.test}
        ttl: 100
        max-ttl: 200
"""


def test_route_enforce_false_is_passthrough(proxy, upstream, rdb, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    key = new_key()
    for _ in range(2):
        st, h, _, log = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x",
                             host="internal.test")
        assert st == 201 and hone(h, REPLAY) is None
        assert (log["route"], log["outcome"]) == ("internal", "passthrough")
    assert upstream.hits("/echo") == 2
    if p.store == "redis":
        assert rdb.dbsize() == 0, list(rdb.scan_iter(count=1000))
    # the same key on the default route is enforced (nothing was stored before)
    st, h, _, log = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="t.test")
    assert hone(h, REPLAY) == "false" and log["outcome"] == "executed"
    if p.store == "redis":
        assert len(redis_keys(rdb, key)) == 1


def test_route_require_key_applies_to_its_route_only(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    st, h, b, log = call(p, "POST", "/echo", body=b"x", host="pay.test")
    obj = assert_problem((st, h, b), 400, "idempotency_key_missing", "2.1")
    assert "Idempotency-Key" in obj["detail"]
    assert (log["route"], log["outcome"]) == ("payments", "missing_key")
    assert upstream.hits() == 0
    st, h, _, log = call(p, "POST", "/echo", body=b"x", host="t.test")
    assert st == 201 and hone(h, REPLAY) is None and log["outcome"] == "passthrough"
    st, h, _, log = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x",
                         host="pay.test")
    assert st == 201 and hone(h, REPLAY) == "false" and log["route"] == "payments"
    # not an enforced method: no key needed even there
    st, h, _, _ = call(p, "GET", "/echo", host="pay.test")
    assert st == 201 and hone(h, REPLAY) is None


@redis_only
def test_route_ttl_is_the_routes_on_redis(proxy, upstream, rdb, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    expect = {"short.test": (110000, 120000), "t.test": (86390000, 86400000)}
    for host, (lo, hi) in expect.items():
        key = new_key()
        st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host=host)
        assert hone(h, REPLAY) == "false"
        keys = redis_keys(rdb, key)
        assert len(keys) == 1
        assert lo < rdb.pttl(keys[0]) <= hi, (host, rdb.pttl(keys[0]))
    # the route's max-ttl caps what X-TTL asks for; its ttl is the default
    key = new_key()
    call(p, "POST", "/echo", [("Idempotency-Key", key), ("X-TTL", "1000")], b"x",
         host="capped.test")
    assert 190000 < rdb.pttl(redis_keys(rdb, key)[0]) <= 200000
    key = new_key()
    call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="capped.test")
    assert 90000 < rdb.pttl(redis_keys(rdb, key)[0]) <= 100000
    # on the default route the same X-TTL is taken as it is
    key = new_key()
    call(p, "POST", "/echo", [("Idempotency-Key", key), ("X-TTL", "1000")], b"x", host="t.test")
    assert 990000 < rdb.pttl(redis_keys(rdb, key)[0]) <= 1000000


def test_route_max_body_is_the_routes(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    st, h, b, log = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 101,
                         host="small.test")
    assert_problem((st, h, b), 413, "payload_too_large")
    assert (log["route"], log["outcome"]) == ("small", "too_large")
    assert upstream.hits() == 0
    # max-body is a keyed request's: one passed through is not bound by it
    st, h, b, _ = call(p, "POST", "/echo", body=b"x" * 101, host="small.test")
    assert st == 201 and json.loads(b)["body"] == "x" * 101
    st, h, b, _ = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 100,
                       host="small.test")
    assert st == 201 and json.loads(b)["body"] == "x" * 100
    # the default route keeps the top-level 1 MiB
    st, h, b, log = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 5000,
                         host="t.test")
    assert st == 201 and log["route"] == "default"


def test_route_max_body_and_max_response_above_and_below_the_top_level(proxy, upstream,
                                                                       tmp_path):
    p = routed(proxy, tmp_path, """
        max-body: 1K
        max-response: 1K
        routes:
          - name: roomy
            match: {host: roomy.test}
            max-body: 8K
            max-response: 8K
          - name: tight
            match: {host: tight.test}
            max-response: 100
    """)
    # a body the top level refuses, the route takes
    st, h, b, log = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 5000,
                         host="roomy.test")
    assert st == 201 and json.loads(b)["body"] == "x" * 5000 and log["route"] == "roomy"
    st, h, b, _ = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 5000,
                       host="t.test")
    assert_problem((st, h, b), 413, "payload_too_large")

    def first_then_duplicate(host, n):
        key = new_key()
        path = "/big?bytes=%d" % n
        st, h, b1, _ = call(p, "POST", path, [("Idempotency-Key", key)], b"x", host=host)
        assert st == 200 and len(b1) == n and hone(h, REPLAY) == "false"
        return call(p, "POST", path, [("Idempotency-Key", key)], b"x", host=host), b1

    # an answer above the top level's max-response is kept on the roomy route...
    (st, h, b2, log), b1 = first_then_duplicate("roomy.test", 5000)
    assert st == 200 and hone(h, REPLAY) == "true" and b2 == b1
    # ...not on the default route, nor one above the tight route's own
    for host, n in (("t.test", 5000), ("tight.test", 500)):
        (st, h, b, log), _ = first_then_duplicate(host, n)
        assert_problem((st, h, b), 502, "response_too_large")
        assert log["outcome"] == "replayed"
    assert upstream.hits("/big") == 3


def test_route_wait_is_the_routes(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, """
        routes:
          - name: patient
            match: {host: wait.test}
            wait: 10
    """)
    key = new_key()
    req = ("POST", "/hold?id=" + key, [("Idempotency-Key", key), ("Host", "wait.test")], b"h")
    first = start_request(p, req, key)
    # on the default route the duplicate of a request in flight gets 409 at once
    key2 = new_key()
    req2 = ("POST", "/hold?id=" + key2, [("Idempotency-Key", key2), ("Host", "t.test")], b"h")
    first2 = start_request(p, req2, key2)
    assert_problem(p.request(*req2), 409, "idempotency_key_in_use", "2.6")
    # on the patient route it is held (both in flight), then replayed
    dup = in_thread(p.request, *req)
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_inflight") == 3, timeout=10,
             what="the duplicate to be held")
    upstream.release(key)
    upstream.release(key2)
    st, h, b1 = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    st, h, b2 = dup()
    assert st == 200 and hone(h, REPLAY) == "true" and b2 == b1
    assert first2()[0] == 200
    assert upstream.hits("/hold") == 2


def test_route_no_cache_status_is_the_routes(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)

    def twice(host, status):
        key = new_key()
        out = []
        for _ in range(2):
            st, h, _, _ = call(p, "POST", "/status/%d" % status, [("Idempotency-Key", key)],
                               b"x", host=host)
            assert st == status
            out.append(hone(h, REPLAY))
        return out

    # the route's list replaces the default one: 404 is not stored, 500 is
    assert twice("nc.test", 404) == ["false", "false"]
    assert twice("nc.test", 500) == ["false", "true"]
    # the default route keeps 5xx,408,409,429
    assert twice("t.test", 404) == ["false", "true"]
    assert twice("t.test", 500) == ["false", "false"]
    assert upstream.hits("/status/404") == 3 and upstream.hits("/status/500") == 3


def test_route_replay_header_is_the_routes(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    key = new_key()
    st, h, b1, _ = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="rh.test")
    assert hone(h, "X-Replayed-Here") == "false" and hone(h, REPLAY) is None
    st, h, b2, log = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="rh.test")
    assert hone(h, "X-Replayed-Here") == "true" and hone(h, REPLAY) is None
    assert b2 == b1 and log["outcome"] == "replayed"
    # a problem carries neither
    st, h, b, _ = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"other", host="rh.test")
    assert st == 422 and hone(h, "X-Replayed-Here") is None
    # the default route keeps the default name
    st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", new_key())], b"x", host="t.test")
    assert hone(h, REPLAY) == "false" and hone(h, "X-Replayed-Here") is None


def test_route_empty_scope_header_shares_keys_across_clients(proxy, upstream, rdb, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    key = new_key()
    st, h, b1, _ = call(p, "POST", "/echo", [("Idempotency-Key", key),
                                              ("Authorization", "Bearer alice")], b"x",
                        host="shared.test")
    assert hone(h, REPLAY) == "false"
    st, h, b2, _ = call(p, "POST", "/echo", [("Idempotency-Key", key),
                                              ("Authorization", "Bearer bob")], b"x",
                        host="shared.test")
    assert hone(h, REPLAY) == "true" and b2 == b1
    st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", key)], b"x", host="shared.test")
    assert hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 1
    # the default route scopes by Authorization
    key2 = new_key()
    for who in ("alice", "bob"):
        st, h, _, _ = call(p, "POST", "/echo", [("Idempotency-Key", key2),
                                                 ("Authorization", "Bearer " + who)], b"x",
                           host="t.test")
        assert hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 3
    if p.store == "redis":
        assert len(redis_keys(rdb, key)) == 1 and len(redis_keys(rdb, key2)) == 2


def test_route_methods_is_the_routes(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, SETTINGS_ROUTES)
    key = new_key()
    st, h, b1, log = call(p, "DELETE", "/echo", [("Idempotency-Key", key)], None,
                          host="del.test")
    assert st == 201 and hone(h, REPLAY) == "false" and log["outcome"] == "executed"
    st, h, b2, log = call(p, "DELETE", "/echo", [("Idempotency-Key", key)], None,
                          host="del.test")
    assert hone(h, REPLAY) == "true" and b2 == b1 and log["route"] == "deletes"
    # POST is not enforced there any more
    key2 = new_key()
    for _ in range(2):
        st, h, _, log = call(p, "POST", "/echo", [("Idempotency-Key", key2)], b"x",
                             host="del.test")
        assert st == 201 and hone(h, REPLAY) is None and log["outcome"] == "passthrough"
    # and DELETE is not enforced on the default route
    st, h, _, log = call(p, "DELETE", "/echo", [("Idempotency-Key", key)], None, host="t.test")
    assert hone(h, REPLAY) is None and log["outcome"] == "passthrough"
    assert upstream.hits("/echo") == 4


# =========================================================================== 3. metrics
def test_requests_total_counts_per_route(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, """
        routes:
          - name: alpha
            match: {host: alpha.test}
          - name: beta
            match: {host: beta.test}
            require-key: true
    """)
    ka, kb, kd = new_key(), new_key(), new_key()
    expected = [
        (("POST", [("Idempotency-Key", ka)], b"x", "alpha.test"), "alpha", "executed"),
        (("POST", [("Idempotency-Key", ka)], b"x", "alpha.test"), "alpha", "replayed"),
        (("POST", [("Idempotency-Key", ka)], b"x", "alpha.test"), "alpha", "replayed"),
        (("POST", [("Idempotency-Key", ka)], b"y", "alpha.test"), "alpha", "mismatch"),
        (("POST", [], b"x", "beta.test"), "beta", "missing_key"),
        (("POST", [], b"x", "beta.test"), "beta", "missing_key"),
        (("POST", [("Idempotency-Key", kb)], b"x", "beta.test"), "beta", "executed"),
        (("POST", [("Idempotency-Key", kd)], b"x", "t.test"), "default", "executed"),
        (("POST", [], b"x", "t.test"), "default", "passthrough"),
        (("GET", [], None, "t.test"), "default", "passthrough"),
    ]
    counts = {}
    for (method, headers, body, host), route, outcome in expected:
        _, _, _, log = call(p, method, "/echo", headers, body, host=host)
        assert (log["route"], log["outcome"]) == (route, outcome)
        counts[(route, outcome)] = counts.get((route, outcome), 0) + 1
    m = p.metrics()
    for (route, outcome), n in counts.items():
        assert metrics_value(m, "idemproxy_requests_total",
                             {"route": route, "outcome": outcome}) == n, (route, outcome, m)
    for route in ("alpha", "beta", "default"):
        total = sum(n for (r, _), n in counts.items() if r == route)
        assert metrics_value(m, "idemproxy_requests_total", {"route": route}) == total, route
    assert metrics_value(m, "idemproxy_requests_total") == len(expected)
    assert metrics_value(m, "idemproxy_requests_total",
                         {"route": "beta", "outcome": "executed"}) == 1
    assert not metrics_value(m, "idemproxy_requests_total",
                             {"route": "alpha", "outcome": "missing_key"})
