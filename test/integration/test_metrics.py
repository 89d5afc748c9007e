"""/metrics (Prometheus text format 0.0.4) and the access log
(doc/operations.md, Metrics and access log)."""
import json
import re
import socket
import time

from fixtures.client import assert_problem, hone, metrics_value, new_key
from fixtures.marks import memory_only, redis_only, single_redis_server, store_independent
from fixtures.probes import redis_keys, start_held, start_slow
from fixtures.waiting import wait_for

OUTCOMES = ("passthrough", "executed", "replayed", "in_flight", "mismatch", "missing_key",
            "invalid_key", "too_large", "store_error", "upstream_error", "bad_request",
            "outcome_unknown", "internal_error", "scope_refused", "expired")
TYPES = ("counter", "gauge", "histogram")
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(r"^(%s)(\{(.*)\})? (\S+)$" % NAME)
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"(,|$)')
MEMORY_FAMILIES = ("idemproxy_memory_store_bytes", "idemproxy_memory_store_max_bytes",
                   "idemproxy_memory_store_entries", "idemproxy_memory_store_evictions_total",
                   "idemproxy_memory_store_expired_total")
REDIS_FAMILIES = ("idemproxy_redis_connected", "idemproxy_redis_failovers_total",
                  "idemproxy_redis_redirections_total", "idemproxy_store_unreplicated_total")


def parse_labels(text, line):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        assert m, "bad label set in %r" % line
        assert m.group(1) not in labels, "label repeated in %r" % line
        labels[m.group(1)] = m.group(2)
        pos = m.end()
    return labels


