"""PENDING (issue 4, operability): /metrics. Not collected until /metrics is built."""

from conftest import *  # noqa: F401,F403 (moved as-is from: test_admin.py, test_store_down.py)


def test_metrics_count_outcomes(proxy, upstream):
    p = proxy("--require-key")
    key = new_key()
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"y")
    p.request("POST", "/echo", body=b"x")
    p.request("POST", "/echo", [("Idempotency-Key", '"a b"')], b"x")
    p.request("GET", "/echo")
    m = p.metrics()

    def count(outcome):
        return metrics_value(m, "idemproxy_requests_total", {"outcome": outcome}) or 0

    assert count("executed") == 1
    assert count("replayed") == 1
    assert count("mismatch") == 1
    assert count("missing_key") == 1
    assert count("invalid_key") == 1
    assert count("passthrough") == 1
    # Outcome label values are exactly those of SPEC §1.
    allowed = {"passthrough", "executed", "replayed", "in_flight", "mismatch", "missing_key",
               "invalid_key", "too_large", "store_error", "upstream_error"}
    for line in m.splitlines():
        if line.startswith("idemproxy_requests_total{"):
            label = line.split('outcome="', 1)[1].split('"', 1)[0]
            assert label in allowed, line


def test_store_down_metrics(proxy, upstream, rdb, redis_server):
    p = proxy()
    redis_server.stop()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x"), 503,
                   "store_unavailable")
    m = p.metrics()
    assert metrics_value(m, "idemproxy_requests_total", {"outcome": "store_error"}) >= 1
    assert metrics_value(m, "idemproxy_store_errors_total") >= 1



def test_metrics_endpoint(proxy, upstream):
    p = proxy()
    p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    st, h, body = p.admin_request("GET", "/metrics")
    assert st == 200
    assert (hone(h, "Content-Type") or "").startswith("text/plain")
    text = body.decode()
    for name in ("idemproxy_requests_total", "idemproxy_inflight", "idemproxy_lock_lost_total",
                 "idemproxy_store_errors_total", "idemproxy_request_duration_seconds_bucket",
                 "idemproxy_upstream_duration_seconds_bucket"):
        assert name in text, name
    assert metrics_value(text, "idemproxy_inflight") == 0
