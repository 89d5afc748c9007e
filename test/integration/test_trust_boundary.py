"""The trust boundary (issue 12; doc/guarantees.md, Threat model): no client
input can steer where a request goes, smuggle bytes past the proxy, or reach
what another client or an operator owns.

- Request targets: whatever the target, the request goes to the --upstream
  origin and nowhere else (a second listener that must never be reached is
  watched, for an IP and a host-name upstream); absolute-form is forwarded as
  its origin-form with Host set to its authority; OPTIONS * as such; CONNECT
  is 501; every other form is 400 bad_request.
- Field bytes: CR, NUL and every other control byte but HTAB in a value, in
  the target or in the method are 400 bad_request: nothing forwarded, nothing
  locked, the connection closed. No value is cut short at a NUL.
- bad_request is an outcome like the others: problem+json, counted, logged.
- X-TTL larger than any integer is capped at --max-ttl.
- /keys: with --admin-token-file only with the bearer token (401 problem
  otherwise); /healthz, /readyz, /metrics stay open.
- Logs: one line per event whatever bytes a client sends, in both formats,
  and never a credential.
"""
import json
import os
import socket
import threading
import time
import urllib.parse

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key, recv_until_closed
from fixtures.marks import store_independent
from fixtures.probes import assert_free, assert_nothing_stored
from fixtures.proxy import run_binary
from fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.both_clients  # on idemproxy's own upstream client and libcurl's


# --------------------------------------------------------------------------- helpers
class Tripwire:
    """A TCP listener that must never be reached: it counts the connections
    it accepts and what they sent."""

    def __init__(self, port=0):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            c.settimeout(1)
            try:
                data = c.recv(4096)
            except OSError:
                data = b""
            self.accepted.append(data)
            try:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nTRIPPED!")
            except OSError:
                pass
            c.close()

    def stop(self):
        self.stopping = True
        self.thread.join(2)
        self.sock.close()


