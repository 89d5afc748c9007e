"""Resource links (doc/configuration.md, Resource links): a route's
`resource` takes the id of what a completed 2xx answer created (a header
such as Location, or a JSON pointer into its body); GET /keys?resource=ID
finds the key; a 422 names the resource; the link lives as long as the
record. Redis keeps it as a second key <prefix>r:<scope>:<resource>,
PostgreSQL in an indexed column, the memory store in an index."""
import json
import textwrap
import urllib.parse

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import redis_only
from fixtures.probes import redis_keys
from fixtures.proxy import run_binary
from fixtures.waiting import wait_for

ROUTES = """
routes:
  - name: payments
    match: {path: /answer}
    resource: {header: Location}
  - name: orders
    match: {path: /answer/orders}
    resource: {json: /id}
    errors: stripe
  - name: short
    match: {path: /answer/short}
    resource: {json: /data/0/id}
    ttl: 1
"""


def start(proxy, tmp_path, *extra):
    path = tmp_path / "routes.yaml"
    path.write_text(textwrap.dedent(ROUTES).lstrip("\n"))
    return proxy("--config", str(path), *extra)


def find(p, resource, query=""):
    st, _, b = p.admin_request(
        "GET", "/keys?resource=%s%s" % (urllib.parse.quote(resource, safe=""), query))
    assert st == 200, b
    doc = json.loads(b)
    assert doc["resource"] == resource
    return doc["records"]


def post(p, key, path, body=b"{}"):
    return p.request("POST", path, [("Idempotency-Key", key)], body)


def test_link_from_location_is_found(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path)
    key = new_key()
    st, h, _ = post(p, key, "/answer?h=Location:/v1/payments/pay_123")
    assert st == 201 and hone(h, "Location") == "/v1/payments/pay_123"
    (rec,) = find(p, "/v1/payments/pay_123")
    assert rec["key"] == key and rec["state"] == "completed" and rec["status"] == 201
    assert rec["resource"] == "/v1/payments/pay_123"
    st, _, b = p.admin_request("GET", "/keys/" + key)
    assert json.loads(b)["records"][0]["resource"] == "/v1/payments/pay_123"
    assert find(p, "/v1/payments/pay_124") == []
    assert find(p, "/v1/payments/pay_123", "&scope=" + "0" * 32) == []
    assert len(find(p, "/v1/payments/pay_123", "&scope=" + rec["scope"])) == 1


def test_link_from_json_body(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path)
    a, b = new_key(), new_key()
    post(p, a, "/answer/orders", b'{"id": "ord_7", "amount": 5}')
    post(p, b, "/answer/orders", b'{"id": 9007199254740993}')
    assert [r["key"] for r in find(p, "ord_7")] == [a]
    assert [r["key"] for r in find(p, "9007199254740993")] == [b]
    # the same resource from two scopes: both found
    c = new_key()
    p.request("POST", "/answer/orders", [("Idempotency-Key", c), ("Authorization", "Bearer other")],
              b'{"id": "ord_7"}')
    assert sorted(r["key"] for r in find(p, "ord_7")) == sorted([a, c])


def test_mismatch_names_the_resource(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path)
    key = new_key()
    post(p, key, "/answer?h=Location:/v1/payments/pay_9")
    resp = post(p, key, "/answer?h=Location:/v1/payments/pay_9", b'{"other": 1}')
    doc = assert_problem(resp, 422, "idempotency_key_mismatch", "2.2")
    assert doc["resource"] == "/v1/payments/pay_9"
    order = new_key()
    post(p, order, "/answer/orders", b'{"id": "ord_8"}')
    st, _, b = post(p, order, "/answer/orders", b'{"id": "ord_other"}')
    assert st == 422 and json.loads(b)["error"]["resource"] == "ord_8"  # stripe dialect
    plain = new_key()  # no resource: no member
    post(p, plain, "/echo")
    st, _, b = post(p, plain, "/echo", b"changed")
    assert st == 422 and "resource" not in json.loads(b)


