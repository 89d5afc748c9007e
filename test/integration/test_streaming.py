"""Streaming (doc/guarantees.md, "Streaming"): answers go to the client as
they come, with backpressure; passthrough answers are never captured; keyed
answers are copied as they pass and replayed byte for byte; an answer cut
upstream is visibly cut; a client gone mid-stream ends a passthrough
exchange upstream and leaves a keyed one to be stored."""
import hashlib
import http.client
import json
import os
import socket
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.marks import heavy, store_independent
from fixtures.upstream import big_body
from fixtures.waiting import in_thread, wait_for

# Also run under ThreadSanitizer (scripts/test), and on both upstream clients.
pytestmark = [pytest.mark.concurrency, pytest.mark.both_clients]


def open_stream(p, method, target, headers=(), body=None, timeout=15.0):
    """Sends one request on a fresh connection and returns (connection,
    response) once the answer's head is in."""
    c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=timeout)
    c.request(method, target, body=body, headers=dict(headers))
    return c, c.getresponse()


def read_events(r, n):
    """Reads <n> server-sent events from the streamed answer <r>: a list of
    (monotonic time it was complete, its bytes)."""
    out, pending = [], b""
    while len(out) < n:
        data = r.read1(65536)
        if not data:
            break
        pending += data
        while b"\n\n" in pending:
            ev, pending = pending.split(b"\n\n", 1)
            out.append((time.monotonic(), ev + b"\n\n"))
    return out


def retry_until_stored(p, target, key):
    """Retries the keyed POST of <target> until it is no longer 409 (the
    exchange still running): the answer a retry then gets."""
    def answer():
        a = p.request("POST", target, [("Idempotency-Key", key)], b"x")
        return a if a[0] != 409 else None

    return wait_for(answer, timeout=10, what="the answer stored")


def vm_kib(p, field):
    with open("/proc/%d/status" % p.proc.pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, p.proc.pid))


def stream_digest(n, size):
    """What /stream?n=N&size=S sends: its length and SHA-256."""
    h, piece = hashlib.sha256(), big_body(size)
    for _ in range(n):
        h.update(piece)
    return n * size, h.hexdigest()


def read_all(r, pace=None):
    """Reads the whole body of <r>: its length and SHA-256; <pace> bytes a
    second at most."""
    h, total, t0 = hashlib.sha256(), 0, time.monotonic()
    while True:
        data = r.read1(65536 if pace is None else 16384)
        if not data:
            return total, h.hexdigest()
        h.update(data)
        total += len(data)
        if pace is not None:
            ahead = total / pace - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)


@store_independent
def test_server_sent_events_pass_as_they_are_sent(proxy, upstream):
    p = proxy()
    name = new_key()
    c, r = open_stream(p, "GET", "/sse?n=5&ms=400&id=" + name)
    try:
        assert r.status == 200 and hone(r.getheaders(), "Content-Type") == "text/event-stream"
        assert hone(r.getheaders(), "Transfer-Encoding") == "chunked"
        events = read_events(r, 5)
    finally:
        c.close()
    sent = upstream.sent_at(name)
    assert [e for _, e in events] == [b"id: %d\ndata: event %d of %s\n\n" % (i, i, name.encode())
                                      for i in range(5)]
    for (got, _), out in zip(events, sent):
        assert got - out < 0.3, (got - out)  # each arrives when it is sent, not at the end
    gaps = [b[0] - a[0] for a, b in zip(events, events[1:])]
    assert all(0.25 < g < 0.6 for g in gaps), gaps


def test_keyed_event_stream_streams_then_replays_byte_for_byte(proxy, upstream):
    p = proxy()
    key, name = new_key(), new_key()
    target = "/sse?n=4&ms=400&id=" + name
    c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"go")
    try:
        assert r.status == 200 and hone(r.getheaders(), REPLAY) == "false"
        events = read_events(r, 4)
        assert r.read() == b""
    finally:
        c.close()
    sent = upstream.sent_at(name)
    assert len(events) == 4 and len(sent) == 4
    for (got, _), out in zip(events, sent):
        assert got - out < 0.3, (got - out)
    first = b"".join(e for _, e in events)
    st, h, body = p.request("POST", target, [("Idempotency-Key", key)], b"go")
    assert st == 200 and hone(h, REPLAY) == "true" and body == first
    assert hone(h, "Content-Type") == "text/event-stream"
    assert upstream.hits("/sse") == 1


