"""Key inspection and purge on the admin listener (issue 4): GET /keys/<key>
lists every stored record of a key across scopes, DELETE /keys/<key>?scope=
removes one so the request can run again. On both stores."""
import base64
import json
import urllib.parse

from fixtures.client import REPLAY, hone, keyed, new_key
from fixtures.probes import assert_completed, assert_free, assert_locked, redis_keys, start_held


def admin(p, method, key, query=""):
    path = "/keys/" + urllib.parse.quote(key, safe="") + query
    st, h, body = p.admin_request(method, path)
    # answers are JSON, errors problem+json (doc/operations.md, The admin listener)
    want = "application/json" if st < 400 else "application/problem+json"
    assert (hone(h, "Content-Type") or "").split(";")[0] == want, (st, h)
    return st, json.loads(body)


def test_keys_lists_every_scope_without_bodies(proxy, upstream):
    p = proxy()
    key = new_key()
    for who in ("alice", "bob"):
        st, _, _ = p.request("POST", "/echo", [("Idempotency-Key", key),
                                               ("Authorization", "Bearer " + who)], who.encode())
        assert st == 201
    st, out = admin(p, "GET", key)
    assert st == 200 and out["key"] == key
    recs = out["records"]
    assert len(recs) == 2
    assert len({r["scope"] for r in recs}) == 2
    for r in recs:
        assert r["state"] == "completed" and r["status"] == 201 and r["too_large"] is False
        assert len(r["scope"]) == 32 and all(c in "0123456789abcdef" for c in r["scope"])
        assert r["store_key"] == "idem:%s:%s" % (r["scope"], key)
        assert len(r["fingerprint"]) == 64
        assert 0 <= r["age_ms"] < 60000
        assert 86000 * 1000 < r["ttl_ms"] <= 86400 * 1000
        assert "body_base64" not in r and "headers" not in r
    # No credential in what an operator sees.
    assert "alice" not in json.dumps(out) and "Bearer" not in json.dumps(out)
    # Another key is not listed, nor is an unknown one.
    st, out = admin(p, "GET", new_key())
    assert st == 200 and out["records"] == []


def test_keys_body_only_when_asked(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, body = p.request(*keyed(key, body=b"pay me"))
    assert st == 201
    st, out = admin(p, "GET", key, "?body=1")
    assert st == 200 and len(out["records"]) == 1
    r = out["records"][0]
    assert base64.b64decode(r["body_base64"]) == body
    names = [n.lower() for n, _ in r["headers"]]
    assert "x-seq" in names and "date" in names


def test_keys_shows_a_lock_in_flight(proxy, upstream):
    p = proxy()
    key = new_key()
    first = start_held(p, key)
    st, out = admin(p, "GET", key)
    assert st == 200 and len(out["records"]) == 1
    r = out["records"][0]
    assert r["state"] == "locked" and "status" not in r
    assert 0 < r["lease_ms"] <= 30000
    assert 86400 * 1000 < r["ttl_ms"] <= (86400 + 30) * 1000  # the lease, then --ttl
    upstream.release(key)
    assert first()[0] == 200


def test_keys_delete_lets_the_request_run_again(proxy, upstream):
    p = proxy()
    key = new_key()
    req = keyed(key, body=b"stuck")
    st, _, body = p.request(*req)
    assert st == 201
    assert_completed(p, key, req, body=body)
    st, out = admin(p, "GET", key)
    scope = out["records"][0]["scope"]
    st, out = admin(p, "DELETE", key, "?scope=" + scope)
    assert st == 200 and out["deleted"] == "idem:%s:%s" % (scope, key)
    if p.store == "redis":
        assert redis_keys(p.rdb, key) == []
    # Gone: a second delete is 404, and the request runs again.
    st, out = admin(p, "DELETE", key, "?scope=" + scope)
    assert st == 404 and out["code"] == "not_found", out
    assert_free(p, key, req)


def test_keys_delete_a_stuck_lock(proxy, upstream):
    p = proxy()
    key = new_key()
    first = start_held(p, key)
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    assert_locked(p, key, req)
    scope = admin(p, "GET", key)[1]["records"][0]["scope"]
    assert admin(p, "DELETE", key, "?scope=" + scope)[0] == 200
    # The operator freed the key: a retry is no longer refused with 409.
    assert admin(p, "GET", key)[1]["records"] == []
    upstream.release(key)
    st, h, _ = first()
    assert st == 200 and hone(h, REPLAY) == "false"


def test_keys_glob_characters_match_only_themselves(proxy, upstream):
    """Redis SCAN MATCH is a glob: a key with * ? [ ] \\ must list only itself."""
    p = proxy()
    base = new_key()
    keys = [base + "*", base + "?x", base + "[ab]", base + "\\z", base + "ab", base + "a", base]
    for k in keys:  # as sf-strings: a bare key may not hold a backslash
        sf = '"%s"' % k.replace("\\", "\\\\").replace('"', '\\"')
        assert p.request("POST", "/echo", [("Idempotency-Key", sf)], b"x")[0] == 201, k
    for k in keys:
        st, out = admin(p, "GET", k)
        assert st == 200
        assert [r["store_key"].split(":", 2)[2] for r in out["records"]] == [k], (k, out)


def test_keys_key_prefix_option(proxy, upstream):
    p = proxy("--key-prefix", "other:")
    key = new_key()
    assert p.request(*keyed(key))[0] == 201
    st, out = admin(p, "GET", key)
    assert st == 200 and len(out["records"]) == 1
    assert out["records"][0]["store_key"].startswith("other:")


def test_keys_bad_requests(proxy, upstream):
    p = proxy()
    key = new_key()
    assert admin(p, "DELETE", key)[0] == 400  # no scope
    assert admin(p, "DELETE", key, "?scope=xyz")[0] == 400
    # not a key: a space that does not join two parts of a composite key, a
    # part over 255 bytes, a control byte
    for bad in (" a", "a ", "a  b", "x" * 256, "a " + "x" * 256, "a\tb", "a\x7fb"):
        assert admin(p, "GET", bad)[0] == 400, bad
    # a composite key's parts joined by one space: a key /keys may look up
    st, body = admin(p, "GET", "a b")
    assert st == 200 and body["records"] == [], body
    st, h, _ = p.admin_request("POST", "/keys/" + key)
    assert st == 405
    # The admin paths are not served on the main listener: it proxies them.
    before = upstream.hits()
    p.request("GET", "/keys/" + key)
    assert upstream.hits() == before + 1