def test_no_link_without_a_sane_2xx_value(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path)
    cases = [
        ("/answer?status=400&h=Location:/v1/payments/bad_400", "/v1/payments/bad_400"),
        ("/answer?h=Location:/a&h=Location:/b", "/a"),  # two: which one?
        ("/answer?h=Location:" + "x" * 256, "x" * 256),
    ]
    for path, resource in cases:
        key = new_key()
        st, h, _ = post(p, key, path)
        assert st in (201, 400) and hone(h, REPLAY) == "false"
        st, h, _ = post(p, key, path)
        assert hone(h, REPLAY) == "true"  # stored all the same
        if len(resource) <= 255:
            assert find(p, resource) == []
    key = new_key()
    post(p, key, "/answer/orders", b'{"id": {"nested": 1}}')
    post(p, key, "/answer/orders", b'not json')
    st, _, b = p.admin_request("GET", "/keys?resource=" + "y" * 256)
    assert st == 400
    st, _, b = p.admin_request("GET", "/keys?resource=a%20b")
    assert st == 400


def test_link_expires_with_its_record(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path)
    key = new_key()
    post(p, key, "/answer/short", b'{"data": [{"id": "evt_1"}]}')
    assert [r["key"] for r in find(p, "evt_1")] == [key]
    wait_for(lambda: find(p, "evt_1") == [], timeout=5, what="the link to expire")
    if p.store == "redis":
        assert p.rdb.keys("idem:r:*evt_1") == []


@redis_only
def test_redis_link_is_a_second_key(proxy, upstream, tmp_path):
    p = start(proxy, tmp_path, "--ttl", "600")
    key = new_key()
    post(p, key, "/answer?h=Location:/v1/payments/pay_r")
    (store_key,) = redis_keys(p.rdb, key)
    scope = store_key[len("idem:"):len("idem:") + 32]
    link = "idem:r:%s:/v1/payments/pay_r" % scope
    assert p.rdb.get(link) == store_key.encode()
    assert 590_000 < p.rdb.pttl(link) <= 600_000
    assert p.rdb.hget(store_key, "resource") == b"/v1/payments/pay_r"
    # a link whose record is gone finds nothing; one that leads elsewhere is not followed
    p.rdb.delete(store_key)
    assert find(p, "/v1/payments/pay_r") == []
    other = new_key()
    post(p, other, "/answer?h=Location:/v1/payments/pay_s")
    p.rdb.set(link, "idem:%s:%s" % ("f" * 32, other))  # another scope: refused
    assert find(p, "/v1/payments/pay_r") == []


def test_resource_config_errors(tmp_path):
    for text, says in [
        ("resource: {header: 'a b'}", "resource.header: 'a b' is not a header name"),
        ("resource: {json: id}", "resource.json: 'id' is not a JSON pointer"),
        ("resource: {header: Location, json: /id}", "resource: give one source"),
        ("resource: {query: id}", "resource: unknown key 'query'"),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text("upstream: http://127.0.0.1:1\nroutes:\n  - name: r\n    match: "
                        "{path: /x}\n    %s\n" % text)
        r = run_binary(["--check-config", "--config", str(path)])
        assert r.returncode == 2 and says in r.stderr.decode(), (text, r.stderr)


def test_sealed_answers_keep_their_links(proxy, upstream, tmp_path):
    keys = tmp_path / "store-keys"
    keys.write_text("k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n")
    keys.chmod(0o600)
    p = start(proxy, tmp_path, "--store-encryption-key-file", str(keys))
    key = new_key()
    post(p, key, "/answer/orders", b'{"id": "ord_sealed"}')
    (rec,) = find(p, "ord_sealed")
    assert rec["key"] == key and rec["key_id"] == "k1" and rec["status"] == 201
    st, _, b = post(p, key, "/answer/orders", b'{"id": "ord_x"}')
    assert st == 422 and json.loads(b)["error"]["resource"] == "ord_sealed"
