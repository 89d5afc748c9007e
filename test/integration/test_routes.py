"""Routes and key sources (SPEC §6): how a request finds its route, the
settings a route gives it, where its key comes from (header, headers, json,
fallback: fingerprint), keys that never collide across sources, /keys and the
access log for derived keys, the stripe error dialect, the route label of the
metrics, and the configuration file on the command line (--config,
--check-config, IDEMPROXY_CONFIG, flag > environment > file).

The route files here set neither upstream nor redis: the proxy fixture passes
--upstream and --redis, which beat the file anyway (one test checks exactly
that). Requests are told apart by route through the JSON access line each of
them writes (its "route" field), read from the proxy's stderr file.
"""
import json
import re
import textwrap
import urllib.parse

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.marks import redis_only, store_independent
from fixtures.pki import make_pki
from fixtures.probes import redis_keys, start_request
from fixtures.proxy import run_binary
from fixtures.waiting import free_port, in_thread, wait_for

LINE_RE = r"^(?:idemproxy: )?%s:(\d+):(\d+): (.+)$"


# --------------------------------------------------------------------------- helpers
def write_config(tmp_path, text, name=None):
    """Writes a route file into tmp_path (dedented); returns its path."""
    if name is None:
        name = "routes-%s.yaml" % new_key()
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def routed(proxy, tmp_path, text, *extra, **kw):
    """A proxy reading the route file <text>, with JSON logs (the access line
    names each request's route)."""
    return proxy("--config", str(write_config(tmp_path, text)), "--log-format", "json",
                 *extra, **kw)


