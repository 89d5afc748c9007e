"""The API steers storage (doc/configuration.md, The API steers storage):
the upstream's Idempotency-Storage answer header (--storage-header) says
no-store or ttl=S; it never reaches the client; anything else is ignored and
logged once."""
import json

from fixtures.client import REPLAY, hone, hvalues, new_key

H = "Idempotency-Storage"


def target(*values, name=H):
    return "/answer?" + "&".join("h=%s:%s" % (name, v) for v in values)


def post(p, key, path, body=b"{}"):
    headers = [("Idempotency-Key", key)] if key else []
    return p.request("POST", path, headers, body)


def stored_ttl_ms(p, key):
    st, _, b = p.admin_request("GET", "/keys/" + key)
    assert st == 200, b
    (rec,) = json.loads(b)["records"]
    assert rec["state"] == "completed", rec
    return rec["ttl_ms"]


def test_no_store_releases_the_key(proxy, upstream):
    p = proxy()
    key = new_key()
    for n in (1, 2):
        st, h, _ = post(p, key, target("no-store"))
        assert st == 201 and hone(h, REPLAY) == "false" and hvalues(h, H) == [], h
        assert upstream.hits("/answer") == n  # not kept: the retry runs again
    st, _, b = p.admin_request("GET", "/keys/" + key)
    assert json.loads(b)["records"] == []


def test_ttl_keeps_the_answer_that_long(proxy, upstream):
    p = proxy()
    key = new_key()
    st, h, _ = post(p, key, target("ttl=120"))
    assert st == 201 and hvalues(h, H) == []
    assert 110_000 < stored_ttl_ms(p, key) <= 120_000
    st, h, _ = post(p, key, target("ttl=120"))
    assert hone(h, REPLAY) == "true" and hvalues(h, H) == []  # not stored either
    assert upstream.hits("/answer") == 1


def test_ttl_is_capped_by_max_ttl(proxy, upstream):
    p = proxy("--ttl", "30", "--max-ttl", "60")
    key, huge = new_key(), new_key()
    post(p, key, target("TTL=600"))
    assert 50_000 < stored_ttl_ms(p, key) <= 60_000
    post(p, huge, target("%20ttl=99999999999999999999999%20"))
    assert 50_000 < stored_ttl_ms(p, huge) <= 60_000


def test_anything_else_is_ignored_and_logged_once(proxy, upstream):
    p = proxy("--ttl", "300")
    for value in ("ttl=0", "nostore", "ttl=-5", "ttl=1h"):
        key = new_key()
        st, h, _ = post(p, key, target(value))
        assert st == 201 and hvalues(h, H) == [], (value, h)
        assert 290_000 < stored_ttl_ms(p, key) <= 300_000, value  # as the route says
    two = new_key()
    post(p, two, target("no-store", "no-store"))  # two answers to one question
    assert 290_000 < stored_ttl_ms(p, two) <= 300_000
    log = p.stderr()
    assert log.count("upstream answer header Idempotency-Storage") == 1, log
    assert "'ttl=0' is neither no-store nor ttl=SECONDS" in log


def test_removed_from_passthrough_answers(proxy, upstream):
    p = proxy()
    st, h, _ = post(p, None, target("no-store"))
    assert st == 201 and hvalues(h, H) == [] and hone(h, REPLAY) is None


def test_another_name_or_none(proxy, upstream):
    p = proxy("--storage-header", "X-Keep")
    key = new_key()
    st, h, _ = post(p, key, target("no-store", name="X-Keep") + "&h=%s:no-store" % H)
    assert hvalues(h, "X-Keep") == [] and hvalues(h, H) == ["no-store"]  # an ordinary header
    post(p, key, target("no-store", name="X-Keep") + "&h=%s:no-store" % H)
    assert upstream.hits("/answer") == 2
    p.stop()
    q = proxy("--storage-header", "")
    key = new_key()
    st, h, _ = post(q, key, target("no-store"))
    assert hvalues(h, H) == ["no-store"]
    st, h, _ = post(q, key, target("no-store"))
    assert hone(h, REPLAY) == "true" and hvalues(h, H) == ["no-store"]  # kept, replayed