@store_independent
def test_streamed_upload_after_a_buffered_one_on_one_connection(proxy, upstream):
    """A small body (sent whole) then a large one (streamed), then a small one
    again, on one kept-alive connection: each exchange forwards its own body,
    never the one before (a client's handle reused from one to the next)."""
    p = proxy()
    c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
    bodies = [b"small-%d" % i for i in range(3)]
    bodies.insert(1, os.urandom(200 * 1024))
    for body in bodies:
        c.request("PUT", "/echo", body, {"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        r.read()
        assert r.status == 201, r.status
    c.close()
    got = [b for _, _, _, b in upstream.requests]
    assert got == bodies, [len(b) for b in got]


@store_independent
def test_download_streams_with_and_without_length(proxy, upstream):
    p = proxy()
    for length in ("1", "0"):
        c, r = open_stream(p, "GET", "/stream?n=64&size=65536&ms=0&length=" + length)
        try:
            assert r.status == 200
            if length == "1":
                assert hone(r.getheaders(), "Content-Length") == str(64 * 65536)
            else:
                assert hone(r.getheaders(), "Transfer-Encoding") == "chunked"
            assert read_all(r) == stream_digest(64, 65536)
        finally:
            c.close()


@heavy
@store_independent
def test_256_mib_download_in_bounded_memory(proxy, upstream):
    """Any size passes through (no response_too_large), and the proxy's peak
    memory grows by less than 32 MiB for it (doc/guarantees.md)."""
    p = proxy("--max-response", "1048576")
    assert p.request("GET", "/stream?n=4&size=65536")[0] == 200  # warm
    before = vm_kib(p, "VmHWM")
    for length in ("1", "0"):
        c, r = open_stream(p, "GET", "/stream?n=4096&size=65536&length=" + length, timeout=60)
        try:
            assert r.status == 200
            assert read_all(r) == stream_digest(4096, 65536)
        finally:
            c.close()
    grown = vm_kib(p, "VmHWM") - before
    assert grown < 32 * 1024, "peak RSS grew by %d KiB" % grown


@heavy
@store_independent
def test_slow_reader_slows_the_upstream_read(proxy, upstream):
    """A reader of 64 KiB/s: the proxy holds at most its window, not the
    answer (the upstream waits on its socket)."""
    p = proxy()
    before = vm_kib(p, "VmHWM")
    c, r = open_stream(p, "GET", "/stream?n=16&size=65536&length=1", timeout=60)
    try:
        got = in_thread(read_all, r, 64 * 1024)  # 1 MiB at 64 KiB/s: 16 s
        time.sleep(4)
        mid = vm_kib(p, "VmRSS")
        assert got(timeout=60) == stream_digest(16, 65536)
    finally:
        c.close()
    assert mid - before < 3 * 1024, "RSS grew by %d KiB while a slow client read" % (mid - before)


def test_keyed_stream_of_a_status_not_cached_is_not_stored(proxy, upstream):
    p = proxy()
    key = new_key()
    target = "/stream?n=3&size=20000&ms=100&status=503"
    for n in (1, 2):
        c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
        try:
            assert r.status == 503 and hone(r.getheaders(), REPLAY) == "false"
            assert read_all(r) == stream_digest(3, 20000)
        finally:
            c.close()
        wait_for(lambda: upstream.hits("/stream") == n, what="the request run again")


def test_keyed_stream_of_a_5xx_cut_releases_its_key(proxy, upstream):
    """An answer the API said it failed (a 5xx) is never kept: a reset in its
    body leaves the key free, not unknown."""
    p = proxy()
    key = new_key()
    target = "/stream?n=6&size=10000&ms=100&reset=3&status=500"
    for n in (1, 2):
        c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
        try:
            assert r.status == 500
            with pytest.raises(http.client.IncompleteRead):
                r.read()
        finally:
            c.close()
        wait_for(lambda: upstream.hits("/stream") == n, what="the request run again")


@store_independent
def test_trailers_after_a_streamed_body_are_dropped(proxy, upstream):
    """A trailer line shaped like a status line, after a body that streamed:
    its record went with its head, and nothing reads it any more (curl may
    refuse the line and cut the answer; the proxy stays up either way)."""
    p = proxy()
    c, r = open_stream(p, "GET", "/stream?n=3&size=20000&ms=100&trailer=1")
    try:
        assert r.status == 200
        try:
            assert read_all(r) == stream_digest(3, 20000)
        except http.client.IncompleteRead:
            assert "its answer was cut" in p.wait_log("its answer was cut")
    finally:
        c.close()
    assert p.request("GET", "/echo")[0] == 201 and p.alive()  # still up


@store_independent
def test_upload_whose_answer_streams_before_the_body_ends(proxy, upstream):
    """The upstream answers with its head and streams its answer while the
    client's chunked body is still coming: the body is still ended (its last
    chunk sent), and the answer, held meanwhile, follows it."""
    p = proxy()
    st, got, digest = send_upload(p, 1 << 20, True, target="/upload?early=1")
    echo, _, summary = got.rpartition(b"\n")
    assert st == 200 and hashlib.sha256(echo).hexdigest() == digest
    assert json.loads(summary)["bytes"] == 1 << 20


def test_keyed_answer_over_max_response_streams_whole_then_too_large(proxy, upstream):
    p = proxy("--max-response", "100000")
    key = new_key()
    target = "/stream?n=6&size=50000&ms=50"  # 300000 bytes: 3 x --max-response
    c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
    try:
        assert r.status == 200
        assert read_all(r) == stream_digest(6, 50000)
    finally:
        c.close()
    assert_problem(p.request("POST", target, [("Idempotency-Key", key)], b"x"), 502,
                   "response_too_large")
    assert upstream.hits("/stream") == 1


def test_reset_mid_body_cuts_the_answer_and_makes_the_key_unknown(proxy, upstream):
    p = proxy()
    key = new_key()
    target = "/stream?n=6&size=10000&ms=100&reset=3"
    c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
    try:
        assert r.status == 200
        with pytest.raises(http.client.IncompleteRead):
            r.read()  # no last chunk: cut, never taken for whole
    finally:
        c.close()
    wait_for(lambda: p.request("POST", target, [("Idempotency-Key", key)], b"x")[0] == 502,
             what="the key unknown")
    assert_problem(p.request("POST", target, [("Idempotency-Key", key)], b"x"), 502,
                   "idempotency_outcome_unknown")
    assert upstream.hits("/stream") == 1
    log = p.wait_log("its answer was cut after")
    assert "the upstream reset the connection" in log


@store_independent
def test_cut_with_content_length_arrives_short(proxy, upstream):
    p = proxy()
    c, r = open_stream(p, "GET", "/stream?n=6&size=10000&ms=100&reset=3&length=1")
    try:
        assert hone(r.getheaders(), "Content-Length") == "60000"
        with pytest.raises(http.client.IncompleteRead) as e:
            r.read()
        assert len(e.value.partial) == 30000
    finally:
        c.close()


@store_independent
def test_http10_client_gets_a_close_delimited_body_and_a_reset_when_cut(proxy, upstream):
    p = proxy()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    try:
        s.sendall(b"GET /stream?n=3&size=1000&ms=50 HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    finally:
        s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
    assert b"chunked" not in head.lower() and b"content-length" not in head.lower()
    assert body == big_body(1000) * 3
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    try:
        s.sendall(b"GET /stream?n=6&size=1000&ms=100&reset=3 HTTP/1.0\r\nHost: x\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            while s.recv(65536):
                pass
    finally:
        s.close()


@store_independent
def test_flowing_stream_outlives_the_upstream_timeout_and_a_silence_cuts(proxy, upstream):
    p = proxy("--upstream-timeout", "1")
    c, r = open_stream(p, "GET", "/sse?n=6&ms=600")  # 3 s, never 1 s silent
    try:
        assert len(read_events(r, 6)) == 6 and r.read() == b""
    finally:
        c.close()
    c, r = open_stream(p, "GET", "/stream?n=3&size=1000&ms=100&stall=2500")
    try:
        assert r.status == 200
        with pytest.raises(http.client.IncompleteRead):
            r.read()
    finally:
        c.close()
    assert "stopped for longer than --upstream-timeout" in p.wait_log("its answer was cut")


def test_keyed_stream_silent_past_the_timeout_completes_late(proxy, upstream):
    """A keyed answer silent past --upstream-timeout: its client's answer is
    cut, and the exchange, still copied, completes the key when it ends
    within --upstream-late-timeout."""
    p = proxy("--upstream-timeout", "1", "--upstream-late-timeout", "10")
    key = new_key()
    target = "/stream?n=3&size=1000&ms=100&stall=2000"
    c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
    try:
        with pytest.raises(http.client.IncompleteRead):
            r.read()
    finally:
        c.close()
    st = retry_until_stored(p, target, key)
    assert st[0] == 200 and hone(st[1], REPLAY) == "true" and st[2] == big_body(1000) * 3
    assert upstream.hits("/stream") == 1


def test_keyed_client_gone_mid_stream_is_stored_and_replayed(proxy, upstream):
    p = proxy()
    key = new_key()
    target = "/stream?n=5&size=20000&ms=200"
    c, r = open_stream(p, "POST", target, [("Idempotency-Key", key)], b"x")
    assert r.status == 200 and r.read1(65536)
    c.close()  # gone after the first piece
    st = retry_until_stored(p, target, key)
    assert st[0] == 200 and hone(st[1], REPLAY) == "true"
    assert st[2] == big_body(20000) * 5
    assert upstream.hits("/stream") == 1


@store_independent
def test_passthrough_client_gone_closes_the_upstream_within_a_second(proxy, upstream):
    p = proxy()
    name = new_key()
    c, r = open_stream(p, "GET", "/stream?n=100&size=1000&ms=100&id=" + name)
    assert r.status == 200 and r.read1(65536)
    c.close()
    gone = time.monotonic()
    wait_for(lambda: upstream.stream_closed(name), timeout=5, what="the upstream's connection closed")
    assert upstream.stream_closed(name) - gone < 1.0


@store_independent
def test_streamed_bytes_are_counted_and_logged(proxy, upstream):
    p = proxy()
    c, r = open_stream(p, "GET", "/stream?n=4&size=30000&ms=50")
    try:
        assert read_all(r) == stream_digest(4, 30000)
    finally:
        c.close()
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_streamed_bytes_total",
                                   {"route": "default", "direction": "down"}) == 120000,
             what="the streamed bytes counted")
    assert " bytes=120000 " in p.wait_log("GET /stream?n=4&size=30000")


# ------------------------------------------------------------ request bodies

def send_upload(p, total, chunked, target="/upload", headers=(), piece_size=65536,
                timeout=60, head_only=False):
    """POSTs <total> bytes of a known pattern (Content-Length, or chunked);
    returns (status, body as JSON or bytes, the pattern's SHA-256). With
    <head_only> the body is not sent: for an answer expected before it (a
    server that refuses a body it will not read closes the connection, and a
    client still writing it could lose the answer to the reset)."""
    piece, h = big_body(piece_size), hashlib.sha256()
    c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=timeout)
    try:
        c.putrequest("POST", target)
        for k, v in headers:
            c.putheader(k, v)
        if chunked:
            c.putheader("Transfer-Encoding", "chunked")
        else:
            c.putheader("Content-Length", str(total))
        c.endheaders()
        left = 0 if head_only else total
        while left > 0:
            part = piece[:min(left, piece_size)]
            h.update(part)
            c.send(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            left -= len(part)
        if chunked and not head_only:
            c.send(b"0\r\n\r\n")
        r = c.getresponse()
        body = r.read()
    finally:
        c.close()
    try:
        body = json.loads(body)
    except ValueError:
        pass
    return r.status, body, h.hexdigest()


@heavy
@store_independent
def test_512_mib_upload_streams_in_bounded_memory(proxy, upstream):
    p = proxy()
    assert send_upload(p, 100000, False)[0] == 200  # warm
    before = vm_kib(p, "VmHWM")
    for chunked in (False, True):
        st, got, digest = send_upload(p, 512 << 20, chunked, timeout=120)
        assert st == 200 and got["bytes"] == 512 << 20 and got["sha256"] == digest
        assert got["chunked"] == chunked
    grown = vm_kib(p, "VmHWM") - before
    assert grown < 32 * 1024, "peak RSS grew by %d KiB" % grown
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_streamed_bytes_total",
                                   {"route": "default", "direction": "up"})
             == 100000 + 2 * (512 << 20),
             what="the streamed bytes counted")


