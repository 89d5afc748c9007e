#!/usr/bin/python3
"""A small payments API to put idemproxy in front of (used by scripts/run).

Python 3 standard library only. It numbers every payment it really creates, so
a replay is visibly the same object, and `GET /payments` shows how many exist.
Every payment is forgotten on exit.

  POST /payments        JSON {"amount": <integer > 0>, "currency": "<3 letters>"}
                        -> 201 {"id": "pay_000001", "number": 1, "amount": ...,
                                "currency": ..., "created": "<UTC time>"}
                        with Location: /payments/pay_000001; 400 for a bad body
  POST /slow/payments   the same, after sleeping --slow-seconds (default 5)
  GET  /payments        200 {"count": N, "in_progress": M, "payments": [...]}
                        (in_progress: slow creations still sleeping)
  GET  /payments/<id>   200 the payment, or 404
  POST /webhooks/payments
                        an event delivery, JSON {"id": "evt_...", ...}: the API
                        processes every delivery it gets (it does not deduplicate):
                        200 {"received": "<id>", "processed": N}
  GET  /webhooks        200 {"processed": N, "events": [ids in order]}

Usage: /usr/bin/python3 examples/payments_api.py --port 3000 [--slow-seconds 5] [--quiet]
It listens on 127.0.0.1 only, logs one line per created payment on stderr
(every request with --verbose), and stops with exit status 0 on SIGTERM or SIGINT.
"""
import argparse
import datetime
import json
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

MAX_BODY = 64 * 1024


class Ledger:
    """The payments created so far; one lock for the counter and the list."""

    def __init__(self):
        self.lock = threading.Lock()
        self.payments = []
        self.events = []  # webhook deliveries processed, duplicates included
        self.by_id = {}
        self.in_progress = 0

    def create(self, amount, currency):
        with self.lock:
            number = len(self.payments) + 1
            now = datetime.datetime.now(datetime.timezone.utc)
            p = {
                "id": "pay_%06d" % number,
                "number": number,
                "amount": amount,
                "currency": currency,
                "created": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            }
            self.payments.append(p)
            self.by_id[p["id"]] = p
            return p

    def listing(self):
        with self.lock:
            return {"count": len(self.payments), "in_progress": self.in_progress,
                    "payments": list(self.payments)}

    def deliver(self, event_id):
        """Processes an event delivery; returns how many were processed."""
        with self.lock:
            self.events.append(event_id)
            return len(self.events)

    def deliveries(self):
        with self.lock:
            return {"processed": len(self.events), "events": list(self.events)}

    def get(self, pid):
        with self.lock:
            return self.by_id.get(pid)

    def begin_slow(self, delta):
        with self.lock:
            self.in_progress += delta


def parse_payment(body):
    """Returns ((amount, currency), None) or (None, error message)."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "the body is not JSON"
    if not isinstance(obj, dict):
        return None, "the body must be a JSON object"
    amount, currency = obj.get("amount"), obj.get("currency", "EUR")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return None, "amount must be a positive integer (in cents)"
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return None, "currency must be three capital letters, like EUR"
    return (amount, currency), None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as idemproxy reuses its upstream connections
    server_version = "payments-api"
    # Head and body go out in two writes: with Nagle on, the body would wait
    # for the delayed ACK of a kept-alive connection (40 ms per answer).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("payments-api: %s\n" % (fmt % args))

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, OSError):
            pass

    def _read_body(self):
        """The request body, or None when it is over MAX_BODY."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return out if len(out) <= MAX_BODY else None
                out += self.rfile.read(size)
                self.rfile.readline(1024)
                if len(out) > MAX_BODY:
                    self.close_connection = True
                    return None
        n = int(self.headers.get("Content-Length", "0") or "0")
        if n > MAX_BODY:
            self.close_connection = True
            return None
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, status, obj, headers=()):
        body = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status, message):
        self._send(status, {"error": message})

    def do_GET(self):
        path = urlsplit(self.path).path
        if path == "/payments":
            return self._send(200, self.server.ledger.listing())
        if path == "/webhooks":
            return self._send(200, self.server.ledger.deliveries())
        m = re.fullmatch(r"/payments/(pay_\d+)", path)
        if m:
            p = self.server.ledger.get(m.group(1))
            return self._send(200, p) if p else self._error(404, "no such payment")
        return self._error(404, "no such resource")

    do_HEAD = do_GET

    def do_POST(self):
        path = urlsplit(self.path).path
        body = self._read_body()
        if path not in ("/payments", "/slow/payments", "/webhooks/payments"):
            return self._error(404, "no such resource")
        if body is None:
            return self._error(413, "the body is over %d bytes" % MAX_BODY)
        if path == "/webhooks/payments":
            return self._webhook(body)
        fields, err = parse_payment(body)
        if err:
            return self._error(400, err)
        ledger = self.server.ledger
        if path == "/slow/payments":
            ledger.begin_slow(+1)
            try:
                time.sleep(self.server.slow_seconds)
            finally:
                ledger.begin_slow(-1)
        p = ledger.create(*fields)
        if not self.server.quiet:
            key = self.headers.get("Idempotency-Key")
            sys.stderr.write("payments-api: created %s (%d %s)%s\n"
                             % (p["id"], p["amount"], p["currency"],
                                ", Idempotency-Key: %s" % key if key else ""))
        self._send(201, p, [("Location", "/payments/" + p["id"])])

    def _webhook(self, body):
        try:
            event = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("id"), str):
            return self._error(400, "an event is a JSON object with a string id")
        n = self.server.ledger.deliver(event["id"])
        if not self.server.quiet:
            sys.stderr.write("payments-api: processed event %s (delivery %d)\n" % (event["id"], n))
        self._send(200, {"received": event["id"], "processed": n})

    def _not_allowed(self):
        self._read_body()
        self._send(405, {"error": "method not allowed"}, [("Allow", "GET, HEAD, POST")])

    do_PUT = do_PATCH = do_DELETE = _not_allowed


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description="A small payments API for the idemproxy demo.")
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    ap.add_argument("--slow-seconds", type=float, default=5.0,
                    help="how long POST /slow/payments sleeps before creating (default 5)")
    ap.add_argument("--quiet", action="store_true", help="log nothing")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    args = ap.parse_args()

    srv = Server(("127.0.0.1", args.port), Handler)
    srv.ledger = Ledger()
    srv.slow_seconds = args.slow_seconds
    srv.quiet = args.quiet
    srv.verbose = args.verbose and not args.quiet

    def stop(signum, frame):
        # shutdown() waits for serve_forever() to return: not from its own thread.
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
