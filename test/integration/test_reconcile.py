"""Reconcile (doc/configuration.md, Reconcile; doc/guarantees.md, What a
probe proves): a route's reconcile: block makes the proxy ask the API
whether a request whose answer was lost took effect. Against a payments
API with a lookup by reference (fixtures/payments.py) whose creates commit
then reset, reset before committing, or stall: found completes the key
(replays carry X-Idempotency-Reconciled: true), absent twice releases it
(the retry runs once), a lookup that fails leaves it to the operator after
its attempts; no probe before settle; odd keys percent-encoded; the
credential only from the key's scope; two proxies probing one key at most
once per every; and a fault mix of two proxies, one killed, on one store."""
import json
import random
import time
import urllib.parse

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.load import Load
from fixtures.marks import shared_store, store_independent
from fixtures.payments import PaymentsAPI
from fixtures.proxy import run_binary
from fixtures.routes import write_config
from fixtures.waiting import wait_for

RECONCILED = "X-Idempotency-Reconciled"


def route_file(settle="500ms", every="300ms", attempts=10, scope="scope-header: [Authorization]",
               target="/v1/payments?client_reference={key}", extra=""):
    return """
        routes:
          - name: payments
            match: {path: /v1/payments}
            %s
            reconcile:
              request: {target: "%s", headers: [Authorization]}
              found: {status: [200], json: /data/0}
              absent: {status: [200, 404], json-missing: /data/0}
              answer: {status: 201}
              settle: %s
              every: %s
              attempts: %d
            %s
        """ % (scope, target, settle, every, attempts, extra)


@pytest.fixture
def api():
    a = PaymentsAPI(stall_s=1.5).start()
    yield a
    a.stop()


def start(proxy, api, tmp_path, *extra, **kw):
    path = write_config(tmp_path, route_file(**kw))
    return proxy("--config", str(path), *extra, upstream_url=api.url)


def pay(p, key, auth="Bearer alice", body=b'{"amount": 5}', headers=()):
    return p.request("POST", "/v1/payments",
                     [("Idempotency-Key", key), ("Authorization", auth),
                      ("Content-Type", "application/json")] + list(headers), body)


def reconciles(p, result):
    return metrics_value(p.metrics(), "idemproxy_reconciles_total",
                         {"route": "payments", "result": result}) or 0.0


def unknown_listing(p):
    """Every page of /keys?state=unknown: the records."""
    out, cursor = [], ""
    for _ in range(1000):
        st, _, body = p.admin_request("GET", "/keys?state=unknown" + (
            "&cursor=" + urllib.parse.quote(cursor) if cursor else ""))
        assert st == 200, body
        page = json.loads(body)
        out += page["records"]
        cursor = page["next_cursor"]
        if not cursor:
            return out
    raise AssertionError("the listing never ended")


@pytest.mark.concurrency
def test_found_completes_the_key_and_its_replays_say_reconciled(proxy, api, tmp_path):
    """A create that committed, then lost its answer: after settle (and not
    before) the lookup finds it, and every duplicate gets the payment as a
    replay, marked reconciled; it ran once."""
    p = start(proxy, api, tmp_path, settle="800ms")
    key = new_key()
    api.plan(key, "commit_reset")
    assert_problem(pay(p, key), 502, "upstream_unavailable")
    t_lost = time.monotonic()
    assert_problem(pay(p, key), 502, "idempotency_outcome_unknown")

    def replayed():
        st, h, b = pay(p, key)
        return (st, h, b) if st == 201 else None
    st, h, b = wait_for(replayed, timeout=5, interval=0.1, what="the reconciled replay")
    assert hone(h, REPLAY) == "true" and hone(h, RECONCILED) == "true", h
    assert hone(h, "Content-Type") == "application/json"
    assert json.loads(b) == {"id": "pay_1", "reference": key, "amount": len(b'{"amount": 5}')}
    assert api.commits(key) == 1
    looked = api.lookups_of(key)
    assert looked and looked[0][0] >= t_lost + 0.8 - 0.15, (looked[0][0] - t_lost)
    assert len(looked) == 1, "a found key is probed no more"
    assert reconciles(p, "found") == 1
    assert unknown_listing(p) == []
    assert "reconciled: found" in p.stderr()