def raw_answer(port, data, timeout=5.0):
    """Sends raw bytes, reads until the proxy closes. Returns (status, headers
    dict lower-case, body, raw bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = recv_until_closed(s, "the refused connection")
    finally:
        s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith(b"HTTP/1.1 ") else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.decode().lower()] = v.strip().decode()
    return status, headers, body, out


def assert_bad_request(port, data, status=400):
    """<data> gets the bad_request problem with Connection: close, and the
    proxy closes the connection (nothing after it on the connection is read)."""
    st, headers, body, raw = raw_answer(port, data)
    assert st == status, raw[:300]
    assert headers.get("connection") == "close", raw[:300]
    assert headers.get("content-type") == "application/problem+json", raw[:300]
    obj = json.loads(body)
    assert obj["code"] == "bad_request" and obj["status"] == status, obj
    assert obj["type"] == "about:blank" and obj["title"] and obj["detail"], obj
    assert REPLAY.lower() not in headers
    return obj


def outcome_count(p, outcome):
    text = p.metrics()
    for line in text.splitlines():
        if line.startswith('idemproxy_requests_total{route="default",outcome="%s"}' % outcome):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# Targets that, glued to the upstream's URL, named another host, port or
# user info (the old hole), or that are no request target at all.
def steering_targets(trip_port, host):
    return [
        "@127.0.0.1:%d/x" % trip_port,
        "@%s:%d/x" % (host, trip_port),
        ":%d/x" % trip_port,
        ".localhost:%d/x" % trip_port,
        "user:pw@127.0.0.1:%d/x" % trip_port,
        "\\\\127.0.0.1:%d\\x" % trip_port,
        "127.0.0.1:%d" % trip_port,
        "x",
        "%2F%2F127.0.0.1:" + str(trip_port),
        "http://u@127.0.0.1:%d/x" % trip_port,
        "http://127.0.0.1:%d@127.0.0.1:%d/x" % (trip_port, trip_port),
        "ftp://127.0.0.1:%d/x" % trip_port,
        "http:///x",
        "http://[::1/x",
    ]


# --------------------------------------------------------------------------- targets
@store_independent
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["ip", "hostname"])
def test_no_target_reaches_another_listener(proxy, upstream, host):
    trip = Tripwire()
    try:
        p = proxy(upstream_url="http://%s:%d" % (host, upstream.port))
        for t in steering_targets(trip.port, host):
            for method in ("GET", "POST"):
                key = new_key()
                assert_bad_request(p.port, b"%s %s HTTP/1.1\r\nHost: t\r\nIdempotency-Key: %s\r\n"
                                   b"Content-Length: 1\r\n\r\nx"
                                   % (method.encode(), t.encode(), key.encode()))
        # Forms that are accepted go to the upstream, whatever host they name.
        accepted = ["//127.0.0.1:%d/x" % trip.port,
                    "http://127.0.0.1:%d/echo" % trip.port,
                    "https://127.0.0.1:%d/echo?a=1" % trip.port,
                    "HTTP://%s:%d" % (host, trip.port),
                    "/echo/@127.0.0.1:%d" % trip.port]
        for t in accepted:
            before = upstream.hits()
            st, _, _ = p.request("POST", t, [("Idempotency-Key", new_key())], b"x")
            assert st in (200, 201), t
            assert upstream.hits() == before + 1, t
        time.sleep(0.3)
        assert trip.accepted == [], "a client steered the proxy to another listener: %r" % (
            trip.accepted,)
    finally:
        trip.stop()


def test_no_target_reaches_a_port_one_digit_longer(tmp_path):
    """With an upstream on port P, "GET 1/x" once went to port P*10+1."""
    for _ in range(200):
        port = 1024 + int.from_bytes(os.urandom(2), "big") % (6553 - 1024)
        try:
            up = FakeUpstream(port=port).start()
        except OSError:
            continue
        try:
            trip = Tripwire(port * 10 + 1)
        except OSError:
            up.stop()
            continue
        break
    else:
        pytest.fail("no free pair of ports P and P*10+1 on 127.0.0.1")
    from fixtures.proxy import Proxy
    p = Proxy(["--upstream", up.url], None, str(tmp_path), "digit", store="memory",
              upstream=up).start()
    try:
        for t in ("1/x", "1", "1?x=1", "1/echo"):
            assert_bad_request(p.port, b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % t.encode())
        assert p.request("GET", "/echo")[0] == 201
        time.sleep(0.3)
        assert trip.accepted == []
        assert up.hits() == 1
    finally:
        assert p.stop() == 0
        trip.stop()
        up.stop()


@store_independent
def test_path_prefix_starts_every_forwarded_target(proxy, upstream):
    p = proxy(upstream_url=upstream.url + "/api/")
    cases = [("GET", "/echo?x=1", "/api/echo?x=1"),
             ("GET", "//echo", "/api//echo"),
             ("GET", "http://other.example:1234/echo?y", "/api/echo?y"),
             ("GET", "http://other.example", "/api/"),
             ("GET", "http://other.example?q=1", "/api/?q=1"),
             ("OPTIONS", "*", "/api")]
    for method, target, want in cases:
        upstream.reset()
        st, _, _ = p.raw(b"%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                         % (method.encode(), target.encode()))
        assert st in (200, 201), target
        (m, got, _, _), = upstream.requests
        assert (m, got) == (method, want), target


@store_independent
def test_absolute_form_forwarded_as_origin_form_with_its_host(proxy, upstream):
    p = proxy()
    st, h, b = p.raw(b"POST http://api.example:8443/echo?a=1 HTTP/1.1\r\nHost: ignored.example\r\n"
                     b"Idempotency-Key: abs-1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
    assert st == 201
    echo = json.loads(b)
    assert echo["target"] == "/echo?a=1"
    hosts = [v for k, v in echo["headers"] if k.lower() == "host"]
    assert hosts == ["api.example:8443"], echo["headers"]
    xfh = [v for k, v in echo["headers"] if k.lower() == "x-forwarded-host"]
    assert xfh == ["api.example:8443"]
    # Fingerprinted as its origin-form: the retry in origin-form is the same request.
    st2, h2, b2 = p.request("POST", "/echo?a=1", [("Idempotency-Key", "abs-1")], b"hi")
    assert hone(h2, REPLAY) == "true" and b2 == b
    assert upstream.hits() == 1


@store_independent
def test_options_asterisk_forwarded_as_such(proxy, upstream):
    p = proxy()
    st, _, _ = p.raw(b"OPTIONS * HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert st == 200
    (m, target, _, _), = upstream.requests
    assert (m, target) == ("OPTIONS", "*")
    assert_bad_request(p.port, b"GET * HTTP/1.1\r\nHost: t\r\n\r\n")
    assert_bad_request(p.port, b"POST * HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k\r\n"
                       b"Content-Length: 0\r\n\r\n")
    assert upstream.hits() == 1


@store_independent
def test_head_with_a_streamed_body_sends_no_second_request(proxy, upstream):
    """A HEAD is forwarded without a body (its framing has none): the bytes a
    client streams after it, shaped as a request of their own, never reach
    the upstream, chunked or with a Content-Length past what streams."""
    hidden = (b"GET /smuggled HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 10.0.0.1\r\n"
              b"Content-Length: 0\r\n\r\n")
    p = proxy()
    chunked = (b"HEAD /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(hidden) + hidden + b"\r\n0\r\n\r\n")
    padded = hidden + b" " * (70000 - len(hidden))
    sized = (b"HEAD /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(padded)
             + padded)
    for data in (chunked, sized):
        s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
        try:
            s.sendall(data)
            s.settimeout(3)
            try:
                s.recv(65536)
            except OSError:
                pass
        finally:
            s.close()
    time.sleep(0.5)
    targets = [(m, t) for m, t, _, _ in upstream.requests]
    assert ("GET", "/smuggled") not in targets, targets
    assert all(m == "HEAD" for m, _ in targets), targets


@store_independent
def test_connect_is_501_and_reaches_nothing(proxy, upstream):
    trip = Tripwire()
    try:
        p = proxy()
        for t in ("127.0.0.1:%d" % trip.port, "/x", "http://127.0.0.1:%d/" % trip.port):
            assert_bad_request(p.port, b"CONNECT %s HTTP/1.1\r\nHost: t\r\n\r\n" % t.encode(),
                               status=501)
        time.sleep(0.2)
        assert trip.accepted == [] and upstream.hits() == 0
    finally:
        trip.stop()


# --------------------------------------------------------------------------- field bytes
def test_bare_cr_in_a_value_is_refused_nothing_forwarded_nothing_locked(proxy, upstream):
    p = proxy()
    key = new_key()
    for line in (b"X: a\rTransfer-Encoding: chunked", b"X: a\rIdempotency-Key: other",
                 b"Idempotency-Key: " + key.encode() + b"\rX: y"):
        assert_bad_request(p.port, b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: "
                           + key.encode() + b"\r\n" + line + b"\r\nContent-Length: 1\r\n\r\nx")
    assert upstream.hits() == 0
    assert_nothing_stored(p)
    assert_free(p, key)


def test_nul_in_a_key_is_refused_never_truncated(proxy, upstream):
    """Idempotency-Key: abc\\0zzz and abc\\0yyy were both key abc, and the
    second was replayed the first one's answer."""
    p = proxy()
    base = new_key()
    for tail in (b"zzz", b"yyy", b""):
        assert_bad_request(p.port, b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: "
                           + base.encode() + b"\0" + tail + b"\r\nContent-Length: 1\r\n\r\nx")
    assert upstream.hits() == 0
    assert_nothing_stored(p)
    st, h, _ = assert_free(p, base)  # the key before the NUL was never used
    assert st == 201


