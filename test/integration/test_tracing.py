"""Traces (doc/operations.md, Tracing): spans exported as OTLP/HTTP JSON to a
receiver of the test's own (fixtures/otlp.py), the caller's trace continued
and handed on upstream, a replay, 409, 422 or unknown outcome linked to the
request that ran (across two proxies on one store), nothing of the key
exported, and a collector that hangs costing the requests nothing."""
import hashlib
import json
import os
import re
import signal
import subprocess
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.marks import shared_store, store_independent
from fixtures.npm import npm_install
from fixtures.otlp import OtlpReceiver, attrs, wait_quiet
from fixtures.probes import start_held
from fixtures.waiting import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
TID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
OTLP_JS = ("@opentelemetry/otlp-transformer", "0.301.1")


def receiver():
    return OtlpReceiver().start()


def forwarded_traceparent(body):
    got = [v for k, v in json.loads(body)["headers"] if k.lower() == "traceparent"]
    assert len(got) == 1, got
    return got[0]


def server_span(rx, trace_id, outcome=None, n=1):
    spans = rx.wait_spans(lambda s: s["kind"] == 2 and s["traceId"] == trace_id and (
        outcome is None or attrs(s)["idempotency.outcome"] == outcome), n=n)
    return spans[-1]


def check_envelope(rx):
    """What every export is: OTLP's JSON mapping as collectors read it."""
    assert rx.requests and all(path == "/v1/traces" and ctype == "application/json"
                               for path, ctype in rx.requests), rx.requests
    for s in rx.spans():
        assert s["_resource"]["service.name"] == {"stringValue": "idemproxy"}
        assert s["_scope"]["name"] == "idemproxy"
        assert re.fullmatch(r"[0-9a-f]{32}", s["traceId"]) and s["traceId"] != "0" * 32
        assert re.fullmatch(r"[0-9a-f]{16}", s["spanId"])
        assert re.fullmatch(r"[0-9a-f]{16}", s.get("parentSpanId", "0" * 16))
        assert isinstance(s["kind"], int) and s["kind"] in (2, 3)
        for t in ("startTimeUnixNano", "endTimeUnixNano"):
            assert isinstance(s[t], str) and re.fullmatch(r"[0-9]{19}", s[t]), s[t]
        assert int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
        for a in s["attributes"]:
            if "intValue" in a["value"]:
                assert isinstance(a["value"]["intValue"], str)
        assert s["status"] in ({}, {"code": 2})


@store_independent
def test_a_request_continues_the_callers_trace_and_names_each_step(proxy, upstream):
    rx = receiver()
    try:
        p = proxy("--otlp-endpoint", rx.url)
        key = "order-" + new_key()
        st, h, body = p.request("POST", "/echo", [("Idempotency-Key", key),
                                                  ("traceparent", "00-%s-%s-01" % (TID, PARENT)),
                                                  ("tracestate", "vendor=1")], b"x")
        assert st == 201
        up = forwarded_traceparent(body)
        version, tid, client_id, flags = up.split("-")
        assert (version, tid, flags) == ("00", TID, "01") and client_id != PARENT
        assert ["tracestate", "vendor=1"] in json.loads(body)["headers"]  # as it came
        server = server_span(rx, TID, "executed")
        assert server["parentSpanId"] == PARENT and server["name"] == "POST default"
        a = attrs(server)
        assert a["http.request.method"] == "POST" and a["url.path"] == "/echo"
        assert a["http.route"] == "default" and a["http.response.status_code"] == 201
        store_key = json.loads(p.admin_request("GET", "/keys/" + key)[2])["records"][0][
            "store_key"]
        assert a["idempotency.key_hash"] == hashlib.sha256(store_key.encode()).hexdigest()[:32]
        assert "links" not in server
        kids = rx.wait_spans(lambda s: s.get("parentSpanId") == server["spanId"], n=3)
        by_name = {s["name"]: s for s in kids}
        assert set(by_name) >= {"store acquire", "upstream POST", "store complete"}, by_name
        client = by_name["upstream POST"]
        assert client["kind"] == 3 and client["spanId"] == client_id  # what upstream was told
        assert attrs(client)["http.response.status_code"] == 201
        p.wait_log("trace_id=" + TID)
        # The replay starts a trace of its own, linked to the request that ran.
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert st == 201 and hone(h, REPLAY) == "true"
        replay = rx.wait_spans(lambda s: s["kind"] == 2 and attrs(s).get(
            "idempotency.outcome") == "replayed")[0]
        assert replay["traceId"] != TID and "parentSpanId" not in replay
        assert replay["links"] == [{"traceId": TID, "spanId": server["spanId"]}]
        wait_quiet(rx)
        check_envelope(rx)
        # nothing of the key goes to the collector: its hash only
        assert not any(key.encode() in b for b in rx.bodies)
    finally:
        rx.stop()