@heavy  # a memory bound: the sanitizers' own memory would blur it
@store_independent
def test_upload_slowed_by_its_upstream_holds_only_the_window(proxy, upstream):
    p = proxy()
    before = vm_kib(p, "VmHWM")
    st, got, digest = send_upload(p, 12 << 20, False, target="/upload?rate=%d" % (4 << 20))
    assert st == 200 and got["bytes"] == 12 << 20 and got["sha256"] == digest
    grown = vm_kib(p, "VmHWM") - before
    assert grown < 4 * 1024, "peak RSS grew by %d KiB while the upstream read slowly" % grown


@store_independent
def test_upload_honours_expect_100_continue(proxy, upstream):
    p = proxy("--max-passthrough-body", "1M")
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    try:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(big_body(200000))
        r = http.client.HTTPResponse(s)
        r.begin()
        got = json.loads(r.read())
        assert r.status == 200 and got["bytes"] == 200000 and got["expect"] is None
    finally:
        s.close()
    # over the limit: 413 at once, no 100, nothing forwarded
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    try:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        r = http.client.HTTPResponse(s)
        r.begin()
        assert r.status == 413 and json.loads(r.read())["code"] == "payload_too_large"
    finally:
        s.close()
    assert upstream.hits("/upload") == 1


@store_independent
def test_max_passthrough_body(proxy, upstream):
    p = proxy("--max-passthrough-body", "300K", "--max-body", "1K")
    # within it: forwarded whole (--max-body is a keyed request's)
    st, got, digest = send_upload(p, 300 << 10, True)
    assert st == 200 and got["bytes"] == 300 << 10 and got["sha256"] == digest
    assert upstream.hits("/upload") == 1
    # a Content-Length over it: 413 before anything is forwarded
    st, got, _ = send_upload(p, (300 << 10) + 1, False, head_only=True)
    assert st == 413 and got["code"] == "payload_too_large"
    assert "--max-passthrough-body" in got["detail"]
    assert upstream.hits("/upload") == 1
    # a chunked body crossing it mid-way: the exchange is ended, 413
    st, got, _ = send_upload(p, 1 << 20, True)
    assert st == 413 and got["code"] == "payload_too_large"
    # a keyed request is bound by --max-body instead
    st, got, _ = send_upload(p, 2048, False, target="/echo",
                             headers=[("Idempotency-Key", new_key())], head_only=True)
    assert st == 413 and "--max-body" in got["detail"]