def parse_exposition(text):
    """A strict parser of the text format: returns {family: {"type", "help",
    "samples": [(name, labels, value)]}}; fails on anything it does not know."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families, current = {}, None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert re.fullmatch(NAME, name) and help_text, line
            assert name not in families, "family declared twice: %s" % name
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, _, typ = line[len("# TYPE "):].partition(" ")
            assert name == current and families[name]["type"] is None, \
                "# TYPE must follow the # HELP of its family: %r" % line
            assert typ in TYPES, line
            families[name]["type"] = typ
        else:
            m = SAMPLE.match(line)
            assert m, "not a sample line: %r" % line
            name, labels = m.group(1), parse_labels(m.group(3) or "", line)
            value = float(m.group(4))  # ValueError on a bad number
            fam = families.get(current)
            assert fam and fam["type"], "sample outside a declared family: %r" % line
            if fam["type"] == "histogram":
                assert name in (current + "_bucket", current + "_sum", current + "_count"), line
            else:
                assert name == current, "sample %r in family %s" % (line, current)
            fam["samples"].append((name, labels, value))
    for name, fam in families.items():
        assert fam["type"], "family without # TYPE: %s" % name
        assert fam["samples"], "family without samples: %s" % name
        if fam["type"] == "histogram":
            check_histogram(name, fam["samples"])
        if fam["type"] == "counter" or name == "idemproxy_inflight":
            assert all(v >= 0 for _, _, v in fam["samples"]), name
    return families


def check_histogram(name, samples):
    """Per label set (without le): buckets with increasing le, cumulative
    counts, the last le="+Inf" equal to _count, and a _sum."""
    series = {}
    for sname, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        s = series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if sname.endswith("_bucket"):
            assert "le" in labels, (name, labels)
            s["buckets"].append((float(labels["le"]), labels["le"], value))
        elif sname.endswith("_sum"):
            assert "le" not in labels and s["sum"] is None
            s["sum"] = value
        else:
            assert "le" not in labels and s["count"] is None
            s["count"] = value
    for rest, s in series.items():
        b = s["buckets"]
        assert len(b) >= 2 and b[-1][1] == "+Inf", (name, rest, b)
        for (le0, _, c0), (le1, _, c1) in zip(b, b[1:]):
            assert le0 < le1 and c0 <= c1, "%s%r: buckets not cumulative: %r" % (name, rest, b)
        assert s["count"] is not None and s["sum"] is not None, (name, rest)
        assert b[-1][2] == s["count"], (name, rest, b[-1], s["count"])
        assert s["sum"] >= 0


def requests_by_outcome(fams):
    """The samples of idemproxy_requests_total{route,outcome}: without a
    routes file, the route is always "default"."""
    fam = fams["idemproxy_requests_total"]
    assert fam["type"] == "counter"
    got = {}
    for _, labels, value in fam["samples"]:
        assert list(labels) == ["route", "outcome"], labels
        assert labels["route"] == "default", labels
        assert labels["outcome"] not in got
        got[labels["outcome"]] = value
    assert sorted(got) == sorted(OUTCOMES), "every outcome of README.md, exactly: %r" % got
    return got


def histogram_count(fams, name, **labels):
    for sname, lab, value in fams[name]["samples"]:
        if sname == name + "_count" and lab == labels:
            return value
    raise AssertionError("no %s_count%r" % (name, labels))


def scrape(p):
    st, h, body = p.admin_request("GET", "/metrics")
    assert st == 200
    assert hone(h, "Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    return parse_exposition(body.decode())


def gauge(fams, name):
    fam = fams[name]
    assert len(fam["samples"]) == 1, fam
    return fam["samples"][0][2]


def access_lines(p):
    return [ln for ln in p.stderr().splitlines() if " info access " in ln]


def json_access_lines(p):
    out = []
    for ln in p.stderr().splitlines():
        obj = json.loads(ln)  # every line of a JSON log parses
        if obj.get("msg") == "access":
            out.append(obj)
    return out


# --------------------------------------------------------------------------- /metrics
def test_metrics_count_outcomes(proxy, upstream):
    p = proxy("--require-key")
    key = new_key()
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"y")
    p.request("POST", "/echo", body=b"x")
    p.request("POST", "/echo", [("Idempotency-Key", '"a b"')], b"x")
    p.request("GET", "/echo")
    assert p.raw(b"GET /echo HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n")[0] == 400
    assert p.raw(b"CONNECT t:443 HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 501
    m = p.metrics()

    def count(outcome):
        return metrics_value(m, "idemproxy_requests_total",
                             {"route": "default", "outcome": outcome}) or 0

    assert count("bad_request") == 2
    assert count("executed") == 1
    assert count("replayed") == 1
    assert count("mismatch") == 1
    assert count("missing_key") == 1
    assert count("invalid_key") == 1
    assert count("passthrough") == 1
    # Labels: route (default: no routes file), then outcome, exactly those of
    # README.md (What it does with each request).
    for line in m.splitlines():
        if line.startswith("idemproxy_requests_total{"):
            assert line.startswith('idemproxy_requests_total{route="default",outcome="'), line
            label = line.split('outcome="', 1)[1].split('"', 1)[0]
            assert label in OUTCOMES, line


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


def test_metrics_exposition_after_known_requests(proxy, upstream):
    """The whole exposition parses strictly, and every count follows from a
    known sequence of requests."""
    p = proxy("--require-key", "--max-body", "100", "--max-response", "1K")
    fams = scrape(p)
    assert set(requests_by_outcome(fams).values()) == {0}, "all ten present at 0 at start"
    assert histogram_count(fams, "idemproxy_request_duration_seconds", route="default") == 0
    k1, k2, k3, k4 = new_key(), new_key(), new_key(), new_key()

    def post(key, path="/echo", body=b"x"):
        return p.request("POST", path, [("Idempotency-Key", key)], body)

    assert post(k1)[0] == 201                                            # executed
    assert post(k1)[0] == 201                                            # replayed
    assert_problem(post(k1, body=b"other"), 422, "idempotency_key_mismatch", "2.2")  # mismatch
    held = start_held(p, k2)                                             # executed (later)
    assert_problem(post(k2, "/hold?id=%s" % k2, b"held"), 409, "idempotency_key_in_use", "2.6")
    fams = scrape(p)
    assert gauge(fams, "idemproxy_inflight") == 1, "the held request is being handled"
    upstream.release(k2)
    assert held()[0] == 200
    assert post(k3, "/big?bytes=4096")[0] == 200                          # executed, marker kept
    assert_problem(post(k3, "/big?bytes=4096"), 502, "response_too_large")  # replayed (marker)
    assert_problem(post(k4, body=b"z" * 500), 413, "payload_too_large")     # too_large
    assert p.request("POST", "/echo", body=b"x")[0] == 400                 # missing_key
    assert p.request("POST", "/echo", [("Idempotency-Key", '"a b"')], b"x")[0] == 400  # invalid
    assert p.request("GET", "/echo")[0] == 201                             # passthrough
    kr = new_key()
    assert post(kr, "/reset")[0] == 502                                    # upstream_error
    assert_problem(post(kr, "/reset"), 502, "idempotency_outcome_unknown")  # outcome_unknown
    assert p.request("GET", "/reset")[0] == 502                            # upstream_error
    assert p.raw(b"GET /a%00 HTTP/1.1\r\nHost: t\r\nX: \x01\r\n\r\n")[0] == 400  # bad_request

    fams = scrape(p)
    got = requests_by_outcome(fams)
    assert got == {"passthrough": 1, "executed": 3, "replayed": 2, "in_flight": 1,
                   "mismatch": 1, "missing_key": 1, "invalid_key": 1, "too_large": 1,
                   "store_error": 0, "upstream_error": 2, "bad_request": 1,
                   "outcome_unknown": 1, "internal_error": 0, "scope_refused": 0,
                   "expired": 0}, got
    assert (histogram_count(fams, "idemproxy_request_duration_seconds", route="default")
            == sum(got.values()))
    # Every answer by class: 201 201 200 200 201; 422 409 413 400 400 400; 502 x4.
    classes = {lab["class"]: v for _, lab, v in fams["idemproxy_responses_total"]["samples"]
               if lab["route"] == "default"}
    assert classes == {"2xx": 5, "3xx": 0, "4xx": 6, "5xx": 4}, classes
    assert fams["idemproxy_responses_total"]["type"] == "counter"
    assert gauge(fams, "idemproxy_connections_refused_total") == 0
    # Forwarded: GET /echo, k1, k2, k3, the keyed /reset and GET /reset.
    assert histogram_count(fams, "idemproxy_upstream_duration_seconds", route="default") == 6
    # Acquired or refused by the store: k1 x3, k2 x2, k3 x2, the keyed /reset x2.
    assert histogram_count(fams, "idemproxy_store_duration_seconds", op="acquire") == 9
    assert histogram_count(fams, "idemproxy_store_duration_seconds", op="complete") == 3
    assert histogram_count(fams, "idemproxy_store_duration_seconds", op="release") == 0
    assert histogram_count(fams, "idemproxy_store_duration_seconds", op="unknown") == 1
    # The keyed /reset may have run: its key is unknown, once.
    assert [(lb, v) for n, lb, v in fams["idemproxy_unknown_outcomes_total"]["samples"]
            if v] == [({"route": "default", "cause": "upstream_reset"}, 1.0)]
    assert fams["idemproxy_unknown_outcomes_total"]["type"] == "counter"
    histogram_count(fams, "idemproxy_store_duration_seconds", op="extend")  # present
    # The held request took at least as long as it was held.
    dur = fams["idemproxy_request_duration_seconds"]["samples"]
    assert [v for n, _, v in dur if n.endswith("_sum")][0] > 0
    assert gauge(fams, "idemproxy_inflight") == 0
    assert gauge(fams, "idemproxy_lock_lost_total") == 0
    assert gauge(fams, "idemproxy_store_errors_total") == 0
    info = fams["idemproxy_build_info"]
    assert info["type"] == "gauge" and info["samples"] == [
        ("idemproxy_build_info", {"version": "0.1.0"}, 1.0)]
    for name in MEMORY_FAMILIES:
        assert (name in fams) == (p.store == "memory"), name
    for name in REDIS_FAMILIES:
        assert (name in fams) == (p.store == "redis"), name
    if p.store == "redis":
        assert fams["idemproxy_redis_connected"]["type"] == "gauge"
        assert gauge(fams, "idemproxy_redis_connected") == 1
        assert fams["idemproxy_redis_failovers_total"]["type"] == "counter"
        assert gauge(fams, "idemproxy_redis_failovers_total") == 0  # no failover
        assert fams["idemproxy_redis_redirections_total"]["type"] == "counter"
        unrepl = fams["idemproxy_store_unreplicated_total"]
        assert unrepl["type"] == "counter"
        # one sample per op, all 0: without --redis-wait-replicas nothing waits
        assert sorted((lab["op"], v) for _, lab, v in unrepl["samples"]) == [
            ("acquire", 0), ("complete", 0), ("extend", 0), ("probe", 0), ("release", 0),
            ("resolve", 0), ("unknown", 0)], unrepl
    if p.store == "memory":
        assert gauge(fams, "idemproxy_memory_store_locked_bytes") > 0  # kr, unknown
        assert gauge(fams, "idemproxy_memory_store_max_bytes") == 256 * 1024 * 1024
        assert gauge(fams, "idemproxy_memory_store_entries") == 4  # k1, k2, k3's marker, kr
        assert 0 < gauge(fams, "idemproxy_memory_store_bytes") < 256 * 1024 * 1024
        assert fams["idemproxy_memory_store_evictions_total"]["type"] == "counter"
        assert fams["idemproxy_memory_store_expired_total"]["type"] == "counter"


def test_metrics_request_duration_buckets(proxy, upstream):
    """A request held about 0.3 s lands above le=0.25 and within le=0.5 or 1."""
    p = proxy()
    get = start_slow(p, new_key(), 300)
    assert get()[0] == 200
    fams = scrape(p)
    buckets = {lab["le"]: v for n, lab, v in fams["idemproxy_request_duration_seconds"]["samples"]
               if n.endswith("_bucket")}
    assert buckets["0.25"] == 0 and buckets["1"] == 1 and buckets["+Inf"] == 1, buckets
    up = {lab["le"]: v for n, lab, v in fams["idemproxy_upstream_duration_seconds"]["samples"]
          if n.endswith("_bucket")}
    assert up["0.25"] == 0 and up["1"] == 1, up


@memory_only
def test_metrics_memory_store_evictions(proxy, upstream):
    """The memory store's gauges follow its state: a small budget evicts."""
    p = proxy("--memory-max-bytes", "64K", "--max-response", "16K")
    for _ in range(8):
        assert p.request("POST", "/big?bytes=8000", [("Idempotency-Key", new_key())],
                         b"x")[0] == 200
    fams = scrape(p)
    assert gauge(fams, "idemproxy_memory_store_max_bytes") == 64 * 1024
    assert gauge(fams, "idemproxy_memory_store_evictions_total") >= 1
    assert gauge(fams, "idemproxy_memory_store_bytes") <= 64 * 1024
    assert 1 <= gauge(fams, "idemproxy_memory_store_entries") < 8


