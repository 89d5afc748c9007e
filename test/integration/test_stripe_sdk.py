"""The official Stripe Node SDK (npm package `stripe`) through idemproxy, in
front of a fake Stripe-like API (FakeStripe below): with `errors: stripe` on
the route (doc/configuration.md, Error dialects) the SDK raises the proxy's own
answers (409, 422, 502, 504) as errors; with the default problem dialect it
does not, and hands the caller the problem object as if it were a charge (no
`id`): the gap that the stripe dialect closes. And with the SDK's built-in
retries and `wait` on the route, a retry that arrives while the first attempt
still runs is replayed, and the API runs the charge once.

The SDK runs in stripe_client.js (node), installed with npm into the build
tree beside IDEMPROXY_BIN (<build>/npm/stripe-<version>), once: later runs
reuse it. No node, no npm or no registry is a failure, never a skip
(scripts/test installs nodejs and npm).

Two pinned versions, because the SDK changed how it classifies an error
(generateV1Error in the package's cjs/Error.js; it raises only when the JSON
body has an `error` member, cjs/RequestSender.js _jsonResponseHandler):
  20.4.1  the last major that picks the class by the body's error.type:
          idempotency_error -> StripeIdempotencyError whatever the status,
          api_error -> StripeAPIError
  22.6.2  the newest major that runs on Debian 12's nodejs 18 (23 wants
          node >= 20); since 21 the class comes from the status:
          StripeIdempotencyError only for 400 or 404 with type
          idempotency_error, 429 StripeRateLimitError, 401/402/403 their
          own, and any other status (409 and 422 included) StripeAPIError,
          the body's type kept as err.rawType and its code as err.code
That is for /v1 paths; on a /v2 path (sent as JSON) both versions pick
StripeIdempotencyError by error.type idempotency_error (generateV2Error).
"""
import json
import os
import subprocess
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from fixtures.client import metrics_value
from fixtures.marks import store_independent
from fixtures.npm import npm_install
from fixtures.upstream import QuietHandler
from fixtures.waiting import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_JS = os.path.join(HERE, "stripe_client.js")
NODE_TIMEOUT = 60

# version -> what a 409/422 with {"error": {"type": "idempotency_error"}} is raised as
SDK_VERSIONS = {
    "20.4.1": "StripeIdempotencyError",
    "22.6.2": "StripeAPIError",
}


# --------------------------------------------------------------------------- the SDK
def install_stripe(version):
    """Installs stripe@<version> (once) and returns its --prefix directory."""
    return npm_install("stripe", version, "the Stripe SDK test")


@pytest.fixture(scope="session", params=sorted(SDK_VERSIONS), ids=lambda v: "stripe-" + v)
def sdk(request):
    """(version, --prefix dir) of an installed stripe package."""
    return request.param, install_stripe(request.param)