@store_independent
def test_nul_anywhere_in_the_head_is_refused(proxy, upstream):
    p = proxy()
    heads = [b"GET /a\0b HTTP/1.1\r\nHost: t\r\n\r\n",
             b"GET /a\0 HTTP/1.1\r\nHost: t\r\n\r\n",
             b"GE\0T /a HTTP/1.1\r\nHost: t\r\n\r\n",
             b"GET /a HTTP/1.1\r\nHost: t\0evil\r\n\r\n",
             b"GET /a HTTP/1.1\r\nHost: t\r\nX-Scope: a\0b\r\nY: 1\r\n\r\n",
             b"GET /a HTTP/1.1\r\nHost: t\r\nX: \0\0\0\r\n\r\n",
             b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\0\r\n\r\n"]
    for head in heads:
        assert_bad_request(p.port, head)
    assert upstream.hits() == 0


@store_independent
def test_every_control_byte_in_a_value_target_or_method_is_refused(proxy, upstream):
    p = proxy()
    controls = [c for c in range(0x20) if c not in (0x09, 0x0a)] + [0x7f]
    for c in controls:
        b = bytes([c])
        for head in (b"GET /echo HTTP/1.1\r\nHost: t\r\nX: a" + b + b"b\r\n\r\n",
                     b"GET /ec" + b + b"ho HTTP/1.1\r\nHost: t\r\n\r\n",
                     b"G" + b + b"ET /echo HTTP/1.1\r\nHost: t\r\n\r\n"):
            st, headers, body, raw = raw_answer(p.port, head)
            # Either this proxy's problem, or libmicrohttpd's own 400 for a
            # line it cannot parse at all: never forwarded.
            assert st == 400, (c, raw[:200])
    # a tab and 8-bit bytes are field content
    st, _, b = p.request("GET", "/echo", [("X-Tab", "a\tb"), ("X-8bit", "caf\xe9")])
    assert st == 201
    sent = {k.lower(): v for k, v in json.loads(b)["headers"]}
    assert sent["x-tab"] == "a\tb" and sent["x-8bit"].encode("latin-1") == b"caf\xe9"
    assert upstream.hits() == 1


@store_independent
def test_space_in_the_target_and_two_hosts_are_refused(proxy, upstream):
    p = proxy()
    assert_bad_request(p.port, b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n")
    assert_bad_request(p.port, b"GET /a#frag HTTP/1.1\r\nHost: t\r\n\r\n")
    assert_bad_request(p.port, b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert_bad_request(p.port, b"GET /a HTTP/1.1\r\nHost: a b\r\n\r\n")
    assert_bad_request(p.port, b"GET /a HTTP/1.1\r\nHost: u@h\r\n\r\n")
    assert_bad_request(p.port, b"GET /a HTTP/1.1\r\nX: 1\r\n\r\n")  # HTTP/1.1 without Host
    assert upstream.hits() == 0
    st, _, _ = p.raw(b"GET /echo HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs none
    assert st == 201 and upstream.hits() == 1


@store_independent
def test_obs_fold_is_refused(proxy, upstream):
    """libmicrohttpd joins a continuation line onto the field's name
    (X-A: a + " b" became X-Ab: a); RFC 9112 §5.2 lets a server refuse it."""
    p = proxy()
    for fold in (b" b", b"\tb", b"  b: c"):
        assert_bad_request(p.port, b"GET /echo HTTP/1.1\r\nHost: t\r\nX-A: a\r\n" + fold +
                           b"\r\nY: 1\r\n\r\n")
    assert upstream.hits() == 0


def test_framing_refusals_are_bad_request_problems(proxy, upstream):
    p = proxy()
    key = new_key()
    assert_bad_request(p.port, b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " +
                       key.encode() + b"\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"0\r\n\r\n")
    assert_bad_request(p.port, b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
                       status=501)
    assert upstream.hits() == 0
    assert_nothing_stored(p)
    assert_free(p, key)


# --------------------------------------------------------------------------- outcome, log
@store_independent
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_bad_request_counted_and_logged_one_line_whatever_the_bytes(proxy, upstream, fmt):
    p = proxy("--log-format", fmt)
    heads = [b"GET /x\"y\\z\x1b[31m\xff\xc3\xa9%00 HTTP/1.1\r\nHost: t\r\n\r\n",
             b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k\"\\\x7f\xfe\r\n"
             b"Content-Length: 0\r\n\r\n",
             b"GET /echo HTTP/1.1\r\nHost: t\r\nX: 1\r2026-01-01T00:00:00.000Z info forged\r\n"
             b"\r\n",
             b"GET /q\"uote\\ HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer SECRET-TOKEN-42\r\n"
             b"X-Cr: a\rb\r\n\r\n"]
    before = outcome_count(p, "bad_request")
    for head in heads:
        st, _, _, _ = raw_answer(p.port, head)
        assert st == 400
    assert outcome_count(p, "bad_request") == before + len(heads)
    p.request("POST", "/echo", [("Idempotency-Key", '"k\\"q"'), ("X-Ok", "1")], b"x")
    assert p.stop() == 0
    err = p.stderr()
    assert "SECRET-TOKEN-42" not in err
    lines = [line for line in err.split("\n") if line]
    access = []
    for line in lines:
        assert not line.startswith("2026-01-01T00:00:00.000Z"), "a client forged a log line"
        if fmt == "json":
            obj = json.loads(line)  # every line is valid JSON
            assert set(obj) >= {"time", "level", "msg"}
            if obj["msg"] == "access":
                access.append(obj)
        else:
            assert all(0x20 <= ord(c) < 0x7f for c in line), repr(line)
            if " info access " in line:
                access.append(line)
    if fmt == "json":
        bad = [a for a in access if a["outcome"] == "bad_request"]
        assert len(bad) == len(heads), access
        assert all(a["route"] == "default" for a in access), access
        targets = [a["target"] for a in bad]
        assert '/x"y\\z\x1b[31m\\xff\u00e9%00' in targets, targets
        assert '/q"uote\\' in targets, targets
        executed = [a for a in access if a["outcome"] == "executed"]
        assert [a["key"] for a in executed] == ['"k\\"q"'], executed
    else:
        bad = [a for a in access if " bad_request " in a]
        assert len(bad) == len(heads), access
        assert any(' /x\\"y\\\\z\\x1b[31m\\xff\\xc3\\xa9%00 400 bad_request' in a
                   for a in bad), bad
        assert any(' /q\\"uote\\\\ 400 bad_request route=default' in a for a in bad), bad
        assert any(' executed route=default key=\\"k\\\\\\"q\\" ' in a for a in access), access


# --------------------------------------------------------------------------- X-TTL
def test_ttl_header_larger_than_any_integer_is_capped(proxy, upstream):
    p = proxy("--max-ttl", "100", "--ttl", "50")
    for value in ("99999999999999999999999", "18446744073709551616", "0000000000000000000101"):
        key = new_key()
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key), ("X-TTL", value)], b"x")
        assert st == 201
        st, _, b = p.admin_request("GET", "/keys/" + key)
        assert st == 200
        (rec,) = json.loads(b)["records"]
        assert 90_000 < rec["ttl_ms"] <= 100_000, (value, rec)
    key = new_key()  # zero is not positive: the default applies
    p.request("POST", "/echo", [("Idempotency-Key", key), ("X-TTL", "0000")], b"x")
    (rec,) = json.loads(p.admin_request("GET", "/keys/" + key)[2])["records"]
    assert 40_000 < rec["ttl_ms"] <= 50_000, rec


# --------------------------------------------------------------------------- admin
def admin_get(p, path, headers=()):
    from fixtures.client import http_request
    return http_request("127.0.0.1", p.admin_port, "GET", path, list(headers), None, 5.0)


def test_keys_requires_the_admin_token(proxy, upstream, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("  s3cret-admin-Token.1  \nsecond line ignored\n")
    p = proxy("--admin-token-file", str(tok))
    key = new_key()
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    for headers in ([], [("Authorization", "Bearer wrong")], [("Authorization", "s3cret-admin-Token.1")],
                    [("Authorization", "Basic s3cret-admin-Token.1")],
                    [("Authorization", "Bearer s3cret-admin-Token.1x")]):
        resp = admin_get(p, "/keys/" + key, headers)
        obj = assert_problem(resp, 401, "unauthorized")
        assert "Bearer" in (hone(resp[1], "WWW-Authenticate") or "")
        assert "s3cret" not in json.dumps(obj)
    st, _, b = admin_get(p, "/keys/" + key, [("Authorization", "Bearer s3cret-admin-Token.1")])
    assert st == 200 and len(json.loads(b)["records"]) == 1
    # DELETE needs it too
    from fixtures.client import http_request
    scope = json.loads(b)["records"][0]["scope"]
    resp = http_request("127.0.0.1", p.admin_port, "DELETE", "/keys/%s?scope=%s" % (key, scope))
    assert_problem(resp, 401, "unauthorized")
    for path in ("/healthz", "/readyz", "/metrics"):
        assert admin_get(p, path)[0] == 200, path
    assert "s3cret-admin-Token" not in p.stderr()


def test_admin_token_file_errors_stop_start_up(tmp_path, upstream):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    spaced = tmp_path / "spaced"
    spaced.write_text("two words\n")
    for path, want in ((str(tmp_path / "missing"), "cannot read"), (str(empty), "token file"),
                       (str(spaced), "token file")):
        r = run_binary(["--upstream", upstream.url, "--admin-token-file", path])
        assert r.returncode == 2, r
        line = r.stderr.decode().strip()
        assert line.startswith("idemproxy: --admin-token-file:") and want in line, line
        assert "\n" not in line


@store_independent
def test_keys_path_decoded_whole_never_cut_at_nul(proxy, upstream):
    p = proxy()
    p.request("POST", "/echo", [("Idempotency-Key", "abc")], b"x")
    st, _, b = admin_get(p, "/keys/abc%00zzz")
    assert st == 400, b
    st, _, b = admin_get(p, "/keys/abc")
    assert st == 200 and len(json.loads(b)["records"]) == 1
    st, _, b = admin_get(p, "/keys/%61bc")
    assert st == 200 and json.loads(b)["key"] == "abc"
    assert admin_get(p, "/keys/a%zz")[0] == 400


def test_upstream_with_user_info_is_refused_at_start(upstream):
    for url in ("http://user:pw@127.0.0.1:%d" % upstream.port,
                "http://user@127.0.0.1:%d/api" % upstream.port, "http:///api"):
        r = run_binary(["--upstream", url])
        assert r.returncode == 2, (url, r)
        assert r.stderr.decode().startswith("idemproxy: --upstream:"), r.stderr
        assert b"pw@" not in r.stderr