@pytest.mark.concurrency
def test_absent_twice_releases_the_key_and_the_retry_runs_once(proxy, api, tmp_path):
    """A create reset before it committed: two absent lookups a second apart
    release the key, and the next retry runs (once)."""
    p = start(proxy, api, tmp_path)
    key = new_key()
    api.plan(key, "reset_first")
    assert_problem(pay(p, key), 502, "upstream_unavailable")
    assert api.commits(key) == 0

    def ran():
        st, h, b = pay(p, key)
        if st == 502:
            assert_problem((st, h, b), 502, "idempotency_outcome_unknown")
            return None
        return st, h, b
    st, h, b = wait_for(ran, timeout=6, interval=0.2, what="the released key to run")
    assert st == 201 and hone(h, REPLAY) == "false" and hone(h, RECONCILED) is None, h
    assert api.commits(key) == 1
    looked = [t for t, _, _ in api.lookups_of(key)]
    assert len(looked) >= 2 and looked[-1] - looked[0] >= 1.0 - 0.15, looked
    assert reconciles(p, "absent") >= 2
    assert pay(p, key)[0] == 201 and api.commits(key) == 1  # replayed now
    assert "absent twice, the key is released" in p.stderr()


@pytest.mark.concurrency
def test_a_key_lost_past_the_late_window_is_probed_with_its_credential(proxy, api, tmp_path):
    """A create that commits, then stays silent past --upstream-timeout (the
    client gets its 504) and the late window: the key becomes unknown once
    its client is long gone, and its probe still carries the request's
    Authorization (kept when the client was answered)."""
    api.require_auth = "Bearer carol"
    p = start(proxy, api, tmp_path, "--upstream-timeout", "0.3", "--upstream-late-timeout",
              "0.5", settle="0s")
    key = new_key()
    api.plan(key, "commit_stall")
    assert_problem(pay(p, key, auth="Bearer carol"), 504, "upstream_timeout")
    p.wait_log("outcome unknown (upstream_timeout)", timeout=5)
    # the maker's own probe, before any duplicate could start one
    wait_for(lambda: api.lookups_of(key), timeout=5, what="the maker's probe")
    assert api.lookups_of(key)[0][2].get("Authorization") == "Bearer carol"
    wait_for(lambda: pay(p, key, auth="Bearer carol")[0] == 201, timeout=5,
             what="the reconciled replay")
    assert api.commits(key) == 1


def test_a_failing_lookup_leaves_the_key_unknown_after_its_attempts(proxy, api, tmp_path):
    """A lookup answering 500 proves nothing: the key stays unknown, probed
    at most attempts times, and /keys says so."""
    api.lookup_mode = "fail"
    p = start(proxy, api, tmp_path, settle="200ms", every="200ms", attempts=3)
    key = new_key()
    api.plan(key, "commit_reset")
    assert_problem(pay(p, key), 502, "upstream_unavailable")
    wait_for(lambda: len(api.lookups_of(key)) >= 3, timeout=5, what="three probes")
    time.sleep(0.8)  # a fourth would come by now
    assert len(api.lookups_of(key)) == 3
    assert_problem(pay(p, key), 502, "idempotency_outcome_unknown")
    (k,) = [k for k in unknown_listing(p) if k["key"] == key]
    assert k["probes"] == 3 and k["last_result"] == "failed", k
    assert reconciles(p, "failed") == 3
    assert "reconcile gave up after 3 probes" in p.stderr()
    # the operator then resolves it, as before
    st, _, b = p.admin_request("DELETE", "/keys/%s?scope=%s" % (key, k["scope"]))
    assert st in (200, 204), b