def access_lines(p):
    """Every JSON access line the proxy wrote so far (the whole stderr file,
    not the tail Proxy.stderr() keeps)."""
    try:
        with open(p.stderr_path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    out = []
    for ln in data.decode("utf-8", "replace").splitlines():
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("msg") == "access":
            out.append(obj)
    return out


def _logged(p, before):
    """The access line of the one request sent since there were <before>."""
    lines = wait_for(lambda: (lambda a: a if len(a) > before else None)(access_lines(p)),
                     timeout=5, what="the request's access line")
    assert len(lines) == before + 1, lines[before:]
    return lines[-1]


def call(p, method, path, headers=(), body=None, host=None):
    """One request (Host <host> when given). Returns (status, headers, body, access line)."""
    headers = list(headers)
    if host is not None:
        headers.append(("Host", host))
    before = len(access_lines(p))
    st, h, b = p.request(method, path, headers, body)
    return st, h, b, _logged(p, before)


def call_raw(p, data):
    """Raw bytes on a fresh connection. Returns (status, headers, body, access line)."""
    before = len(access_lines(p))
    st, h, b = p.raw(data)
    return st, h, b, _logged(p, before)


def route_of(p, method, path, host="t.test", headers=()):
    """The route a request (keyless, tiny body for methods that take one) ran under."""
    body = b"x" if method in ("POST", "PUT", "PATCH") else None
    return call(p, method, path, headers, body, host=host)[3]["route"]


def assert_stripe_error(resp, status, code, etype):
    """resp = (status, headers, body): the stripe dialect of SPEC §6."""
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


def check_lines(stderr, path):
    """Every line of <stderr> is PATH:LINE:COLUMN: message. Returns [(line, col, msg)]."""
    pat = re.compile(LINE_RE % re.escape(str(path)))
    out = []
    for ln in stderr.decode().splitlines():
        m = pat.match(ln)
        assert m, "not PATH:LINE:COLUMN: message: %r" % ln
        out.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return out


def cli_args():
    return ["--listen", "127.0.0.1:%d" % free_port(),
            "--admin-listen", "127.0.0.1:%d" % free_port()]


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


# =========================================================================== 3. key sources
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


# =========================================================================== 4. no collisions
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


# =========================================================================== 5. /keys and the log
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


# =========================================================================== 7. metrics
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


# =========================================================================== 8. the command line
def test_check_config_valid_file(tmp_path):
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        max-body: 2M
        scope-header: [Authorization, Stripe-Account]
        routes:
          - name: payments
            match: {methods: [POST], path: /v1/payments}
            require-key: true
          - name: stripe-webhooks
            match: {methods: [POST], path: /webhooks/stripe}
            key: {json: /id}
            scope-header: []
          - name: cloudevents
            match: {path: /events/*}
            key: {headers: [ce-source, ce-id]}
          - name: legacy
            match: {path: /v1/*}
            key: {header: X-Idempotency, fallback: fingerprint}
            errors: stripe
          - name: internal
            match: {path: /internal/*}
            enforce: false
    """)
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert len(out.splitlines()) == 1 and out.endswith("\n"), out
    assert str(path) in out and "5 routes" in out, out
    assert r.stderr == b""


BROKEN = """\
upstream: http://127.0.0.1:3000
ttl: abc
bogus-option: 1
check-config: true
routes:
  - name: Bad Name
    match: {path: nopath}
  - name: dup
    key: {json: id}
  - name: dup
    errors: soap
    match: {host: "a b", paths: /x}
  - match: {path: /y}
    enforce: maybe
"""
# (line, column) of each problem of BROKEN: the value that is wrong, or the key
BROKEN_AT = {(2, 6), (3, 1), (4, 1), (6, 11), (7, 19), (9, 17), (10, 11), (11, 13), (12, 19),
             (12, 26), (13, 5), (14, 14)}


def test_check_config_invalid_file_prints_every_problem(tmp_path):
    path = write_config(tmp_path, BROKEN, name="broken.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == b""
    got = check_lines(r.stderr, path)
    assert {(ln, col) for ln, col, _ in got} == BROKEN_AT and len(got) == len(BROKEN_AT), got
    # a few messages, at the value (or key) that is wrong
    by_at = {(ln, col): msg for ln, col, msg in got}
    assert "ttl" in by_at[(2, 6)]
    assert "bogus-option" in by_at[(3, 1)]
    assert "check-config" in by_at[(4, 1)]
    assert "Bad Name" in by_at[(6, 11)]
    assert "soap" in by_at[(11, 13)]
    assert "'dup'" in by_at[(10, 11)]
    assert "paths" in by_at[(12, 26)] and "maybe" in by_at[(14, 14)]
    assert "name is required" in by_at[(13, 5)]


def test_starting_with_a_broken_file_exits_2_with_its_problems(tmp_path):
    path = write_config(tmp_path, BROKEN, name="broken.yaml")
    r = run_binary(["--config", str(path)] + cli_args())
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert {(ln, col) for ln, col, _ in check_lines(r.stderr, path)} == BROKEN_AT
    # the same with the file named by IDEMPROXY_CONFIG
    r = run_binary(cli_args(), env={"IDEMPROXY_CONFIG": str(path)})
    assert r.returncode == 2
    assert {(ln, col) for ln, col, _ in check_lines(r.stderr, path)} == BROKEN_AT


@pytest.mark.parametrize("text,line", [
    pytest.param("upstream: [unterminated\n", 2, id="unterminated-flow"),
    pytest.param("routes:\n  - name: a\n    match: {path: /a}\n  bad indent\n", 5,
                 id="bad-indent"),  # line 5: where libyaml notices it
    pytest.param("upstream: http://127.0.0.1:1\n---\nttl: 5\n", 2, id="two-documents"),
])
def test_check_config_yaml_syntax_error(tmp_path, text, line):
    path = write_config(tmp_path, text, name="syntax.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2
    got = check_lines(r.stderr, path)
    assert len(got) == 1 and got[0][0] == line, got


def test_routes_that_are_not_a_list_are_refused(tmp_path):
    """One route written without its "- ": `routes` is then a mapping, a value
    of the wrong type (SPEC §6), and must not be taken for no routes at all."""
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        routes:
          name: payments
          match: {methods: [POST], path: /v1/payments}
          require-key: true
    """, name="routes-mapping.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    got = check_lines(r.stderr, path)
    assert len(got) == 1 and got[0][0] in (2, 3) and "routes" in got[0][2], got
    r = run_binary(["--config", str(path)] + cli_args())
    assert r.returncode == 2, (r.stdout, r.stderr)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_config_file_exits_2_naming_it(tmp_path, what):
    path = tmp_path / ("absent.yaml" if what == "missing" else "a-directory.yaml")
    if what == "directory":
        path.mkdir()
    for args in (["--check-config", "--config", str(path)], ["--config", str(path)] + cli_args()):
        r = run_binary(args + ["--upstream", "http://127.0.0.1:1"])
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        err = r.stderr.decode().strip()
        assert len(err.splitlines()) == 1 and str(path) in err, err


@store_independent
def test_precedence_flag_env_file_for_max_body(proxy, upstream, tmp_path):
    path = str(write_config(tmp_path, "max-body: 100\n"))

    def limit_is(p, n):
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x" * n)
        assert st == 201 and hone(h, REPLAY) == "false"
        assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())],
                                 b"x" * (n + 1)), 413, "payload_too_large")

    limit_is(proxy("--config", path), 100)
    limit_is(proxy("--config", path, env={"IDEMPROXY_MAX_BODY": "200"}), 200)
    limit_is(proxy("--config", path, "--max-body", "300", env={"IDEMPROXY_MAX_BODY": "200"}), 300)
    limit_is(proxy("--config", path, "--max-body", "300"), 300)


@store_independent
def test_precedence_flag_beats_the_files_upstream(proxy, upstream, tmp_path):
    """The file names an upstream nobody listens on; the fixture's --upstream wins."""
    path = str(write_config(tmp_path, "upstream: http://127.0.0.1:%d\n" % free_port()))
    p = proxy("--config", path)
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 1
    # and without the flag, the file's upstream is the one used (502: nobody there)
    p2 = proxy("--config", path, upstream_url=False)
    st, _, b = p2.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 502 and json.loads(b)["code"] == "upstream_unavailable"
    assert upstream.hits("/echo") == 1


@store_independent
def test_precedence_a_list_from_env_or_flag_replaces_the_files(proxy, upstream, tmp_path):
    path = str(write_config(tmp_path, "scope-header: [X-Tenant]\nmethods: [DELETE]\n"))

    def replays(p):
        """Replay headers of one key sent by (tenant t1, user u1), then (t2, u1)."""
        key = new_key()
        return [hone(p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Tenant", t),
                                                  ("X-User", "u1")], b"x")[1], REPLAY)
                for t in ("t1", "t2")]

    assert replays(proxy("--config", path)) == [None, None]  # POST is not enforced
    env = {"IDEMPROXY_METHODS": "POST", "IDEMPROXY_SCOPE_HEADER": "X-User"}
    assert replays(proxy("--config", path, env=env)) == ["false", "true"]  # X-Tenant is gone
    env = {"IDEMPROXY_METHODS": "POST"}
    assert replays(proxy("--config", path, "--scope-header", "X-User", env=env)) == [
        "false", "true"]
    assert replays(proxy("--config", path, env=env)) == ["false", "false"]  # the file's scope


@redis_only
def test_precedence_flag_env_file_for_ttl_on_redis(proxy, upstream, rdb, tmp_path):
    path = str(write_config(tmp_path, "ttl: 1000\n"))

    def ttl_is(p, s):
        key = new_key()
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert hone(h, REPLAY) == "false"
        pttl = rdb.pttl(redis_keys(rdb, key)[0])
        assert (s - 10) * 1000 < pttl <= s * 1000, (s, pttl)

    ttl_is(proxy("--config", path), 1000)
    ttl_is(proxy("--config", path, env={"IDEMPOTENCY_DEFAULT_TTL_SEC": "2000"}), 2000)
    ttl_is(proxy("--config", path, env={"IDEMPOTENCY_DEFAULT_TTL_SEC": "2000",
                                        "IDEMPROXY_TTL": "3000"}), 3000)
    ttl_is(proxy("--config", path, "--ttl", "4000", env={"IDEMPROXY_TTL": "3000"}), 4000)


@store_independent
def test_idemproxy_config_names_the_file(proxy, upstream, tmp_path):
    strict = str(write_config(tmp_path, "require-key: true\n"))
    lax = str(write_config(tmp_path, "routes: []\n"))
    p = proxy(env={"IDEMPROXY_CONFIG": strict})
    assert_problem(p.request("POST", "/echo", body=b"x"), 400, "idempotency_key_missing", "2.1")
    # --config beats IDEMPROXY_CONFIG
    p = proxy("--config", lax, env={"IDEMPROXY_CONFIG": strict})
    st, h, _ = p.request("POST", "/echo", body=b"x")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 1
    # --check-config reads it too
    r = run_binary(["--check-config", "--upstream", "http://127.0.0.1:1"],
                   env={"IDEMPROXY_CONFIG": strict})
    assert r.returncode == 0 and strict in r.stdout.decode(), (r.stdout, r.stderr)


# --------------------------------------------------------------------------- every option is a key
HELP_ACTIONS = ("--help", "--version", "--check-config", "--config")


def help_options():
    """{flag: default or None} of `idemproxy --help`'s Options section (as
    test_manpage.parse_help reads it)."""
    r = run_binary(["--help"])
    assert r.returncode == 0, r.stderr
    options, current, section = {}, None, None
    for line in r.stdout.decode().splitlines():
        if line == "Options:":
            section = "options"
        elif line.endswith(":") and not line.startswith(" "):
            section = None
        elif section and line.startswith("  ") and not line.startswith("   "):
            current = line.strip().partition(" ")[0]
            options[current] = None
        elif section and current and line.strip().startswith("[") and line.strip().endswith("]"):
            for part in line.strip()[1:-1].split(", "):
                if part.startswith("default "):
                    options[current] = part[len("default "):]
    return options


def yaml_scalar(v):
    return v if re.fullmatch(r"[A-Za-z0-9_./,+-]+", v) else json.dumps(v)


def test_every_help_option_is_a_file_key(tmp_path):
    for name in ("password", "ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "token").write_text("an-admin-token-of-some-length-0123456789\n")
    (tmp_path / "store-keys").write_text("k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n")
    pki = make_pki(str(tmp_path / "pki"))  # TLS files are loaded by --check-config
    # options with no default: a valid sample value
    samples = {
        "--upstream": "https://127.0.0.1:3000",  # https: the upstream TLS options apply
        "--upstream-tls-ca-file": pki.ca_crt,
        "--upstream-tls-cert-file": pki.client_crt,
        "--upstream-tls-key-file": pki.client_key,
        "--upstream-tls-server-name": "api.example.com",
        "--tls-cert-file": pki.server_crt,
        "--tls-key-file": pki.server_key,
        "--store": "",  # none: --redis names the store (one of the two, not both)
        "--store-password-file": str(tmp_path / "password"),
        "--redis": "rediss://127.0.0.1:6380",  # rediss: the TLS options below apply
        "--redis-password-file": str(tmp_path / "password"),
        "--redis-tls-ca-file": str(tmp_path / "ca.pem"),
        "--redis-tls-cert-file": str(tmp_path / "cert.pem"),
        "--redis-tls-key-file": str(tmp_path / "key.pem"),
        "--redis-tls-server-name": "redis.example.com",
        "--admin-token-file": str(tmp_path / "token"),
        "--store-encryption-key-file": str(tmp_path / "store-keys"),
    }
    options = help_options()
    assert "--ttl" in options and "--max-body" in options, options
    lines = []
    for flag, default in options.items():
        if flag in HELP_ACTIONS:
            continue
        value = default if default is not None else samples.get(flag)
        assert value is not None, "no default and no sample value for %s" % flag
        lines.append("%s: %s" % (flag[2:], yaml_scalar(value)))
    path = tmp_path / "every-option.yaml"
    path.write_text("\n".join(lines) + "\n")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 0, (path.read_text(), r.stderr.decode())
    assert len(r.stdout.decode().splitlines()) == 1
    # and each is a key of the file: an unknown one is not
    bad = tmp_path / "unknown-option.yaml"
    bad.write_text(path.read_text() + "no-such-option: 1\n")
    r = run_binary(["--check-config", "--config", str(bad)])
    assert r.returncode == 2
    got = check_lines(r.stderr, bad)
    assert got == [(len(lines) + 1, 1, got[0][2])] and "no-such-option" in got[0][2], got
