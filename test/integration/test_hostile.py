"""Hostile input (issue 6): request smuggling shapes, oversized header
sections, slow clients, connection floods and keys built to collide.

Every test drives the real binary against the fake upstream over loopback and
is bounded in time by socket timeouts and deadlines; none asserts a speed. The
rules proved are the ones of RFC 9112 (message framing) and doc/guarantees.md
(Threat model), and the overall one of an idempotency proxy: whatever a client
sends, at most one well-formed request per client request reaches the upstream,
a request hidden in a body never reaches it as a request of its own, and
nothing is left locked by a request that was refused.
"""
import hashlib
import json
import re
import select
import socket
import struct
import threading
import time

import pytest

from fixtures.client import REPLAY, hone, keyed, new_key, recv_until_closed
from fixtures.marks import store_independent
from fixtures.probes import assert_completed, assert_free, redis_keys
from fixtures.waiting import in_thread, wait_for

pytestmark = pytest.mark.both_clients  # on idemproxy's own upstream client and libcurl's

# A complete request that a smuggling shape hides where one reading of the
# framing sees body bytes and another sees the next request.
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
# The same after an empty last chunk: a body of nothing when read as chunked.
CHUNKED_SMUGGLED = b"0\r\n\r\n" + SMUGGLED
STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


