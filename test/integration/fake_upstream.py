"""A fake upstream API for the integration tests: a real HTTP/1.1 server
(keep-alive, one daemon thread per connection) running in a thread of the
test process, counting hits per path.

Endpoints (an optional "/api" prefix is ignored, for --upstream prefix tests):
  /echo                 any method: 201, JSON {seq, method, target, headers, body}
                        with two Set-Cookie headers and a Date unique to seq
  /answer[/...]?status=N&h=Name:Value...
                        answers as told: status N (201), each h a header, the
                        request's body as the body
  /status/N             answers status N (JSON body with seq)
  /slow?ms=N&status=S   sleeps N ms, then S (default 200) JSON with seq
  /hold?id=NAME         blocks until the test calls release(NAME) or release_all()
                        (at most HOLD_MAX seconds), then 200 JSON with seq
  /big?bytes=N          200 with an N-byte body
  /big-head?bytes=N     201 with about N bytes of extra header lines (100 bytes each)
  /chunked              200 with a chunked body
  /reset                reads the request, then resets the connection unanswered
  /connection-header    200 with Connection: close, X-Private, Keep-Alive headers
  /truncated?promise=N&send=M
                        200 announcing Content-Length N, sends M < N body bytes,
                        then closes the connection (FIN): a body cut short
  /stall-body?ms=N      200 announcing Content-Length 100, sends 10 body bytes,
                        sleeps N ms, then closes: stalls mid-body
  /close                reads the request, then closes the connection (FIN)
                        without a byte of answer (curl's "empty reply")
  /bad-status?kind=K    reads the request, writes one raw malformed answer
                        (BAD_STATUS[K]: a status line curl must refuse, or
                        bytes that are not HTTP at all), then closes
  /bad-chunked          200 chunked, then a chunk size that is not hex, then closes
  /stream?n=N&size=S&ms=M&length=1&status=C&reset=K&stall=MS&id=NAME
                        C (200) streaming N pieces of S bytes (big_body), M ms
                        apart; with length=1 announced by Content-Length, else
                        chunked (each piece a chunk); reset=K: an RST after K
                        pieces; stall=MS: a silence of MS before the last piece.
                        A write that fails (the proxy closed the connection) is
                        noted: stream_closed(NAME) says when (time.monotonic())
  /upload?rate=R&answer_at=K
                        reads the request body as it comes (Content-Length or
                        chunked), at most R bytes a second (default: no limit),
                        without keeping it: 200 JSON {bytes, sha256, chunked}; with
                        answer_at=K it answers 413 after K bytes, then drops what
                        else comes until the client stops sending, and closes;
                        early=1: 200 chunked at once, each piece echoed as it
                        comes, then "\n" and the JSON
  /sse?n=N&ms=M&id=NAME text/event-stream, chunked: N events M ms apart, each
                        "id: i\ndata: event i of NAME\n\n" written when due;
                        sent_at(NAME) lists when each went out
  anything else         200 JSON {"unknown": path}

Every fault endpoint counts as a hit like the others (the request did arrive).
"""
import email.utils
import hashlib
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DATE_BASE = 978307200  # 2001-01-01: no real clock will produce these dates
HOLD_MAX = 60.0  # a /hold the test forgot to release still ends

# /bad-status?kind=K: raw answers with a malformed status line (or none at all).
BAD_STATUS = {
    "garbage": b"\x16\x03\x01\x00\xa5garbage, not HTTP\r\n\r\n",
    "no-version": b"200 OK\r\nContent-Length: 2\r\n\r\nok",
    "bad-version": b"HTTP/x.y 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "letters": b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok",
    "short-code": b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
    "long-code": b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
    "no-code": b"HTTP/1.1\r\nContent-Length: 2\r\n\r\nok",
    "headers-only": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
}


def fake_date(seq):
    return email.utils.formatdate(DATE_BASE + seq, usegmt=True)