@single_redis_server
@redis_only
def test_store_down_metrics_redis(proxy, upstream, rdb, redis_server):
    p = proxy()
    redis_server.stop()
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x"), 503,
                   "store_unavailable")
    m = p.metrics()
    assert metrics_value(m, "idemproxy_requests_total",
                         {"route": "default", "outcome": "store_error"}) >= 1
    assert metrics_value(m, "idemproxy_store_errors_total") >= 1


@single_redis_server
@redis_only
def test_store_error_passthrough_counts_as_store_error_redis(proxy, upstream, rdb, redis_server):
    """A store error answered by passthrough counts as store_error
    (doc/operations.md, Metrics and access log)."""
    p = proxy("--on-store-error", "passthrough")
    redis_server.stop()
    assert p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")[0] == 201
    got = requests_by_outcome(scrape(p))
    assert got["store_error"] == 1 and got["passthrough"] == 0 and got["executed"] == 0, got


@redis_only
def test_metrics_lock_lost_redis_hash_edit(proxy, upstream, rdb):
    """A stale holder (its token replaced in the hash) counts one lock_lost."""
    p = proxy("--lock-ttl", "1")
    key = new_key()
    first = start_slow(p, key, 1500)
    skey = redis_keys(rdb, key)[0]
    own = rdb.hget(skey, "token")
    rdb.hset(skey, "token", b"f" * len(own) if own != b"f" * len(own) else b"e" * len(own))
    rdb.pexpire(skey, 30000)
    assert first()[0] == 200
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_lock_lost_total") == 1, timeout=3,
             what="lock_lost_total == 1")
    time.sleep(0.5)  # a heartbeat and the complete both found it gone: still counted once
    fams = scrape(p)
    assert gauge(fams, "idemproxy_lock_lost_total") == 1
    assert histogram_count(fams, "idemproxy_store_duration_seconds", op="extend") >= 1