@store_independent
def test_unsampled_requests_forward_flags_00_and_export_nothing(proxy, upstream):
    rx = receiver()
    try:
        p = proxy("--otlp-endpoint", rx.url, "--trace-sample", "0")
        st, _, body = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
        assert st == 201
        _, tid, _, flags = forwarded_traceparent(body).split("-")
        assert flags == "00" and re.fullmatch(r"[0-9a-f]{32}", tid)
        p.wait_log("trace_id=" + tid)  # the access line names it all the same
        # A caller's sampled flag decides for its own trace (parent-based).
        st, _, body = p.request("GET", "/echo", [("traceparent", "00-%s-%s-01" % (TID, PARENT))])
        assert forwarded_traceparent(body).endswith("-01")
        server_span(rx, TID, "passthrough")
        wait_quiet(rx)
        assert {s["traceId"] for s in rx.spans()} == {TID}
        # A traceparent that does not parse starts a trace (unsampled here).
        st, _, body = p.request("GET", "/echo", [("traceparent", "00-%s-%s-01" % (TID.upper(),
                                                                                 PARENT))])
        assert TID not in forwarded_traceparent(body)
    finally:
        rx.stop()


@shared_store
def test_answers_that_did_not_run_link_to_the_request_that_did_shared_redis(proxy, upstream):
    """A 409, a 422, a replay and an unknown outcome answered by another proxy
    on the same store carry a link to the SERVER span of the request that
    ran (its context kept in the key's record)."""
    rx = receiver()
    try:
        a = proxy("--otlp-endpoint", rx.url, "--upstream-timeout", "1",
                  "--upstream-late-timeout", "0")
        b = proxy("--otlp-endpoint", rx.url)
        key = new_key()
        first = start_held(a, key)
        req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
        wait_for(lambda: b.request(*req)[0] == 409, timeout=5, what="the 409 at the other proxy")
        upstream.release(key)
        assert first()[0] == 200
        ran = rx.wait_spans(lambda s: s["kind"] == 2 and attrs(s).get(
            "idempotency.outcome") == "executed")[0]
        link = [{"traceId": ran["traceId"], "spanId": ran["spanId"]}]
        assert b.request(*req)[0] == 200  # replayed
        assert_problem(b.request(req[0], req[1], req[2], b"other"), 422,
                       "idempotency_key_mismatch", "2.2")
        for outcome in ("in_flight", "replayed", "mismatch"):
            got = rx.wait_spans(lambda s: attrs(s).get("idempotency.outcome") == outcome)[0]
            assert got["links"] == link, (outcome, got)
            assert got["traceId"] != ran["traceId"]
        # An unknown outcome: a request that got no answer in --upstream-timeout.
        lost = new_key()
        held = start_held(a, lost)
        assert_problem(held(timeout=10), 504, "upstream_timeout")
        lost_req = ("POST", "/hold?id=%s" % lost, [("Idempotency-Key", lost)], b"held")
        assert_problem(b.request(*lost_req), 502, "idempotency_outcome_unknown")
        upstream.release(lost)
        ran = rx.wait_spans(lambda s: attrs(s).get("idempotency.outcome") == "upstream_error")[0]
        got = rx.wait_spans(lambda s: attrs(s).get("idempotency.outcome") == "outcome_unknown")[0]
        assert got["links"] == [{"traceId": ran["traceId"], "spanId": ran["spanId"]}]
    finally:
        rx.stop()


