#!/usr/bin/python3
"""One wave of slow requests, for scripts/bench's scenario 5: opens CONNS
client connections to 127.0.0.1:PORT at once, sends one POST PATH with a
BODY-byte body and its own Idempotency-Key (NONCE-i) on each, and waits for
every answer (bounded by TIMEOUT s). Prints "answered=A failed=F". The
target's peak RSS over the wave is what 1000 connections waiting on a slow
upstream cost it, with nothing stored before.

usage: wave.py PORT CONNS PATH BODY NONCE [TIMEOUT]"""
import selectors
import socket
import sys
import time


def main():
    port, conns, path, body, nonce = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                      int(sys.argv[4]), sys.argv[5])
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0
    payload = b"x" * body
    sel = selectors.DefaultSelector()
    pending = {}
    for i in range(conns):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                  b"Idempotency-Key: %s-%d\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), nonce.encode(), i, body) + payload)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        pending[s] = b""
    answered = failed = 0
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            data = pending[s] + chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            length, chunked = None, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True  # nginx passes the stub's chunked answer on
            done = sep and ((length is not None and len(rest) >= length)
                            or (chunked and rest.endswith(b"0\r\n\r\n")))
            if done or not chunk:
                ok = done and data.startswith(b"HTTP/1.1 2")
                answered += ok
                failed += not ok
                sel.unregister(s)
                s.close()
                del pending[s]
            else:
                pending[s] = data
    failed += len(pending)
    for s in pending:
        s.close()
    print("answered=%d failed=%d" % (answered, failed))


if __name__ == "__main__":
    main()