@store_independent
@pytest.mark.parametrize("key", ["a/b?c=d&e#f", "%2e%2e/x", "x+y~z", "k:{key}"])
def test_odd_keys_are_percent_encoded_in_the_probe(proxy, api, tmp_path, key):
    """The key's bytes are data in the probe's query: '/', '?', '#', '&',
    '%' and '+' are encoded, the path is the one configured."""
    key = key + "-" + new_key()[:8]
    p = start(proxy, api, tmp_path, settle="0s")
    api.plan(key, "commit_reset")
    assert_problem(pay(p, key), 502, "upstream_unavailable")
    wait_for(lambda: api.lookups_of(key), timeout=5, what="the probe")
    target = api.lookups_of(key)[0][1]
    assert target == "/v1/payments?client_reference=" + urllib.parse.quote(key, safe="-._~")
    wait_for(lambda: pay(p, key)[0] == 201, timeout=5, what="the reconciled replay")


@store_independent
def test_a_body_pointer_fills_the_target_or_the_probe_fails(proxy, api, tmp_path):
    """{body:/reference} takes the body's string, encoded; a body without it
    makes the probe failed, never absent."""
    p = start(proxy, api, tmp_path, settle="0s", attempts=2,
              target="/v1/payments?client_reference={body:/reference}")
    ref = "ord/1?x#" + new_key()[:8]
    key = new_key()
    api.plan(ref, "commit_reset")
    body = json.dumps({"reference": ref, "amount": 5}).encode()
    assert_problem(pay(p, key, body=body), 502, "upstream_unavailable")
    wait_for(lambda: pay(p, key, body=body)[0] == 201, timeout=5, what="the reconciled replay")
    assert api.lookups_of(ref)[0][1].endswith(urllib.parse.quote(ref, safe="-._~"))
    other = new_key()
    api.plan(other, "reset_first")
    assert_problem(pay(p, other, body=b'{"amount": 5}'), 502, "upstream_unavailable")
    p.wait_log("cannot probe it: the request body holds no string")
    assert_problem(pay(p, other, body=b'{"amount": 5}'), 502, "idempotency_outcome_unknown")
    assert reconciles(p, "failed") >= 1 and reconciles(p, "absent") == 0


@store_independent
def test_the_credential_reaches_the_probe_only_from_the_keys_scope(proxy, api, tmp_path):
    """Authorization in the key's scope goes with the probe (the lookup
    requires it); listed but outside the scope it is not sent, and then
    only found counts: absent answers leave the key unknown."""
    api.require_auth = "Bearer alice"
    p = start(proxy, api, tmp_path, settle="0s")
    key = new_key()
    api.plan(key, "commit_reset")
    assert_problem(pay(p, key), 502, "upstream_unavailable")
    wait_for(lambda: pay(p, key)[0] == 201, timeout=5, what="the reconciled replay")
    assert api.lookups_of(key)[0][2].get("Authorization") == "Bearer alice"

    api.require_auth = None
    q = start(proxy, api, tmp_path, settle="0s", every="200ms", attempts=8,
              scope="scope-header: [X-Tenant]")
    gone, kept = new_key(), new_key()
    api.plan(gone, "reset_first")
    api.plan(kept, "commit_reset")
    assert_problem(pay(q, gone), 502, "upstream_unavailable")
    assert_problem(pay(q, kept), 502, "upstream_unavailable")
    wait_for(lambda: pay(q, kept)[0] == 201, timeout=5, what="found without the credential")
    wait_for(lambda: len(api.lookups_of(gone)) >= 8, timeout=6, what="every probe")
    assert all("Authorization" not in h for _, _, h in api.lookups_of(gone) + api.lookups_of(kept))
    assert_problem(pay(q, gone), 502, "idempotency_outcome_unknown")
    (k,) = [k for k in unknown_listing(q) if k["key"] == gone]
    assert k["last_result"] == "failed" and k["probes"] == 8, k
    assert "only found counts" in q.stderr()
    assert api.commits(gone) == 0


