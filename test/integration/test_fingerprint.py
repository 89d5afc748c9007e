"""The semantic fingerprint (doc/configuration.md, Fingerprint): a route may
fingerprint a JSON body by its canonical form (RFC 8785, less the members it
ignores), add headers that change a request's meaning, and sort the query,
so that an SDK's retry that says the same thing in other words is a replay
and a request that says something else is a 422. What is forwarded is always
the client's bytes.

The route files set neither upstream nor store: the proxy fixture does. Each
request's outcome is read from its JSON access line (fixtures/routes.py).
"""
import json

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.proxy import run_binary
from fixtures.routes import call, check_lines, routed, write_config

ROUTES = """
    fingerprint: {body: json}
    routes:
      - name: pay
        match: {host: pay.test}
        fingerprint:
          body: json
          ignore: [/meta/sent_at, /items/0/note]
          headers: [Stripe-Version]
          query: sorted
      - name: raw
        match: {host: raw.test}
        fingerprint: {body: raw}
"""

FIRST = (b'{"amount": 1000, "currency": "eur", "items": [{"sku": "a", "note": "x"}],'
         b' "meta": {"sent_at": "2026-11-27T10:00:00Z", "n": 1.0}}')
# the same request as an SDK writes it on its retry: other member order,
# spacing and escapes, 1 for 1.0, another time stamp and note (ignored)
AGAIN = (b'{"meta":{"n":1,"sent_at":"2026-11-27T10:00:05Z"},"items":[{"note":"y",'
         b'"sku":"\\u0061"}],"currency":"\\u0065ur","amount":1000}')


def pay(p, key, body, target="/echo?b=2&a=1", version="2024-06-20", host="pay.test"):
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    if version is not None:
        headers.append(("Stripe-Version", version))
    return call(p, "POST", target, headers, body, host=host)


def test_the_same_request_said_another_way_is_replayed(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, ROUTES)
    key = new_key()
    st, h1, b1, log = pay(p, key, FIRST)
    assert st == 201 and log["outcome"] == "executed", b1
    assert json.loads(b1)["body"].encode("latin-1") == FIRST  # forwarded as sent
    st, h2, b2, log = pay(p, key, AGAIN, target="/echo?a=1&b=2", version="  2024-06-20 ")
    assert st == 201 and log["outcome"] == "replayed" and hone(h2, REPLAY) == "true"
    assert b2 == b1
    assert upstream.hits("/echo") == 1


def test_another_amount_or_version_is_a_mismatch(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, ROUTES)
    key = new_key()
    assert pay(p, key, FIRST)[3]["outcome"] == "executed"
    other = FIRST.replace(b"1000", b"1001")
    for body, version, target in ((other, "2024-06-20", "/echo?b=2&a=1"),
                                  (FIRST, "2025-01-01", "/echo?b=2&a=1"),
                                  (FIRST, None, "/echo?b=2&a=1"),
                                  (FIRST, "2024-06-20", "/echo?b=2&a=2"),
                                  (FIRST.replace(b'"sku": "a"', b'"sku": "b"'), "2024-06-20",
                                   "/echo?b=2&a=1")):
        st, h, b, log = pay(p, key, body, target=target, version=version)
        assert_problem((st, h, b), 422, "idempotency_key_mismatch", "2.2")
    assert upstream.hits("/echo") == 1


def test_amounts_keep_their_digits(proxy, upstream, tmp_path):
    """Integers past 2^53 and decimals no double holds are never rounded
    into one another; 1.0 and 1e0 are 1."""
    p = routed(proxy, tmp_path, ROUTES)
    for first, same, other in ((b'{"a": 9007199254740993}', b'{"a":9007199254740993}',
                                b'{"a": 9007199254740992}'),
                               (b'{"a": 0.1000000000000000055511151231257827}',
                                b'{ "a" : 0.1000000000000000055511151231257827 }', b'{"a": 0.1}'),
                               (b'{"a": 1.0}', b'{"a": 1e0}', b'{"a": 1.01}')):
        key = new_key()
        assert pay(p, key, first)[3]["outcome"] == "executed"
        assert pay(p, key, same)[3]["outcome"] == "replayed"
        assert pay(p, key, other)[0] == 422


def test_a_body_that_is_not_i_json_is_fingerprinted_raw(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, ROUTES)
    for body, respaced in ((b'{"a": 1, "a": 2}', b'{"a":1,"a":2}'),
                           (b'not json at all', b'not  json at all'),
                           (b'{"s": "\\ud800"}', b'{"s":"\\ud800"}')):
        key = new_key()
        st, h, b, log = pay(p, key, body)
        assert log["outcome"] == "executed"
        assert json.loads(b)["body"].encode("latin-1") == body
        assert pay(p, key, body)[3]["outcome"] == "replayed"
        assert pay(p, key, respaced)[0] == 422


def test_raw_routes_keep_the_bytes_and_the_top_level_applies_elsewhere(proxy, upstream, tmp_path):
    p = routed(proxy, tmp_path, ROUTES)
    key = new_key()
    assert pay(p, key, FIRST, host="raw.test")[3]["outcome"] == "executed"
    assert pay(p, key, FIRST.replace(b": ", b":"), host="raw.test")[0] == 422
    # the default route takes the top level's fingerprint: json, no headers,
    # the query as received
    key = new_key()
    assert pay(p, key, FIRST, host="other.test")[3]["outcome"] == "executed"
    st, _, _, log = pay(p, key, FIRST.replace(b": ", b":"), version="other", host="other.test")
    assert log["outcome"] == "replayed"
    assert pay(p, key, FIRST, target="/echo?a=1&b=2", host="other.test")[0] == 422


BROKEN = """
    upstream: http://127.0.0.1:3000
    routes:
      - name: pay
        fingerprint:
          body: yaml
          ignore: [/ok, sent_at]
          headers: ["Stripe Version"]
          query: shuffled
          hash: md5
"""


def test_a_broken_fingerprint_is_said_where_it_is(tmp_path):
    path = write_config(tmp_path, BROKEN, name="broken.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    got = {(ln, col): msg for ln, col, msg in check_lines(r.stderr, path)}
    assert "fingerprint.body: 'yaml' is not raw or json" in got[(5, 13)], got
    assert "fingerprint.ignore: 'sent_at' is not a JSON pointer" in got[(6, 15)], got
    assert "fingerprint.headers: 'Stripe Version' is not a header name" in got[(7, 16)], got
    assert "fingerprint.query: 'shuffled' is not raw or sorted" in got[(8, 14)], got
    assert "fingerprint: unknown key 'hash'" in got[(9, 7)], got


def test_ignoring_the_whole_body_is_refused(tmp_path):
    """"" points at the whole body: every JSON body would fingerprint alike."""
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        fingerprint: {body: json, ignore: [""]}
    """, name="whole.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert b"fingerprint.ignore: '' is not a JSON pointer" in r.stderr, r.stderr


def test_ignore_without_a_json_body_is_refused(tmp_path):
    """A raw body has no members to leave out: the operator is told, rather
    than every retry getting a 422."""
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        routes:
          - name: pay
            fingerprint: {ignore: [/sent_at]}
    """, name="raw-ignore.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert b"route 'pay': fingerprint.ignore needs body: json" in r.stderr, r.stderr