@store_independent
def test_small_chunked_body_over_the_limit_is_never_forwarded(proxy, upstream):
    """A body of unknown length is held until it passes 64 KiB: one that
    crosses a smaller limit before is refused with nothing forwarded."""
    p = proxy("--max-passthrough-body", "10K")
    st, got, _ = send_upload(p, 20 << 10, True, piece_size=4096)
    assert st == 413 and got["code"] == "payload_too_large"
    assert upstream.hits("/upload") == 0


@store_independent
def test_upstream_answering_before_the_upload_ends(proxy, upstream):
    p = proxy()
    st, got, _ = send_upload(p, 4 << 20, False, target="/upload?answer_at=300000")
    assert st == 413 and got == {"early": True}  # the upstream's own answer
    assert p.request("GET", "/echo")[0] == 201  # the proxy goes on


@store_independent
def test_client_gone_mid_upload_cuts_the_upstream_request(proxy, upstream):
    p = proxy()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 4000000\r\n\r\n")
    s.sendall(big_body(1000000))
    time.sleep(0.3)
    s.close()
    p.wait_log("the client went away before the answer")
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_inflight") == 0,
             what="nothing in flight")
    req = [r for r in upstream.requests if r[1] == "/upload"]
    assert len(req) == 1  # it went, and was cut: never taken for a whole request
    assert p.request("GET", "/echo")[0] == 201
