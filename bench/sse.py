#!/usr/bin/python3
"""Server-sent events through each target, for scripts/bench's scenario 7:
sends N GET PATH requests to each TARGET=PORT on 127.0.0.1, one at a time,
the targets in turn (so that a slow moment of the machine falls on all of
them), each on a connection of its own, and times from the request's first
byte to the first complete event (its blank line), and to the stream's end.
Prints one line per request: "TARGET first_ms total_ms events status"
(first_ms -1 when no event came; status 0 when no answer came).

usage: sse.py N PATH TARGET=PORT...

http.client undoes the chunked encoding; read1() returns what one read of
the socket brought, so an event is seen as soon as it arrives, not once a
buffer is full."""
import http.client
import sys
import time


def one(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    first, events, status, data = -1.0, 0, 0, b""
    try:
        conn.connect()  # not timed: what is timed is the proxy's, not the handshake
        t0 = time.perf_counter()
        conn.request("GET", path, headers={"Accept": "text/event-stream"})
        resp = conn.getresponse()
        status = resp.status
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            data += chunk
            n = data.count(b"\n\n")
            if n and first < 0:
                first = (time.perf_counter() - t0) * 1000
            events = n
        total = (time.perf_counter() - t0) * 1000
    except (OSError, http.client.HTTPException):
        total = -1.0
    finally:
        conn.close()
    return first, total, events, status


def main():
    n, path = int(sys.argv[1]), sys.argv[2]
    targets = [a.split("=", 1) for a in sys.argv[3:]]
    for _ in range(n):
        for name, port in targets:
            first, total, events, status = one(int(port), path)
            print(f"{name} {first:.2f} {total:.2f} {events} {status}", flush=True)


if __name__ == "__main__":
    main()