def run_client(sdk, port, control, calls):
    """Runs stripe_client.js with <calls>; returns {call id: result}."""
    version, prefix = sdk
    plan = {"sdk_dir": prefix, "port": port, "control": control, "calls": calls}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
        path = f.name
    try:
        r = subprocess.run(["node", CLIENT_JS, path], capture_output=True, text=True,
                           timeout=NODE_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("stripe_client.js did not finish in %d s" % NODE_TIMEOUT)
    finally:
        os.unlink(path)
    assert r.returncode == 0, "stripe_client.js failed (%d):\n%s\n%s" % (r.returncode, r.stdout,
                                                                       r.stderr)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["sdk_version"] == version, out
    return out["results"]


# --------------------------------------------------------------------------- the fake API
class _StripeHandler(QuietHandler):
    def _send(self, status, obj, extra=()):
        body = json.dumps(obj).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        split = urlsplit(self.path)
        if split.path == "/_test/received":
            key = parse_qs(split.query).get("key", [""])[0]
            self._send(200, {"count": self.server.received(key)})
        else:
            self._send(404, {"error": {"type": "invalid_request_error",
                                       "message": "Unrecognized request URL"}})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0") or "0")
        body = self.rfile.read(n) if n > 0 else b""
        if urlsplit(self.path).path == "/v2/billing/meter_events":
            self._meter_event(body)
            return
        if urlsplit(self.path).path != "/v1/charges":
            self._send(404, {"error": {"type": "invalid_request_error",
                                       "message": "Unrecognized request URL"}})
            return
        params = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        seq = self.server.record(self.headers.get("Idempotency-Key"), body)
        sleep_ms = int(params.get("metadata[sleep_ms]", "0"))
        if sleep_ms:
            time.sleep(sleep_ms / 1000.0)
        self._send(200, {"id": "ch_%06d" % seq, "object": "charge",
                         "amount": int(params.get("amount", "0")),
                         "currency": params.get("currency"), "livemode": False},
                   extra=[("Request-Id", "req_%06d" % seq)])

    def _meter_event(self, body):
        """A v2 API: the body is JSON, and so is the answer, a meter event
        as Stripe writes it (no id; the identifier names it)."""
        try:
            params = json.loads(body)
            payload = params["payload"]
            name = params["event_name"]
        except (ValueError, KeyError, TypeError):
            self._send(400, {"error": {"type": "invalid_request_error", "code": "invalid_fields",
                                       "message": "event_name and payload are required"}})
            return
        seq = self.server.record(self.headers.get("Idempotency-Key"), body)
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        self._send(200, {"object": "v2.billing.meter_event", "created": now,
                         "event_name": name,
                         "identifier": params.get("identifier") or "mev_%06d" % seq,
                         "livemode": False, "payload": payload,
                         "timestamp": params.get("timestamp") or now},
                   extra=[("Request-Id", "req_%06d" % seq)])


class FakeStripe(ThreadingHTTPServer):
    """POST /v1/charges (form-encoded, as the SDK sends it): 200 with a charge
    {"id": "ch_<seq>", ...}, after sleeping metadata[sleep_ms]. POST
    /v2/billing/meter_events (JSON, as the SDK sends every /v2 path): 200 with
    the meter event {"object": "v2.billing.meter_event", "identifier":
    "mev_<seq>", ...}. GET
    /_test/received?key=K: how many requests (charges and meter events)
    arrived with Idempotency-Key K (counted on arrival, before the sleep)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _StripeHandler)
        self._lock = threading.Lock()
        self.charges = []  # (idempotency key, body), in order of arrival
        self._thread = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def handle_error(self, request, client_address):  # quiet
        pass

    def record(self, key, body):
        with self._lock:
            self.charges.append((key, body))
            return len(self.charges)

    def received(self, key):
        with self._lock:
            return sum(1 for k, _ in self.charges if k == key)

    def keys(self):
        with self._lock:
            return [k for k, _ in self.charges]

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.shutdown()
        self._thread.join(5)
        self.server_close()


@pytest.fixture
def fake_stripe():
    srv = FakeStripe().start()
    yield srv
    srv.stop()


# --------------------------------------------------------------------------- helpers
def write_config(tmp_path, name, errors=None, wait=None):
    """A file with one route for POST /v1/charges."""
    lines = ["routes:", "  - name: charges", "    match: {methods: [POST], path: /v1/charges}"]
    if errors:
        lines.append("    errors: %s" % errors)
    if wait:
        lines.append("    wait: %s" % wait)
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def three_proxies(proxy, tmp_path, fake, errors):
    """The proxy in front of the fake API, one whose upstream is a closed port
    (502), and one whose --upstream-timeout is 0.5 s (504), all with the route."""
    cfg = write_config(tmp_path, "charges-%s.yaml" % (errors or "problem"), errors=errors)
    ok = proxy("--config", cfg, upstream_url=fake.url)
    down = proxy("--config", cfg, upstream_url="http://127.0.0.1:%d" % free_port())
    slow = proxy("--config", cfg, "--upstream-timeout", "0.5", upstream_url=fake.url)
    return ok, down, slow


def the_four_calls(ok, down, slow, suffix):
    """A key reused with another payload, a concurrent duplicate, an
    unreachable upstream and an upstream timeout, as stripe_client.js calls."""
    km, kc, ku, kt = ("%s-%s" % (n, suffix) for n in ("mismatch", "concurrent", "down", "slow"))
    calls = [
        {"id": "m1", "key": km, "params": {"amount": 100, "currency": "usd"}},
        {"id": "m2", "key": km, "after": "m1", "params": {"amount": 200, "currency": "usd"}},
        {"id": "c1", "key": kc,
         "params": {"amount": 300, "currency": "usd", "metadata": {"sleep_ms": 2000}}},
        {"id": "c2", "key": kc, "after_received": kc,
         "params": {"amount": 300, "currency": "usd", "metadata": {"sleep_ms": 2000}}},
        {"id": "u1", "key": ku, "port": down.port, "params": {"amount": 400, "currency": "usd"}},
        {"id": "t1", "key": kt, "port": slow.port,
         "params": {"amount": 500, "currency": "usd", "metadata": {"sleep_ms": 3000}}},
    ]
    return calls, (km, kc, ku, kt)


def assert_charge(res, amount):
    assert res["raised"] is False, res
    assert res["status"] == 200, res
    assert res["id_is_undefined"] is False and res["body"]["id"].startswith("ch_"), res
    assert res["body"]["amount"] == amount, res
    assert res["replayed"] == "false", res


def suffix_of():
    return "%d-%d" % (os.getpid(), time.monotonic_ns())


# --------------------------------------------------------------------------- tests
@store_independent
def test_stripe_sdk_raises_the_stripe_dialect(proxy, sdk, fake_stripe, tmp_path):
    version, _ = sdk
    ok, down, slow = three_proxies(proxy, tmp_path, fake_stripe, "stripe")
    calls, (km, kc, ku, kt) = the_four_calls(ok, down, slow, suffix_of())
    res = run_client(sdk, ok.port, fake_stripe.url, calls)

    assert_charge(res["m1"], 100)
    assert_charge(res["c1"], 300)
    key_class = SDK_VERSIONS[version]
    # A key reused with another payload: 422 idempotency_key_mismatch, raised.
    m2 = res["m2"]
    assert m2["raised"] is True, m2
    assert m2["is_stripe_error"] is True, m2
    assert m2["type"] == key_class and m2["class"] == key_class, m2
    assert m2["is_idempotency_error"] is (key_class == "StripeIdempotencyError"), m2
    assert m2["raw_type"] == "idempotency_error", m2
    assert m2["status"] == 422 and m2["code"] == "idempotency_key_mismatch", m2
    assert m2["message"], m2
    assert m2["content_type"] == "application/json", m2
    # A concurrent duplicate: 409 idempotency_key_in_use at once (no retries), raised.
    c2 = res["c2"]
    assert c2["raised"] is True, c2
    assert c2["type"] == key_class and c2["class"] == key_class, c2
    assert c2["raw_type"] == "idempotency_error", c2
    assert c2["status"] == 409 and c2["code"] == "idempotency_key_in_use", c2
    assert c2["retry_after"] == "1", c2
    assert c2["elapsed_ms"] < 1500, c2  # not held until the first one ended (2 s)
    # The proxy's own 502 and 504: api_error, raised as StripeAPIError by every version.
    for rid, status, code in (("u1", 502, "upstream_unavailable"), ("t1", 504, "upstream_timeout")):
        r = res[rid]
        assert r["raised"] is True, (rid, r)
        assert r["type"] == "StripeAPIError" and r["is_api_error"] is True, (rid, r)
        assert r["raw_type"] == "api_error", (rid, r)
        assert r["status"] == status and r["code"] == code, (rid, r)

    # The API ran each charge once; the 502 never reached it.
    assert fake_stripe.received(km) == 1
    assert fake_stripe.received(kc) == 1
    assert fake_stripe.received(ku) == 0
    assert fake_stripe.received(kt) == 1
    m = ok.metrics()
    assert metrics_value(m, "idemproxy_requests_total", {"route": "charges",
                                                         "outcome": "mismatch"}) == 1
    assert metrics_value(m, "idemproxy_requests_total", {"route": "charges",
                                                         "outcome": "in_flight"}) == 1


@store_independent
def test_stripe_sdk_does_not_raise_the_problem_dialect(proxy, sdk, fake_stripe, tmp_path):
    """Without `errors: stripe` the SDK finds no `error` member in the body and
    resolves every one of the proxy's problems as a charge: a charge without
    an id, whose status and code only lastResponse and the body tell."""
    ok, down, slow = three_proxies(proxy, tmp_path, fake_stripe, None)
    calls, (km, kc, ku, kt) = the_four_calls(ok, down, slow, suffix_of())
    res = run_client(sdk, ok.port, fake_stripe.url, calls)

    assert_charge(res["m1"], 100)
    assert_charge(res["c1"], 300)
    for rid, status, code in (("m2", 422, "idempotency_key_mismatch"),
                              ("c2", 409, "idempotency_key_in_use"),
                              ("u1", 502, "upstream_unavailable"),
                              ("t1", 504, "upstream_timeout")):
        r = res[rid]
        assert r["raised"] is False, (rid, r)
        assert r["id_is_undefined"] is True, (rid, r)
        assert r["status"] == status, (rid, r)
        assert r["content_type"] == "application/problem+json", (rid, r)
        body = r["body"]
        assert body["code"] == code and body["status"] == status, (rid, r)
        assert "error" not in body and "object" not in body, (rid, r)
    assert fake_stripe.received(km) == 1
    assert fake_stripe.received(kc) == 1
    assert fake_stripe.received(ku) == 0
    assert fake_stripe.received(kt) == 1


@store_independent
def test_stripe_sdk_retry_while_first_runs_is_replayed_with_wait(proxy, sdk, fake_stripe,
                                                                 tmp_path):
    """maxNetworkRetries 2 and a client timeout of 2 s, the charge takes 3.5 s:
    the SDK gives up on its first attempt at 2 s and retries with the same
    (its own) Idempotency-Key 0.5 s later, while the first still runs; `wait:
    5` holds the retry until the first ends, and it gets the replay."""
    cfg = write_config(tmp_path, "charges-wait.yaml", errors="stripe", wait=5)
    p = proxy("--config", cfg, upstream_url=fake_stripe.url)
    calls = [{"id": "r", "key": None, "max_retries": 2, "timeout_ms": 2000,
              "params": {"amount": 700, "currency": "usd", "metadata": {"sleep_ms": 3500}}}]
    t0 = time.monotonic()
    res = run_client(sdk, p.port, fake_stripe.url, calls)["r"]
    elapsed = time.monotonic() - t0

    keys = fake_stripe.keys()
    assert len(keys) == 1, "the API ran the charge %d times: %r" % (len(keys), keys)
    assert keys[0].startswith("stripe-node-retry-"), keys  # the SDK's own key
    assert res["raised"] is False, res
    assert res["status"] == 200 and res["body"]["id"] == "ch_000001", res
    assert res["body"]["amount"] == 700, res
    assert res["replayed"] == "true", res
    assert 3.0 < elapsed < 20, elapsed
    m = p.metrics()
    assert metrics_value(m, "idemproxy_requests_total", {"route": "charges",
                                                         "outcome": "executed"}) == 1
    assert metrics_value(m, "idemproxy_requests_total", {"route": "charges",
                                                         "outcome": "replayed"}) == 1
    assert not metrics_value(m, "idemproxy_requests_total", {"outcome": "in_flight"})


REORDERED_ROUTES = """routes:
  - name: meter-events
    match: {methods: [POST], path: /v2/billing/meter_events}
    errors: stripe
    fingerprint: {body: json}
  - name: charges
    match: {methods: [POST], path: /v1/charges}
    errors: stripe
    fingerprint: {body: json}
"""


@store_independent
def test_stripe_sdk_retry_with_reordered_params_is_replayed_on_a_json_route(proxy, sdk,
                                                                            fake_stripe,
                                                                            tmp_path):
    """An application that rebuilds its params object on a retry may put its
    members in another order, and the SDK writes them in that order. On a /v2
    path the SDK sends JSON, and `fingerprint: {body: json}` (doc/
    configuration.md, Fingerprint) makes the retry a replay; another value is
    still a 422, raised as StripeIdempotencyError by both versions (a /v2
    answer's class comes from its error.type). A /v1 path is form-encoded,
    not JSON: the body is fingerprinted as its bytes, and the reordered retry
    is a 422 there."""
    version, _ = sdk
    cfg = tmp_path / "reordered.yaml"
    cfg.write_text(REORDERED_ROUTES)
    p = proxy("--config", str(cfg), upstream_url=fake_stripe.url)
    suffix = suffix_of()
    ke, ko, kc = ("%s-%s" % (n, suffix) for n in ("event", "order", "charge"))
    meter = "v2.billing.meterEvents"
    first = {"event_name": "api_calls", "payload": {"stripe_customer_id": "cus_1", "value": "25"}}
    rebuilt = {"payload": {"value": "25", "stripe_customer_id": "cus_1"},
               "event_name": "api_calls"}
    other = {"event_name": "api_calls", "payload": {"stripe_customer_id": "cus_1", "value": "26"}}
    calls = [
        {"id": "e1", "key": ke, "resource": meter, "params": first},
        {"id": "e2", "key": ke, "resource": meter, "after": "e1", "params": rebuilt},
        {"id": "e3", "key": ke, "resource": meter, "after": "e2", "params": other},
        # the rebuilt params under a key of their own: what the SDK writes for them
        {"id": "o1", "key": ko, "resource": meter, "params": rebuilt},
        {"id": "c1", "key": kc, "params": {"amount": 100, "currency": "usd"}},
        {"id": "c2", "key": kc, "after": "c1", "params": {"currency": "usd", "amount": 100}},
    ]
    res = run_client(sdk, p.port, fake_stripe.url, calls)

    bodies = {k: [b for key, b in fake_stripe.charges if key == k] for k in (ke, ko, kc)}
    # The SDK writes JSON in the params' own order: the two orders are other bytes.
    assert bodies[ke] == [b'{"event_name":"api_calls","payload":'
                          b'{"stripe_customer_id":"cus_1","value":"25"}}'], bodies
    assert bodies[ko] == [b'{"payload":{"value":"25","stripe_customer_id":"cus_1"},'
                          b'"event_name":"api_calls"}'], bodies
    e1, e2, e3 = res["e1"], res["e2"], res["e3"]
    for r in (e1, e2):
        assert r["raised"] is False and r["status"] == 200, r
        assert r["body"]["object"] == "v2.billing.meter_event", r
        assert r["body"]["payload"]["value"] == "25", r
    assert e1["replayed"] == "false", e1
    assert e2["replayed"] == "true", e2
    assert e2["body"] == e1["body"], (e1, e2)  # the first answer, identifier and all
    # Another value under the key: 422, the API not called again.
    assert e3["raised"] is True, e3
    assert e3["class"] == "StripeIdempotencyError" and e3["is_idempotency_error"] is True, e3
    assert e3["raw_type"] == "idempotency_error", e3
    assert e3["status"] == 422 and e3["code"] == "idempotency_key_mismatch", e3
    assert fake_stripe.received(ke) == 1

    # /v1 is form-encoded: amount=100&currency=usd, then currency=usd&amount=100, a 422.
    assert bodies[kc] == [b"amount=100&currency=usd"], bodies
    assert_charge(res["c1"], 100)
    c2 = res["c2"]
    assert c2["raised"] is True and c2["class"] == SDK_VERSIONS[version], c2
    assert c2["status"] == 422 and c2["code"] == "idempotency_key_mismatch", c2

    m = p.metrics()
    for route, outcome, n in (("meter-events", "executed", 2), ("meter-events", "replayed", 1),
                              ("meter-events", "mismatch", 1), ("charges", "executed", 1),
                              ("charges", "mismatch", 1)):
        got = metrics_value(m, "idemproxy_requests_total", {"route": route, "outcome": outcome})
        assert got == n, (route, outcome, got)