# --------------------------------------------------------------------------- helpers
def exchange(port, data, quiet=1.5, deadline=12.0):
    """Sends <data> on a fresh connection and reads until the proxy closes it,
    or until <quiet> seconds pass without data once something arrived (the
    connection is kept alive), or <deadline>. Returns (answer bytes, how it
    ended: "eof", "reset", "quiet" or "deadline")."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    out = b""
    end = time.monotonic() + deadline
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while the rest was still coming: read what was answered
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return out, "deadline"
            r, _, _ = select.select([s], [], [], min(left, quiet) if out else left)
            if not r:
                if out:
                    return out, "quiet"
                continue
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return out, "reset"
            if not chunk:
                return out, "eof"
            out += chunk
    finally:
        s.close()


def first_status(answer):
    m = STATUS_RE.match(answer)
    return int(m.group(1)) if m else None


def scope_hex(*values):
    """The scope (README.md, What it does with each request: Scope) computed
    here, to craft keys against the store key layout: per scope header a
    presence byte, then its length (8 bytes, big endian) and value; the
    first 16 bytes of the SHA-256, in hex. None is an absent header."""
    h = hashlib.sha256()
    for v in values:
        if v is None:
            h.update(b"\x00")
            continue
        v = v.encode() if isinstance(v, str) else v
        h.update(b"\x01" + struct.pack(">Q", len(v)) + v)
    return h.hexdigest()[:32]


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


def seq_of(body):
    return json.loads(body)["seq"]


# --------------------------------------------------------------------------- smuggling
def _post(lines, body, key=None, nl=b"\r\n"):
    """A POST /echo with header lines <lines> (raw bytes, each without its line
    end), the key header when given, and <body> as sent."""
    head = b"POST /echo HTTP/1.1" + nl + b"Host: t" + nl
    if key is not None:
        head += b"Idempotency-Key: " + key.encode() + nl
    for line in lines:
        head += line + nl
    return head + nl + body


def _cl(n):
    return b"Content-Length: %d" % n


CHUNKS_ABC = b"3\r\nabc\r\n0\r\n\r\n"

# (id, builder(key) -> bytes, bodies the upstream may see if the proxy takes
# the request, answer codes that are an honest refusal).
SHAPES = [
    # RFC 9112 §6.1: both headers: reject, or use Transfer-Encoding and close the
    # connection after answering, so that what follows the chunked body is never
    # read as a request.
    ("cl-then-te",
     lambda k: _post([_cl(len(CHUNKED_SMUGGLED)), b"Transfer-Encoding: chunked"],
                     CHUNKED_SMUGGLED, k),
     (b"", CHUNKED_SMUGGLED), (400,)),
    ("te-then-cl",
     lambda k: _post([b"Transfer-Encoding: chunked", _cl(len(CHUNKED_SMUGGLED))],
                     CHUNKED_SMUGGLED, k),
     (b"", CHUNKED_SMUGGLED), (400,)),
    # §6.3: different Content-Length values are an unrecoverable framing error (400);
    # taking one of them is tolerated here while the hidden request stays body.
    ("two-cl-zero-first", lambda k: _post([_cl(0), _cl(len(SMUGGLED))], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    ("two-cl-zero-last", lambda k: _post([_cl(len(SMUGGLED)), _cl(0)], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    ("cl-list", lambda k: _post([b"Content-Length: 0, %d" % len(SMUGGLED)], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    # §6.1: chunked must be the final coding, else 400; an unknown coding is 501.
    # Two Transfer-Encoding lines are one list: "chunked, identity".
    ("te-twice", lambda k: _post([b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity"],
                                 CHUNKS_ABC + SMUGGLED, k),
     (), (400, 501)),
    ("te-chunked-identity", lambda k: _post([b"Transfer-Encoding: chunked, identity"],
                                            CHUNKS_ABC + SMUGGLED, k),
     (), (400, 501)),
    ("te-identity-chunked", lambda k: _post([b"Transfer-Encoding: identity, chunked"],
                                            CHUNKS_ABC + SMUGGLED, k),
     (b"abc",), (400, 501)),
    ("te-xchunked", lambda k: _post([b"Transfer-Encoding: xchunked"], CHUNKS_ABC + SMUGGLED, k),
     (), (400, 501)),
    ("te-xchunked-and-cl",
     lambda k: _post([b"Transfer-Encoding: xchunked", _cl(len(SMUGGLED))], SMUGGLED, k),
     (SMUGGLED,), (400, 501)),
    # §5.1: whitespace between a field name and its colon is a 400; forwarded,
    # the upstream may drop the line and all that follows it (Content-Length).
    ("space-before-colon-te",
     lambda k: _post([b"Transfer-Encoding : chunked", _cl(len(SMUGGLED))], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    ("space-before-colon-other",
     lambda k: _post([b"X-Pad : v", _cl(len(SMUGGLED))], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    # §5.2: obs-fold is a 400, or replaced by SP before the field is used: a
    # folded line is never a field of its own, and never framing.
    ("obs-fold-te-continued",
     lambda k: _post([_cl(len(SMUGGLED)), b"X-A: a", b" Transfer-Encoding: chunked"],
                     SMUGGLED, k),
     (SMUGGLED,), (400,)),
    ("obs-fold-into-cl",
     lambda k: _post([_cl(len(SMUGGLED)), b" :0"], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    ("obs-fold-into-te",
     lambda k: _post([b"Transfer-Encoding: x", b" : chunked", _cl(len(CHUNKED_SMUGGLED))],
                     CHUNKED_SMUGGLED, k),
     (CHUNKED_SMUGGLED,), (400, 501)),
    ("obs-fold-first-line",
     lambda k: b"POST /echo HTTP/1.1\r\n " + _post([_cl(len(SMUGGLED))], SMUGGLED, k)[21:],
     (SMUGGLED,), (400,)),
    # §2.2: a bare LF may be taken as a line end; then it is one consistently.
    ("bare-lf", lambda k: _post([_cl(len(SMUGGLED))], SMUGGLED, k, nl=b"\n"),
     (SMUGGLED,), (400,)),
    ("bare-lf-inside-field",
     lambda k: _post([b"X-A: a\n" + _cl(len(SMUGGLED))], SMUGGLED, k),
     (SMUGGLED,), (400,)),
    # §7.1: a chunk size is hex digits only; a broken one ends the connection.
    ("chunk-size-junk", lambda k: _post([b"Transfer-Encoding: chunked"],
                                        b"3x\r\nabc\r\n" + CHUNKED_SMUGGLED, k), (), (400,)),
    ("chunk-size-negative", lambda k: _post([b"Transfer-Encoding: chunked"],
                                            b"-3\r\nabc\r\n" + CHUNKED_SMUGGLED, k), (), (400,)),
    ("chunk-size-0x", lambda k: _post([b"Transfer-Encoding: chunked"],
                                      b"0x3\r\nabc\r\n" + CHUNKED_SMUGGLED, k), (), (400,)),
    # 413 is the honest answer to a size that cannot fit (it would overflow).
    ("chunk-size-overflow", lambda k: _post([b"Transfer-Encoding: chunked"],
                                            b"1" + b"0" * 16 + b"3\r\nabc\r\n" + CHUNKED_SMUGGLED,
                                            k), (), (400, 413)),
    ("chunk-data-overrun", lambda k: _post([b"Transfer-Encoding: chunked"],
                                           b"3\r\nabcdef\r\n" + CHUNKED_SMUGGLED, k), (), (400,)),
]
SHAPE_PARAMS = [pytest.param(build, bodies, codes, id=name)
                for name, build, bodies, codes in SHAPES]


def _check_shape(p, upstream, data, bodies, codes, key=None):
    """Sends one shape and checks the rule; returns the body the upstream got,
    or None when the request was refused."""
    answer, ended = exchange(p.port, data)
    time.sleep(0.3)  # a request the proxy would forward after its answer is in by now
    got = [(m, t, b) for m, t, _, b in upstream.requests]
    diag = "sent %r\nanswer (%s) %r\nupstream got %r" % (data, ended, answer[:400], got)
    assert upstream.hits("/smuggled") == 0, \
        "a request hidden in the body reached the upstream: " + diag
    st = first_status(answer)
    if st is None and key is not None and upstream.hits() == 0:
        assert_free(p, key)  # unanswered: at least nothing may be left locked
    assert st is not None, "no answer at all (connection %s): " % ended + diag
    if st in codes:
        assert upstream.hits() == 0, "refused, yet forwarded: " + diag
        if key is not None:
            assert_free(p, key)  # nothing locked by the refused request
        return None
    assert st == 201, "neither forwarded nor an honest refusal %r: " % (codes,) + diag
    assert upstream.hits() == 1, diag
    method, target, headers, body = upstream.requests[0]
    assert (method, target) == ("POST", "/echo"), diag
    # RFC 9112 §5.2: a sender never generates line folding; a line break inside
    # a value as the upstream parsed it is a folded (or injected) line sent on.
    assert not [(k, v) for k, v in headers if "\r" in v or "\n" in v], \
        "a folded line was forwarded: %r; " % headers + diag
    assert body in bodies, "forwarded with a body no framing of the request gives: " + diag
    if key is not None:
        # The fingerprint was taken over the body that was forwarded: the same
        # request sent plainly is its replay.
        assert_completed(p, key, keyed(key, body=body))
    return body


@store_independent
@pytest.mark.parametrize("build,bodies,codes", SHAPE_PARAMS)
def test_smuggling_shape_is_refused_or_forwarded_once(proxy, upstream, build, bodies, codes):
    """A request whose framing is ambiguous is refused with an honest status
    (400; 501 for an unknown transfer coding; 413 for a chunk size that cannot
    fit), or forwarded as exactly one POST whose body is one reading of its
    framing; a request hidden in its body never reaches the upstream on its own,
    and the client always gets an answer (never a silent close or a hang)."""
    p = proxy("--client-timeout", "3")
    _check_shape(p, upstream, build(None), bodies, codes)


@pytest.mark.parametrize("build,bodies,codes", SHAPE_PARAMS)
def test_smuggling_shape_with_key_leaves_nothing_locked(proxy, upstream, build, bodies, codes):
    """The same shapes on an enforced POST with an Idempotency-Key: a refusal
    leaves the key free (no lock behind), a forwarded one completes the key for
    exactly the body forwarded."""
    p = proxy("--client-timeout", "3")
    key = new_key()
    _check_shape(p, upstream, build(key), bodies, codes, key=key)


@store_independent
@pytest.mark.parametrize("fold", [b" b", b"\tb", b"  b: c"], ids=["space", "tab", "colon"])
def test_obs_fold_is_refused_or_forwarded_as_one_request(proxy, upstream, fold):
    """RFC 9112 section 5.2: an obs-fold line is refused (400), or the request
    reaches the upstream once, well-formed: the folded line is never a line
    or a field of its own there, the fields after it and the body arrive
    intact. libmicrohttpd 0.9.75 joins the continuation onto the field's
    *name* ("X-A: a" + " b" arrives as "X-Ab: a"; the README says so); one
    whose name is then no token ("b: c") is refused by the framing check."""
    p = proxy("--client-timeout", "3")
    data = _post([b"X-A: a", fold, b"X-Z: z", _cl(3)], b"abc")
    answer, ended = exchange(p.port, data)
    st = first_status(answer)
    assert st is not None, "no answer (%s)" % ended
    if st == 400:
        assert upstream.hits() == 0
        return
    assert st == 201 and upstream.hits() == 1, answer[:300]
    _, _, headers, body = upstream.requests[0]
    cont = fold.strip().decode()
    names = sorted(k.lower() for k, _ in headers
                   if k.lower() not in ("host", "x-forwarded-for", "x-forwarded-proto",
                                        "x-forwarded-host", "content-length"))
    # the folded text is part of the X-A field (its value, or its name), never a field itself
    assert names in (["x-a", "x-z"], ["x-a" + cont.lower(), "x-z"]), \
        "forwarded fields %r for %r" % (headers, data)
    assert not [(k, v) for k, v in headers if "\r" in v or "\n" in v], headers
    assert [v for k, v in headers if k.lower() == "x-z"] == ["z"], headers
    assert body == b"abc"


# --------------------------------------------------------------------------- header section size
def _huge_one(key):
    return _post([b"X-Huge: " + b"v" * 100000, _cl(1)], b"x", key)


def _many_small(key):
    return _post([b"X-H-%04d: v" % i for i in range(2000)] + [_cl(1)], b"x", key)


def _huge_target(key):
    return (b"POST /echo?q=" + b"q" * 100000 + b" HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " +
            key.encode() + b"\r\nContent-Length: 1\r\n\r\nx")


OVERSIZED = [pytest.param(_huge_one, id="one-100k-header"),
             pytest.param(_many_small, id="2000-headers"),
             pytest.param(_huge_target, id="100k-target")]


def _send_oversized(port, data):
    """Returns the status answered, or None when the proxy closed the connection
    without one (also allowed). Fails when the connection is left hanging."""
    answer, ended = exchange(port, data, deadline=10.0)
    assert ended in ("eof", "reset") or answer, "oversized request left hanging (%s)" % ended
    return first_status(answer)


@pytest.mark.parametrize("build", OVERSIZED)
def test_oversized_header_section_refused_nothing_locked(proxy, upstream, build):
    """A header section (or request line) beyond the front end's memory gets 431
    (414 for the target; 400 allowed) or a closed connection, never a hang;
    nothing is forwarded and the key it carried is not locked."""
    p = proxy()
    key = new_key()
    st = _send_oversized(p.port, build(key))
    assert st in (None, 400, 414, 431), st
    assert upstream.hits() == 0
    assert_free(p, key)


@store_independent
def test_oversized_header_sections_keep_memory_bounded(proxy, upstream):
    """200 oversized header sections (one huge header, 2000 small ones, keyed
    and not) leave the proxy's resident memory within 20 MiB of where it was,
    and it serves normal requests correctly afterwards."""
    p = proxy()
    pid = p.proc.pid
    shapes = [_huge_one, _many_small]
    # Warm up: pools, allocator arenas and the upstream connection exist.
    for i in range(20):
        assert p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"w")[0] == 201
    for i in range(10):
        _send_oversized(p.port, shapes[i % 2](new_key()))
    before = rss_kib(pid)
    for i in range(200):
        data = shapes[i % 2](new_key() if i % 4 < 2 else None)
        assert _send_oversized(p.port, data) in (None, 400, 431)
    after = rss_kib(pid)
    assert after - before < 20 * 1024, "VmRSS grew from %d to %d KiB" % (before, after)
    assert upstream.hits() == 20
    key = new_key()
    st, h, body = p.request("POST", "/echo", [("Idempotency-Key", key)], b"after")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert_completed(p, key, keyed(key, body=b"after"), body=body)


# --------------------------------------------------------------------------- slow clients
class Dribblers:
    """<n> connections, each sending a never-ending header section one byte per
    <interval> seconds, from one thread. With reconnect, a dropped one is
    replaced (a slowloris keeping its slots); else its end is recorded."""

    def __init__(self, port, n, interval=1.0, reconnect=False):
        self.port, self.n, self.interval, self.reconnect = port, n, interval, reconnect
        self.lock = threading.Lock()
        self.socks = {}  # id -> [socket, bytes sent, opened at]
        self.ended = {}  # id -> (seconds open, bytes sent, how, first bytes received)
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.next_id = 0
        self.head = b"POST /echo HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"s" * 100000

    def _open(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.setblocking(False)
        self.socks[self.next_id] = [s, 0, time.monotonic()]
        self.next_id += 1

    def _end(self, i, how, data=b""):
        s, sent, t0 = self.socks.pop(i)
        s.close()
        self.ended[i] = (time.monotonic() - t0, sent, how, data[:60])
        if self.reconnect and not self.stop.is_set():
            self._open()

    def _run(self):
        with self.lock:
            for _ in range(self.n):
                self._open()
        while not self.stop.is_set():
            with self.lock:
                for i in list(self.socks):
                    s, sent, _ = self.socks[i]
                    try:
                        data = s.recv(4096)
                        self._end(i, "answer" if data else "eof", data)
                        continue
                    except BlockingIOError:
                        pass
                    except OSError as e:
                        self._end(i, type(e).__name__)
                        continue
                    try:
                        s.send(self.head[sent:sent + 1])
                        self.socks[i][1] += 1
                        self.sent += 1
                    except BlockingIOError:
                        pass
                    except OSError as e:
                        self._end(i, type(e).__name__)
            self.stop.wait(self.interval)

    def start(self):
        self.thread.start()
        return self

    def open_count(self):
        with self.lock:
            return len(self.socks)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        with self.lock:
            for s, _, _ in self.socks.values():
                s.close()
            self.socks.clear()


@store_independent
def test_header_dribbled_one_byte_per_second_is_cut_off(proxy, upstream):
    """Slow clients (doc/guarantees.md, Guarantees and failure behaviour): a
    client that takes past --client-timeout to send its header section is
    disconnected (a 408 first is allowed) even if it keeps sending a byte
    now and then; otherwise a handful of clients hold connection slots for
    hours. Checked with 5 clients, --client-timeout 2, for up to 15 s."""
    p = proxy("--client-timeout", "2")
    d = Dribblers(p.port, 5).start()
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            with d.lock:
                if len(d.ended) == 5:
                    break
            time.sleep(0.2)
        with d.lock:
            ended = dict(d.ended)
            open_now = len(d.socks)
    finally:
        d.close()
    assert len(ended) == 5, "after 15 s, %d of 5 dribbling clients still connected (%d bytes " \
        "sent between them); ended: %r" % (open_now, d.sent, ended)
    for secs, sent, how, data in ended.values():
        assert how in ("eof", "ConnectionResetError") or data.startswith(b"HTTP/1.1 408"), \
            (how, data)
    assert upstream.hits() == 0
    assert p.request("GET", "/echo", timeout=10)[0] == 201


@store_independent
def test_dribbling_clients_do_not_starve_others(proxy, upstream):
    """While 20 clients dribble their header sections one byte at a time (and
    reconnect when dropped), another client's 50 requests, keyed and not, are
    all served correctly, each within its own generous timeout."""
    p = proxy("--client-timeout", "2")
    d = Dribblers(p.port, 20, interval=0.5, reconnect=True).start()
    try:
        wait_for(lambda: d.open_count() == 20 and d.sent >= 40, timeout=10,
                 what="20 dribbling clients")
        for i in range(50):
            if i % 2:
                st, h, _ = p.request("GET", "/echo", timeout=10)
                assert st == 201 and hone(h, REPLAY) is None
            else:
                key = new_key()
                st, h, body = p.request("POST", "/echo", [("Idempotency-Key", key)], b"b%d" % i,
                                        timeout=10)
                assert st == 201 and hone(h, REPLAY) == "false"
                assert json.loads(body)["body"] == "b%d" % i
        assert d.open_count() >= 1, "the dribblers were gone before the requests ended"
    finally:
        d.close()
    assert upstream.hits("/echo") == 50
    assert upstream.hits() == 50


# --------------------------------------------------------------------------- connection flood
def _is_closed(s, wait):
    """True when the proxy closed (or reset) <s> within <wait> seconds, False
    when it is still open with nothing to read."""
    r, _, _ = select.select([s], [], [], wait)
    if not r:
        return False
    try:
        data = s.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return True
    assert data == b"" or data.startswith(b"HTTP/1.1 503"), data[:100]
    return True


@store_independent
def test_connection_flood_beyond_max_connections(proxy, upstream):
    """With --max-connections 20, of 40 idle connections 20 are kept and the 20
    others are closed at once (as the README says), not left waiting in the
    backlog; the kept ones are served; once they go away, new clients are."""
    p = proxy("--max-connections", "20", "--client-timeout", "30")
    socks = []
    try:
        for _ in range(40):
            socks.append(socket.create_connection(("127.0.0.1", p.port), timeout=5))
        time.sleep(0.5)
        closed = [s for s in socks if _is_closed(s, 0.05)]
        # A refused one is closed at once: give the stragglers a bounded while.
        deadline = time.monotonic() + 3
        while len(closed) < 20 and time.monotonic() < deadline:
            closed += [s for s in socks if s not in closed and _is_closed(s, 0.05)]
        kept = [s for s in socks if s not in closed]
        assert (len(kept), len(closed)) == (20, 20), \
            "%d connections kept, %d closed" % (len(kept), len(closed))
        # Saturated: one more is refused at once too.
        extra = socket.create_connection(("127.0.0.1", p.port), timeout=5)
        try:
            assert _is_closed(extra, 3), "a connection beyond the limit was left hanging"
        finally:
            extra.close()
        # The kept ones are served.
        for s in kept[:5]:
            s.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = recv_until_closed(s)
            assert data.startswith(b"HTTP/1.1 201"), data[:100]
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: _get_ok(p), timeout=10, what="the proxy to serve again")
    for _ in range(30):
        assert p.request("GET", "/echo", timeout=10)[0] == 201


def _get_ok(p):
    try:
        return p.request("GET", "/echo", timeout=2)[0] == 201
    except OSError:
        return False


# --------------------------------------------------------------------------- colliding keys
def _post_key(p, key_value, auth=None, body=b"same", raw_value=False):
    """POST /echo with Idempotency-Key <key_value> (sent exactly as given) and
    Authorization <auth> when not None."""
    lines = [b"Idempotency-Key: " + (key_value if isinstance(key_value, bytes)
                                      else key_value.encode())]
    if auth is not None:
        lines.append(b"Authorization: " + auth.encode())
    data = _post(lines + [_cl(len(body)), b"Connection: close"], body)
    answer, ended = exchange(p.port, data)
    st = first_status(answer)
    assert st is not None, "no answer (%s) to %r" % (ended, data)
    head, _, rest = answer.partition(b"\r\n\r\n")
    replay = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == REPLAY.lower().encode():
            replay = value.strip().decode()
    return st, replay, rest


def test_same_key_in_two_scopes_runs_concurrently(proxy, upstream, rdb):
    """A lock in one scope does not block the same key in another: while
    client A's request with key K is held at the upstream, client B's request
    with K (same target, same body) is not a 409 but runs too; each then
    replays only its own answer, and a third client executes afresh."""
    p = proxy("--scope-header", "Authorization")
    key = new_key()
    path = "/hold?id=" + key
    a = [("Authorization", "Bearer alice"), ("Idempotency-Key", key)]
    b = [("Authorization", "Bearer bob"), ("Idempotency-Key", key)]
    get_a = in_thread(p.request, "POST", path, a, b"same", timeout=30)
    wait_for(lambda: upstream.received("Idempotency-Key", key) == 1, what="A at the upstream")
    get_b = in_thread(p.request, "POST", path, b, b"same", timeout=30)
    wait_for(lambda: upstream.received("Idempotency-Key", key) == 2, timeout=10,
             what="B at the upstream while A is held (a 409 would be a cross-scope lock)")
    upstream.release(key)
    sa, ha, ba = get_a()
    sb, hb, bb = get_b()
    assert (sa, sb) == (200, 200) and hone(ha, REPLAY) == hone(hb, REPLAY) == "false"
    assert seq_of(ba) != seq_of(bb)
    for hdrs, mine in ((a, ba), (b, bb)):
        st, h, body = p.request("POST", path, hdrs, b"same")
        assert hone(h, REPLAY) == "true" and body == mine
    st, h, body = p.request("POST", path, [("Idempotency-Key", key)], b"same")
    assert hone(h, REPLAY) == "false" and seq_of(body) not in (seq_of(ba), seq_of(bb))
    assert upstream.hits("/hold") == 3
    if p.store == "redis":
        assert redis_keys(rdb, key) == sorted(
            "idem:%s:%s" % (scope_hex(v), key) for v in ("Bearer alice", "Bearer bob", None))


def test_keys_crafted_against_the_store_key_layout_never_collide(proxy, upstream, rdb):
    """The store key is <prefix><32 hex scope>:<key>. Keys holding ':' '{' '}'
    '*' '?' '[' — including ones that spell out another client's scope and key,
    a Redis hash tag or a glob — are plain keys of their own scope: each
    executes once, never replays another key's or another client's record, and
    overwrites nothing."""
    p = proxy()
    alice, mallory = "Bearer alice", "Bearer mallory"
    sa, sm = scope_hex(alice), scope_hex(mallory)
    st, replay, alice_body = _post_key(p, "k", alice)
    assert (st, replay) == (201, "false")
    if p.store == "redis":
        assert redis_keys(rdb, "k") == ["idem:%s:k" % sa], "the layout this test attacks"
    crafted = ["k", "%s:k" % sa, "idem:%s:k" % sa, ":k", "k:", "::", ":", "*", "k*", "*k", "?",
               "[k]", "{k}", "{%s}:k" % sa, "idem:*", "%s:*" % sa, "{idem:%s:k}" % sa]
    seqs = {seq_of(alice_body)}
    stored = {("alice", "k")}
    for who, auth, scope in (("mallory", mallory, sm), ("alice", alice, sa)):
        for key in crafted:
            if (who, key) in stored:
                continue
            st, replay, body = _post_key(p, key, auth)
            assert (st, replay) == (201, "false"), "%s's key %r replayed something: %r" % (
                who, key, body[:200])
            assert seq_of(body) not in seqs
            seqs.add(seq_of(body))
            stored.add((who, key))
            if p.store == "redis":
                assert rdb.exists("idem:%s:%s" % (scope, key)) == 1, (who, key)
    assert upstream.hits("/echo") == len(stored)
    # Nothing was overwritten: every record replays its own answer.
    st, replay, body = _post_key(p, "k", alice)
    assert (replay, body) == ("true", alice_body)
    for who, auth in (("mallory", mallory), ("alice", alice)):
        for key in crafted:
            st, replay, _ = _post_key(p, key, auth)
            assert replay == "true", (who, key)
    assert upstream.hits("/echo") == len(stored)
    if p.store == "redis":  # a record and its tombstone (doc/configuration.md, Tombstones) each
        assert rdb.dbsize() == 2 * len(stored)


# Header values sent, grouped by the key they denote (README.md, What it does
# with each request: The key; a quoted sf-string, quotes removed and \" \\
# unescaped, and the bare token with the same content are one key; nothing else
# is decoded).
KEY_FORMS = [
    [b"abc", b'"abc"'],
    [b'"\\"abc\\""'],           # the key "abc", quotes included
    [b"'abc'"],                  # single quotes are key bytes
    [b'"a\\\\b"'],               # a\b
    [b'"a\\\\\\\\b"'],           # a\\b
    [b'"a\\"b"'],                # a"b
    [b"ab", b'"ab"'],
    [b"%61bc"],                  # never percent-decoded
    [b"ABC", b'"ABC"'],          # case matters
]


def test_key_forms_differing_by_quoting_or_escapes(proxy, upstream):
    """Forms of one key (bare and quoted) replay each other; keys that differ
    only by escapes, inner quotes, percent-encoding or case are distinct: each
    executes once and never gets another's answer."""
    p = proxy()
    seen = set()
    for group in KEY_FORMS:
        first = None
        for value in group:
            st, replay, body = _post_key(p, value)
            assert st == 201, (value, st, body[:200])
            if first is None:
                assert replay == "false", "%r replayed another key's answer" % value
                assert seq_of(body) not in seen
                seen.add(seq_of(body))
                first = body
            else:
                assert (replay, body) == ("true", first), "%r is not %r" % (value, group[0])
    assert upstream.hits("/echo") == len(KEY_FORMS)