@pytest.mark.concurrency  # the exporter's thread and the loops: also under ThreadSanitizer
@store_independent
def test_a_collector_that_hangs_costs_the_requests_nothing(proxy, upstream):
    """The exporter waits on a collector that never answers; the requests do
    not: the queue fills, and what does not fit is dropped and counted."""
    rx = receiver()
    rx.mode = "hang"
    try:
        p = proxy("--otlp-endpoint", rx.url, "--trace-queue", "8")
        slowest = 0.0
        for _ in range(60):
            t0 = time.monotonic()
            st, _, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
            slowest = max(slowest, time.monotonic() - t0)
            assert st == 201
        # An export waits up to 4 s for the collector: a request that waited
        # for the exporter would have taken that long.
        assert slowest < 1.0, slowest
        dropped = metrics_value(p.metrics(), "idemproxy_trace_spans_dropped_total")
        # 4 spans a request; at most a batch in the air and a queue full kept
        assert dropped >= 60 * 4 - 3 * 8, dropped
        # At SIGTERM the exporter is still waiting on the collector: what is
        # queued is dropped once that export fails, not waited for in turn.
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(15) == 0, p.stderr()
        assert "an export of" in p.stderr()
    finally:
        rx.stop()


@store_independent
def test_an_export_the_collector_refuses_is_counted_and_said(proxy, upstream):
    rx = receiver()
    rx.mode = "fail"
    try:
        p = proxy("--otlp-endpoint", rx.url)
        assert p.request("GET", "/echo")[0] == 201
        p.wait_log("failed: the collector answered 500", timeout=5)
        wait_for(lambda: metrics_value(p.metrics(), "idemproxy_trace_spans_dropped_total") >= 1,
                 timeout=5, what="the dropped span counted")
    finally:
        rx.stop()


def _comparable(span):
    """A span of an export, as both encoders write it: the fields idemproxy
    writes, integers as numbers, an unset status as {}."""
    out = {k: span[k] for k in ("traceId", "spanId", "parentSpanId", "name", "kind",
                                "startTimeUnixNano", "endTimeUnixNano") if k in span}
    out["attributes"] = [{"key": a["key"], "value": {k: (int(v) if k == "intValue" else v)
                                                     for k, v in a["value"].items()}}
                         for a in span.get("attributes", [])]
    out["links"] = [{"traceId": link["traceId"], "spanId": link["spanId"]}
                    for link in span.get("links", [])]
    out["status"] = {k: v for k, v in span.get("status", {}).items() if v}
    return out


@store_independent
def test_an_exported_span_reads_as_the_opentelemetry_js_exporter_writes_it(proxy, upstream):
    """Cross-check with the OpenTelemetry JS SDK's own OTLP/HTTP JSON
    serializer (npm @opentelemetry/otlp-transformer): the same span, given
    to it, comes out as idemproxy wrote it (ids, times, kinds, attributes,
    links, status)."""
    prefix = npm_install(*OTLP_JS, needed_by="the OTLP JSON cross-check")
    rx = receiver()
    try:
        p = proxy("--otlp-endpoint", rx.url)
        key = new_key()
        for _ in range(2):
            p.request("POST", "/echo", [("Idempotency-Key", key),
                                        ("traceparent", "00-%s-%s-01" % (TID, PARENT))], b"x")
        ours = rx.wait_spans(lambda s: attrs(s).get("idempotency.outcome") == "replayed")[0]
        resource = {k: v["stringValue"] for k, v in ours["_resource"].items()}
        r = subprocess.run(["node", os.path.join(HERE, "otlp_encode.js")],
                           input=json.dumps({"span": ours, "resource": resource,
                                             "scope": ours["_scope"]}),
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, NODE_PATH=os.path.join(prefix, "node_modules")))
        assert r.returncode == 0, r.stderr
        theirs = json.loads(r.stdout)["resourceSpans"][0]
        assert {a["key"]: a["value"] for a in theirs["resource"]["attributes"]} == \
            ours["_resource"]
        [span] = theirs["scopeSpans"][0]["spans"]
        assert ours.get("links"), "the replay's span has its link"
        assert _comparable(span) == _comparable(ours)
    finally:
        rx.stop()