def big_body(n):
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz"
    return (pattern * (n // len(pattern) + 1))[:n]


def _linger(sock):
    """After a refused TLS handshake, as nginx's lingering close does: the
    alert is out; the client may have written its request already (TLS 1.3
    ends the client's handshake before the server has checked its
    certificate), and closing with those bytes unread would send a reset that
    overtakes the alert. So: FIN, then read and drop until the client closes
    (at most 2 s)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
        sock.settimeout(2.0)
        while socket.socket.recv(sock, 65536):
            pass
    except OSError:
        pass


class QuietHandler(BaseHTTPRequestHandler):
    """What every upstream of the tests shares (test_stripe_sdk.py's too):
    HTTP/1.1 keep-alive, no Nagle, no log, and a client (the proxy) that goes
    away mid-answer is no error."""
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle on, the body would
    # wait for the delayed ACK of a kept-alive connection (40 ms per answer).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, OSError):
            pass  # e.g. the proxy gave up on a slow answer (--upstream-timeout)


class _Handler(QuietHandler):
    server_version = "fake-upstream"

    # -- request body --------------------------------------------------------
    def _read_body(self):
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            out = b""
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        n = int(self.headers.get("Content-Length", "0") or "0")
        return self.rfile.read(n) if n > 0 else b""

    # -- answers -------------------------------------------------------------
    def _answer(self, status, headers, body):
        if status in (204, 304):
            body = None  # no content, no Content-Length
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _json(self, status, obj, seq, extra=()):
        body = json.dumps(obj).encode()
        headers = [("Content-Type", "application/json"), ("X-Seq", str(seq))]
        headers += list(extra)
        headers.append(("Date", fake_date(seq)))
        self._answer(status, headers, body)

    def _dispatch(self):
        srv = self.server
        split = urlsplit(self.path)
        if split.path.split("/api", 1)[-1] == "/upload" or split.path == "/upload":
            srv.record("/upload", self.command, self.path, self.headers.items(), b"")
            return self._upload({k: v[0] for k, v in parse_qs(split.query).items()})
        body = self._read_body()
        path = split.path
        if path.startswith("/api/"):
            path = path[4:]
        query = parse_qs(split.query)
        seq = srv.record(path, self.command, self.path, self.headers.items(), body)

        if path == "/echo":
            obj = {
                "seq": seq,
                "method": self.command,
                "target": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body": body.decode("latin-1"),
            }
            self._json(201, obj, seq, extra=[
                ("Set-Cookie", "a=1; Path=/"),
                ("X-Upstream", "echo"),
                ("Set-Cookie", "b=2; Path=/"),
            ])
        elif path == "/answer" or path.startswith("/answer/"):
            # Answers as told: ?status=N (201), each ?h=Name:Value a header,
            # the request's body as the body.
            hs = [tuple(h.split(":", 1)) for h in query.get("h", [])]
            self._answer(int(query.get("status", ["201"])[0]),
                         [("Content-Type", "application/json"), ("X-Seq", str(seq)),
                          ("Date", fake_date(seq))] + hs, body)
        elif path.startswith("/status/"):
            status = int(path[len("/status/"):])
            self._json(status, {"seq": seq, "status": status}, seq)
        elif path == "/slow":
            ms = int(query.get("ms", ["1000"])[0])
            time.sleep(ms / 1000.0)
            self._json(int(query.get("status", ["200"])[0]), {"seq": seq, "slept_ms": ms}, seq)
        elif path == "/hold":
            released = srv.hold_event(query.get("id", [""])[0]).wait(HOLD_MAX)
            self._json(200, {"seq": seq, "released": released}, seq)
        elif path == "/big":
            n = int(query.get("bytes", ["1024"])[0])
            self._answer(200, [("Content-Type", "application/octet-stream"),
                               ("X-Seq", str(seq)), ("Date", fake_date(seq))], big_body(n))
        elif path == "/big-head":
            n = int(query.get("bytes", ["1024"])[0])  # header bytes: lines of 100
            lines = [("X-Pad-%03d" % i, "p" * 88) for i in range(n // 100)]
            self._answer(201, [("Content-Type", "application/json"), ("X-Seq", str(seq)),
                               ("Date", fake_date(seq))] + lines, b'{"seq": %d}' % seq)
        elif path == "/chunked":
            self.send_response_only(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Date", fake_date(seq))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world %d" % seq):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        elif path == "/reset":
            # RST instead of an answer.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
        elif path == "/truncated":
            promise = int(query.get("promise", ["1000"])[0])
            send = int(query.get("send", ["10"])[0])
            self._raw_then_close(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Content-Length: %d\r\n\r\n" % promise + big_body(send))
        elif path == "/stall-body":
            ms = int(query.get("ms", ["1000"])[0])
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: 100\r\n\r\n" + big_body(10))
            self.wfile.flush()
            time.sleep(ms / 1000.0)
            self._raw_then_close(b"")
        elif path == "/close":
            self._raw_then_close(b"")
        elif path == "/bad-status":
            self._raw_then_close(BAD_STATUS[query.get("kind", ["garbage"])[0]])
        elif path == "/bad-chunked":
            self._raw_then_close(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n"
                                 b"5\r\nhello\r\nzz\r\nnot a chunk\r\n0\r\n\r\n")
        elif path == "/stream":
            self._stream(query)
        elif path == "/sse":
            self._sse(query)
        elif path == "/connection-header":
            self._json(200, {"seq": seq}, seq, extra=[
                ("Connection", "close, X-Private"),
                ("X-Private", "secret"),
                ("Keep-Alive", "timeout=5"),
                ("X-Public", "yes"),
            ])
            self.close_connection = True
        else:
            self._json(200, {"seq": seq, "unknown": path, "target": self.path,
                             "method": self.command}, seq)

    def _body_pieces(self):
        """The request body as it comes, in pieces, without keeping it."""
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                while size > 0:
                    piece = self.rfile.read(min(size, 65536))
                    if not piece:
                        return
                    size -= len(piece)
                    yield piece
                self.rfile.readline(65537)
        else:
            left = int(self.headers.get("Content-Length", "0") or "0")
            while left > 0:
                piece = self.rfile.read(min(left, 65536))
                if not piece:
                    return
                left -= len(piece)
                yield piece

    def _body_pieces_left(self):
        """What is left of a body _upload stopped reading, dropped, until the
        client stops sending (at most 2 s)."""
        try:
            self.connection.settimeout(2.0)
            while self.connection.recv(65536):
                yield
        except OSError:
            return

    def _upload(self, q):
        rate, answer_at = float(q.get("rate", "0")), int(q.get("answer_at", "-1"))
        h, total, t0 = hashlib.sha256(), 0, time.monotonic()
        early = q.get("early") == "1"
        if early:  # the head now, and each piece echoed as it comes
            self.send_response_only(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
        for piece in self._body_pieces():
            h.update(piece)
            total += len(piece)
            if early:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            if answer_at >= 0 and total >= answer_at:
                # As servers do (nginx's lingering close): the answer goes
                # out, and the rest of the body is read and dropped until
                # the client stops sending, so that no reset overtakes it.
                self.close_connection = True
                self._answer(413, [("Content-Type", "application/json")], b'{"early": true}')
                for _ in self._body_pieces_left():
                    pass
                return
            if rate:
                ahead = total / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        body = json.dumps({"bytes": total, "sha256": h.hexdigest(), "chunked": chunked,
                           "expect": self.headers.get("Expect")}).encode()
        if early:  # the echo, then a line with the summary
            self.wfile.write(b"%x\r\n\n%s\r\n0\r\n\r\n" % (len(body) + 1, body))
            self.wfile.flush()
            return
        self._answer(200, [("Content-Type", "application/json")], body)

    def _stream(self, query):
        q = {k: v[0] for k, v in query.items()}
        n, size, ms = int(q.get("n", "4")), int(q.get("size", "1024")), int(q.get("ms", "0"))
        length, name = q.get("length") == "1", q.get("id", "")
        reset, stall = int(q.get("reset", "-1")), int(q.get("stall", "0"))
        piece = big_body(size)
        self.send_response_only(int(q.get("status", "200")))
        self.send_header("Content-Type", "application/octet-stream")
        if length:
            self.send_header("Content-Length", str(n * size))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.wfile.flush()
            for i in range(n):
                if i == reset:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if ms and i:
                    time.sleep(ms / 1000.0)
                if stall and i == n - 1:
                    time.sleep(stall / 1000.0)
                self.wfile.write(piece if length else b"%x\r\n%s\r\n" % (size, piece))
                self.wfile.flush()
            if not length:  # trailer=1: a trailer field that looks like a status line
                trailer = b"HTTP/1.1 200 OK\r\n" if q.get("trailer") == "1" else b""
                self.wfile.write(b"0\r\n%s\r\n" % trailer)
                self.wfile.flush()
        except OSError:
            self.server.note_closed(name)
            self.close_connection = True

    def _sse(self, query):
        q = {k: v[0] for k, v in query.items()}
        n, ms, name = int(q.get("n", "5")), int(q.get("ms", "500")), q.get("id", "")
        self.send_response_only(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.wfile.flush()
            for i in range(n):
                if i:
                    time.sleep(ms / 1000.0)
                ev = b"id: %d\ndata: event %d of %s\n\n" % (i, i, name.encode())
                self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                self.wfile.flush()
                self.server.note_sent(name)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.server.note_closed(name)
            self.close_connection = True

    def _raw_then_close(self, data):
        """Writes raw bytes (no framing of ours), then closes with a FIN."""
        if data:
            self.wfile.write(data)
            self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _dispatch


class FakeUpstream(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, port=0, tls=None):
        """<tls>: an ssl.SSLContext (server side): the upstream speaks HTTPS,
        each connection's handshake done in its own thread."""
        super().__init__(("127.0.0.1", port), _Handler)
        self._tls = tls
        self._lock = threading.Lock()
        self._seq = 0
        self._hits = {}
        self.requests = []  # (method, target, [(name, value)], body)
        self._thread = None
        self._conns = set()
        self.connections = 0  # accepted connections, to check keep-alive reuse
        self._holds = {}  # /hold id -> threading.Event
        self._closed = {}  # /stream, /sse id -> when a write found the connection closed
        self._sent = {}  # /sse id -> when each event went out

    def note_closed(self, name):
        with self._lock:
            self._closed.setdefault(name, time.monotonic())

    def stream_closed(self, name):
        with self._lock:
            return self._closed.get(name)

    def note_sent(self, name):
        with self._lock:
            self._sent.setdefault(name, []).append(time.monotonic())

    def sent_at(self, name):
        with self._lock:
            return list(self._sent.get(name, []))

    def process_request(self, request, client_address):
        with self._lock:
            self._conns.add(request)
            self.connections += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):  # quiet
        pass

    def get_request(self):
        sock, addr = super().get_request()
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request, client_address):
        if self._tls is not None:
            try:
                request.do_handshake()
            except OSError:
                _linger(request)
                return
        super().finish_request(request, client_address)

    @property
    def port(self):
        return self.server_address[1]

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % ("https" if self._tls is not None else "http", self.port)

    def record(self, path, method, target, headers, body):
        with self._lock:
            self._seq += 1
            self._hits[path] = self._hits.get(path, 0) + 1
            self.requests.append((method, target, list(headers), body))
            return self._seq

    def hits(self, path=None):
        with self._lock:
            if path is None:
                return sum(self._hits.values())
            return self._hits.get(path, 0)

    def received(self, name, value):
        """How many requests arrived carrying header <name> (any case) with <value>."""
        name = name.lower()
        with self._lock:
            return sum(1 for _, _, headers, _ in self.requests
                       if any(k.lower() == name and v == value for k, v in headers))

    def hold_event(self, hold_id):
        with self._lock:
            ev = self._holds.get(hold_id)
            if ev is None:
                ev = self._holds[hold_id] = threading.Event()
            return ev

    def release(self, hold_id):
        """Lets the /hold?id=<hold_id> requests (now and later) answer."""
        self.hold_event(hold_id).set()

    def release_all(self):
        with self._lock:
            events = list(self._holds.values())
        for ev in events:
            ev.set()

    def reset(self):
        with self._lock:
            self._hits.clear()
            self.requests.clear()

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.release_all()
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:  # also end kept-alive connections: the upstream is gone
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


if __name__ == "__main__":
    import sys
    srv = FakeUpstream(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(srv.url, flush=True)
    srv.serve_forever()