@shared_store
@pytest.mark.concurrency
def test_two_proxies_probe_one_key_at_most_once_per_every_shared_redis(proxy, api, tmp_path):
    """The proxy that made the key unknown and another answering its
    duplicates both probe; the store lets one probe through per every."""
    api.lookup_mode = "fail"
    a = start(proxy, api, tmp_path, settle="300ms", every="600ms", attempts=5)
    b = start(proxy, api, tmp_path, settle="300ms", every="600ms", attempts=5)
    key = new_key()
    api.plan(key, "commit_reset")
    assert_problem(pay(a, key), 502, "upstream_unavailable")
    deadline = time.monotonic() + 3.6
    while time.monotonic() < deadline:  # duplicates on both: each starts probing
        for p in (a, b):
            assert_problem(pay(p, key), 502, "idempotency_outcome_unknown")
        time.sleep(0.1)
    wait_for(lambda: len(api.lookups_of(key)) >= 5, timeout=4, what="five probes")
    time.sleep(0.7)
    looked = [t for t, _, _ in api.lookups_of(key)]
    assert len(looked) == 5, looked
    gaps = [y - x for x, y in zip(looked, looked[1:])]
    assert min(gaps) >= 0.6 - 0.1, gaps
    assert reconciles(a, "failed") + reconciles(b, "failed") == 5
    # the proxy that made a key unknown dies before settle: the one answering
    # a duplicate probes, and settles it
    api.lookup_mode = "ok"
    other = new_key()
    api.plan(other, "commit_reset")
    assert_problem(pay(a, other), 502, "upstream_unavailable")
    assert a.kill() == -9
    assert_problem(pay(b, other), 502, "idempotency_outcome_unknown")
    wait_for(lambda: pay(b, other)[0] == 201, timeout=5, what="b's probe to settle it")
    assert reconciles(b, "found") == 1 and api.commits(other) == 1


@pytest.mark.parametrize("block, needle", [
    ("{request: {target: v1/payments}, found: {status: 200}}", "does not begin with '/'"),
    ("{request: {target: '/p?r={kee}'}, found: {status: 200}}", "{key} or {body:/pointer}"),
    ("{request: {target: /p}}", "needs found.status"),
    ("{found: {status: 200}}", "needs request.target"),
    ("{request: {target: /p}, found: {status: 200}, setle: 1s}", "did you mean settle"),
    ("{request: {target: /p}, found: {status: 200, json: data}}", "not a JSON pointer"),
    ("{request: {target: /p}, found: {status: 200}, every: soon}", "not a duration"),
    ("{request: {target: /p}, found: {status: 999}}", "not an HTTP status"),
    ("{request: {target: /p}, found: {status: 200}, answer: {status: 404}}", "2xx"),
])
def test_a_reconcile_block_that_is_wrong_is_refused(tmp_path, block, needle):
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:9
        routes:
          - name: payments
            match: {path: /v1/payments}
            reconcile: %s
        """ % block)
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle.encode() in r.stderr, r.stderr


def test_reconcile_refuses_a_body_value_the_fingerprint_ignores(tmp_path):
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:9
        routes:
          - name: payments
            match: {path: /v1/payments}
            fingerprint: {body: json, ignore: [/meta]}
            reconcile: {request: {target: "/p?r={body:/meta/ref}"}, found: {status: 200}}
        """)
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2 and b"fingerprint.ignore leaves out" in r.stderr, r.stderr


