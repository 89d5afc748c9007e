"""missing_key, invalid_key (README.md, What it does with each request)."""
import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import store_independent
from fixtures.probes import assert_free, assert_nothing_stored


def test_missing_key_with_require_key(proxy, upstream):
    p = proxy("--require-key")
    for method in ("POST", "PUT", "PATCH"):
        assert_problem(p.request(method, "/echo", body=b"x"), 400, "idempotency_key_missing", "2.1")
    assert upstream.hits() == 0
    assert_nothing_stored(p)
    # Not enforced methods still pass.
    st, h, _ = p.request("GET", "/echo")
    assert st == 201 and hone(h, REPLAY) is None
    # And a keyed POST is executed.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"


@store_independent
def test_require_key_from_env(proxy, upstream):
    p = proxy(env={"IDEMPROXY_REQUIRE_KEY": "yes"})
    assert_problem(p.request("POST", "/echo", body=b"x"), 400, "idempotency_key_missing", "2.1")
    assert upstream.hits() == 0


def test_missing_key_without_require_key_is_passthrough(proxy, upstream):
    p = proxy()
    st, h, _ = p.request("POST", "/echo", body=b"x")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 1
    assert_nothing_stored(p)


INVALID = [
    pytest.param(b'""', id="empty-quoted"),
    pytest.param(b"k" * 256, id="256-bytes"),
    pytest.param(b'"' + b"k" * 256 + b'"', id="256-bytes-quoted"),
    pytest.param(b'"a b"', id="quoted-space"),
    pytest.param(b"a,b", id="bare-comma"),
    pytest.param(b'"abc', id="unterminated"),
    pytest.param(b'"a\\x"', id="bad-escape"),
    pytest.param(b'"abc\\"', id="escaped-final-quote"),
    pytest.param(b"a\tb", id="bare-tab"),
    pytest.param(b'"a\tb"', id="quoted-tab"),
    pytest.param(b"a b", id="bare-space"),
    pytest.param(b'a"b', id="bare-quote"),
    pytest.param(b"a\\b", id="bare-backslash"),
    pytest.param(b"caf\xc3\xa9", id="obs-text"),
    pytest.param(b'"abc"x', id="trailing-garbage"),
]


def keyed_post(key_lines, body=b"payload", path=b"/echo"):
    head = b"POST " + path + b" HTTP/1.1\r\nHost: test\r\n"
    for line in key_lines:
        head += line + b"\r\n"
    head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    return head + body


@pytest.mark.parametrize("value", INVALID)
def test_invalid_key(proxy, upstream, value):
    p = proxy()
    resp = p.raw(keyed_post([b"Idempotency-Key: " + value]))
    assert_problem(resp, 400, "idempotency_key_invalid", "2.1")
    assert upstream.hits() == 0
    assert_nothing_stored(p)


@pytest.mark.parametrize("lines", [
    pytest.param([b"Idempotency-Key: k1", b"Idempotency-Key: k2"], id="two-values"),
    pytest.param([b"Idempotency-Key: k1", b"Idempotency-Key: k1"], id="same-value"),
    pytest.param([b"Idempotency-Key: k1", b"idempotency-key: k2"], id="name-case"),
    pytest.param([b'IDEMPOTENCY-KEY: "k1"', b"idempotency-key: k1"], id="quoted-and-bare"),
])
def test_two_key_headers(proxy, upstream, lines):
    p = proxy()
    resp = p.raw(keyed_post(lines))
    assert_problem(resp, 400, "idempotency_key_invalid", "2.1")
    assert upstream.hits() == 0
    assert_nothing_stored(p)
    # Neither value was locked or stored: both keys still execute.
    assert_free(p, "k1", ("POST", "/echo", [("Idempotency-Key", "k1")], b"payload"))
    assert_free(p, "k2", ("POST", "/echo", [("Idempotency-Key", "k2")], b"payload"))


def test_invalid_key_decided_before_body_limit(proxy, upstream):
    """Key validity comes from the headers, before the body (and its limit)."""
    p = proxy("--max-body", "1K")
    resp = p.raw(keyed_post([b'Idempotency-Key: "a b"'], body=b"z" * 2048))
    assert_problem(resp, 400, "idempotency_key_invalid", "2.1")
    assert upstream.hits() == 0


def test_key_of_255_bytes_works(proxy, upstream):
    p = proxy()
    key = "k" * 254 + "Z"
    for expect in ("false", "true"):
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert st == 201 and hone(h, REPLAY) == expect
    # Quoted, 255 bytes after unquoting.
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", '"%s"' % key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 1


def test_key_with_all_printable_ascii(proxy, upstream):
    """Every byte 0x21-0x7E is valid in a quoted key."""
    p = proxy()
    chars = "".join(chr(c) for c in range(0x21, 0x7F))
    quoted = '"' + chars.replace("\\", "\\\\").replace('"', '\\"') + '"'
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", quoted)], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", quoted)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true"
    assert upstream.hits("/echo") == 1


def test_invalid_key_on_get_is_passthrough(proxy, upstream):
    """A method that is not enforced is passthrough before any key check."""
    p = proxy()
    st, h, _ = p.raw(b'GET /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: "a b"\r\n'
                     b"Connection: close\r\n\r\n")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 1
