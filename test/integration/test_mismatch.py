"""mismatch: the same key with a different fingerprint (README.md, What it does
with each request)."""
from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.probes import assert_completed, start_slow


def variants(key):
    """Requests that differ from POST /slow?ms=1500 body b"orig" in one part each."""
    h = [("Idempotency-Key", key)]
    return [
        ("POST", "/slow?ms=1500", h, b"other"),  # body
        ("POST", "/slow?ms=1500", h, b"orig "),  # body, one byte longer
        ("POST", "/slow?ms=1501", h, b"orig"),   # target
        ("POST", "/slow?ms=1500&", h, b"orig"),  # raw target, not normalized
        ("PUT", "/slow?ms=1500", h, b"orig"),    # method
    ]


def test_mismatch_while_in_flight_and_after(proxy, upstream):
    p = proxy()
    key = new_key()
    first = start_slow(p, key, 1500, body=b"orig")
    for req in variants(key):
        assert_problem(p.request(*req), 422, "idempotency_key_mismatch", "2.2")
    st, h, body = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    for req in variants(key):
        assert_problem(p.request(*req), 422, "idempotency_key_mismatch", "2.2")
    assert upstream.hits("/slow") == 1
    # The original request still replays, and the record was not touched.
    assert_completed(p, key, ("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"orig"),
                     body=body)
    assert upstream.hits("/slow") == 1


def test_mismatch_echo_empty_vs_nonempty_body(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", key)], b"x"), 422,
                   "idempotency_key_mismatch", "2.2")
    # Fields are framed: moving bytes between target and body is a different request.
    key2 = new_key()
    st, h, _ = p.request("POST", "/echo?a", [("Idempotency-Key", key2)], b"b")
    assert st == 201
    assert_problem(p.request("POST", "/echo?ab", [("Idempotency-Key", key2)], b""), 422,
                   "idempotency_key_mismatch", "2.2")
    assert upstream.hits("/echo") == 2