# --------------------------------------------------------------------------- access log
@store_independent
def test_access_log_text(proxy, upstream):
    p = proxy()
    key = new_key()
    p.request("POST", "/echo?a=1", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo?a=1", [("Idempotency-Key", key)], b"x")
    p.request("GET", "/status/404")
    wait_for(lambda: len(access_lines(p)) == 3, what="three access lines")
    first, second, third = access_lines(p)
    pat = (r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z info access (\S+) (\S+) (\d{3}) (\w+)"
           r" route=([a-z0-9_-]+)( key=\S+)? upstream_ms=(-|\d+\.\d{3}) total_ms=\d+\.\d{3}"
           r" bytes=(\d+) request_id=[0-9a-f]{32} client=127\.0\.0\.1$")
    m1, m2, m3 = (re.match(pat, ln) for ln in (first, second, third))
    assert m1 and m2 and m3, (first, second, third)
    assert m1.groups()[:6] == ("POST", "/echo?a=1", "201", "executed", "default", " key=" + key)
    assert m1.group(7) != "-" and int(m1.group(8)) > 0
    assert m2.groups()[:6] == ("POST", "/echo?a=1", "201", "replayed", "default", " key=" + key)
    assert m2.group(7) == "-", "a replay does not reach the upstream"
    assert m2.group(8) == m1.group(8), "the replay has the same body"
    assert m3.groups()[:6] == ("GET", "/status/404", "404", "passthrough", "default", None)


@store_independent
def test_access_log_json(proxy, upstream):
    p = proxy("--log-format", "json", "--max-body", "10")
    key = new_key()
    st, _, body = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    p.request("POST", "/echo", [("Idempotency-Key", key)], b"y" * 100)
    p.request("GET", "/echo")
    wait_for(lambda: len(json_access_lines(p)) == 3, what="three access lines")
    a, b, c = json_access_lines(p)
    for obj in (a, b, c):
        assert obj["level"] == "info"
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", obj["time"]), obj
        assert isinstance(obj["total_ms"], (int, float)) and obj["total_ms"] >= 0
        assert isinstance(obj["bytes"], int)
    assert {k: a[k] for k in ("method", "target", "status", "outcome", "route", "key",
                              "bytes")} == {
        "method": "POST", "target": "/echo", "status": 201, "outcome": "executed",
        "route": "default", "key": key, "bytes": len(body)}
    assert a["upstream_ms"] >= 0 and a["total_ms"] >= a["upstream_ms"]
    assert (b["status"], b["outcome"], b["route"], b["key"]) == (413, "too_large", "default", key)
    assert "upstream_ms" not in b, "never forwarded"
    assert (c["method"], c["status"], c["outcome"], c["route"]) == (
        "GET", 201, "passthrough", "default")
    assert "key" not in c


@store_independent
def test_access_log_never_has_credentials(proxy, upstream):
    secret_auth = "Bearer sk_live_%s" % new_key()
    secret_tenant = "tenant-%s" % new_key()
    for fmt in ("text", "json"):
        p = proxy("--scope-header", "X-Tenant", "--scope-header", "Authorization",
                  "--log-format", fmt, "--log-level", "debug")
        key = new_key()
        hdrs = [("Idempotency-Key", key), ("Authorization", secret_auth),
                ("X-Tenant", secret_tenant)]
        p.request("POST", "/echo", hdrs, b"x")
        p.request("POST", "/echo", hdrs, b"x")
        p.request("POST", "/echo", hdrs, b"y")
        p.request("POST", "/reset", hdrs, b"x")
        p.request("GET", "/echo", hdrs[1:])
        wait_for(lambda: len([ln for ln in p.stderr().splitlines() if "access" in ln]) >= 5,
                 what="five access lines")
        err = p.stderr()
        assert key in err, "the key is logged"
        for secret in (secret_auth, secret_tenant, "sk_live_", "tenant-"):
            assert secret not in err, "%s logged in %s:\n%s" % (secret, fmt, err)
        p.stop()


@store_independent
def test_access_log_silenced_at_warn(proxy, upstream):
    p = proxy("--log-level", "warn")
    p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    p.request("GET", "/echo")
    p.request("GET", "/reset")  # logs a warning: the level works, access lines stay out
    wait_for(lambda: "upstream" in p.stderr(), what="the upstream warning")
    assert metrics_value(p.metrics(), "idemproxy_requests_total") == 3
    assert " access " not in p.stderr() and " info " not in p.stderr(), p.stderr()


@store_independent
def test_metrics_of_section_11(proxy, upstream, tmp_path):
    """The route on both histograms, the process's start time, connections
    refused over --max-connections, and the memory store's locked bytes."""
    routes = tmp_path / "routes.yaml"
    routes.write_text("routes:\n  - name: pay\n    match: {path: /echo}\n")
    t0 = time.time()
    p = proxy("--config", str(routes), "--max-connections", "2")
    fams = scrape(p)
    start = gauge(fams, "process_start_time_seconds")
    assert t0 - 10 < start <= time.time(), start
    assert fams["process_start_time_seconds"]["type"] == "gauge"
    assert gauge(fams, "idemproxy_memory_store_locked_bytes") == 0
    key = new_key()
    held = start_held(p, key)
    wait_for(lambda: gauge(scrape(p), "idemproxy_memory_store_locked_bytes") > 0,
             what="the held lock's bytes")
    upstream.release(key)
    assert held()[0] == 200
    wait_for(lambda: gauge(scrape(p), "idemproxy_memory_store_locked_bytes") == 0,
             what="the lock's bytes given back")
    assert p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")[0] == 201
    fams = scrape(p)
    assert histogram_count(fams, "idemproxy_request_duration_seconds", route="pay") == 1
    assert histogram_count(fams, "idemproxy_upstream_duration_seconds", route="pay") == 1
    assert histogram_count(fams, "idemproxy_request_duration_seconds", route="default") == 1
    # Two connections held open: a third is closed at once, and counted.
    conns = [socket.create_connection(("127.0.0.1", p.port), timeout=5) for _ in range(2)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", p.port), timeout=3)
        try:
            extra.recv(100)
        except OSError:
            pass
        extra.close()
    finally:
        for c in conns:
            c.close()
    wait_for(lambda: gauge(scrape(p), "idemproxy_connections_refused_total") == 1,
             what="the refused connection counted")