@pytest.mark.parametrize("value", [b"  abc", b"abc  ", b"\tabc\t"],
                         ids=["leading", "trailing", "tabs"])
def test_whitespace_around_the_key_is_not_part_of_it(proxy, upstream, value):
    """RFC 9110 §5.5: leading and trailing whitespace is not part of a field
    value, so it is neither an invalid key nor another key: it replays abc."""
    p = proxy()
    st, replay, body = _post_key(p, b"abc")
    assert (st, replay) == (201, "false")
    st, replay, body2 = _post_key(p, value)
    assert (st, replay, body2) == (201, "true", body), (value, st, body2[:200])
    assert upstream.hits("/echo") == 1


def test_key_length_is_counted_after_unescaping_and_never_truncated(proxy, upstream):
    """The 255-byte limit applies to the key after unescaping: 255 escaped
    backslashes (512 bytes on the wire) are a valid key, 256 are not; a
    256-byte key is refused, never truncated into the 255-byte key sharing its
    first 255 bytes."""
    p = proxy()
    escaped = b'"' + b"\\\\" * 255 + b'"'
    st, replay, body = _post_key(p, escaped)
    assert (st, replay) == (201, "false")
    st, replay, body2 = _post_key(p, escaped)
    assert (st, replay, body2) == (201, "true", body)
    st, replay, body3 = _post_key(p, b'"' + b"\\\\" * 256 + b'"')
    assert st == 400 and json.loads(body3)["code"] == "idempotency_key_invalid"
    k255 = "K" * 254 + "z"
    st, replay, b255 = _post_key(p, k255)
    assert (st, replay) == (201, "false")
    for longer in (k255 + "z", k255 + "y", '"%sz"' % k255):
        st, replay, b = _post_key(p, longer)
        assert st == 400 and replay is None, (longer[-3:], st, b[:200])
        assert json.loads(b)["code"] == "idempotency_key_invalid"
    assert upstream.hits("/echo") == 2
    st, replay, b = _post_key(p, k255)
    assert (replay, b) == ("true", b255)