def test_reconcile_needs_the_refuse_policy(tmp_path):
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:9
        routes:
          - name: payments
            match: {path: /v1/payments}
            on-unknown-outcome: retry
            reconcile: {request: {target: "/p?r={key}"}, found: {status: 200}}
        """)
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2 and b"reconcile needs on-unknown-outcome: refuse" in r.stderr, r.stderr


# --------------------------------------------------------------------------- the fault mix
FAULT_KEYS = 240
FAULT_DUPLICATES = 4


def fault_plan(i):
    """Key i's first create: most answer, some commit then reset, some reset
    before committing, some commit then stall past every timeout, some stall
    without committing, some commit only after the proxy gave up on them
    (then settle, past that, keeps them from being taken for absent)."""
    kind = i % 20
    return ("ok" if kind < 9 else "commit_reset" if kind < 12 else "reset_first" if kind < 15
            else "commit_stall" if kind < 17 else "stall_first" if kind < 18 else "late_commit")


def retry_round(proxies, keys):
    """Each key once more, to a live proxy; {key: (status, code)}."""
    out = {}
    live = [p for p in proxies if p.proc is not None]
    for n, key in enumerate(keys):
        st, h, b = live[n % len(live)].request(
            "POST", "/v1/payments", [("Idempotency-Key", key)], b"pay", timeout=5)
        code = json.loads(b).get("code") if st >= 400 else None
        out[key] = (st, code)
    return out


@shared_store
@pytest.mark.concurrency
def test_reconcile_fault_mix_shared_redis(proxy, api, tmp_path):
    """Two proxies on one store, 240 keys x 4 duplicates sent to either,
    creates that commit then reset, reset before committing, stall past
    every timeout, or commit after the proxy gave up on them (1.5 s after
    they came, when the proxy's timeouts end at 1 s: settle, 1 s from the
    key becoming unknown, outlasts that), and a proxy SIGKILLed (and
    replaced) mid-load. No payment
    is made twice, and at least 95% of the keys that became unknown are
    settled by probes, without an operator."""
    path = write_config(tmp_path, route_file(settle="1s", every="500ms", attempts=20))
    args = ("--config", str(path), "--lock-ttl", "1", "--upstream-timeout", "0.3",
            "--upstream-late-timeout", "0.7")
    proxies = [proxy(*args, upstream_url=api.url), proxy(*args, upstream_url=api.url)]
    keys = [new_key() for _ in range(FAULT_KEYS)]
    for i, key in enumerate(keys):
        api.plan(key, fault_plan(i))
    rng = random.Random(40)
    work = [(k, "/v1/payments") for k in keys for _ in range(FAULT_DUPLICATES)]
    rng.shuffle(work)
    load = Load(proxies, workers=24, work=work, tries=8, body=b"pay", timeout=2.5, pace_s=0,
                bound_s=60).start()
    time.sleep(1.5)
    assert proxies[1].kill() == -9
    time.sleep(0.5)
    proxies.append(proxy(*args, upstream_url=api.url))
    assert load.join(60)
    time.sleep(2.0)  # stalled creates end; holders' leases run out
    first = retry_round(proxies, keys)  # a lapsed lock becomes unknown here, and is probed
    deadline = time.monotonic() + 20
    while unknown_listing(proxies[0]) and time.monotonic() < deadline:
        time.sleep(0.5)  # probes settle what they can; the rest stays for an operator
    last = retry_round(proxies, keys)

    became = {a.key for a in load.answers
              if a.code in ("idempotency_outcome_unknown", "upstream_unavailable", "upstream_timeout")}
    became |= {k for k, (st, code) in first.items() if code == "idempotency_outcome_unknown"}
    settled = {k for k in became if last[k][0] == 201}
    twice = {k: n for k, n in api.commits().items() if n > 1}
    print("reconcile fault mix (%s): %d keys, %d became unknown, %d settled by probes (%.1f%%), "
          "%d paid twice; probes found %d, absent %d, failed %d"
          % (proxies[0].store, len(keys), len(became), len(settled),
             100.0 * len(settled) / max(1, len(became)), len(twice),
             *(sum(reconciles(q, r) for q in proxies if q.proc is not None)
               for r in ("found", "absent", "failed"))))
    assert twice == {}, list(twice.items())[:5]
    assert len(became) >= 40, "the faults did not bite"
    assert len(settled) >= 0.95 * len(became), sorted(
        (k, last[k]) for k in became - settled)[:10]
    assert all(st == 201 for st, _ in last.values() if st != 502), last
