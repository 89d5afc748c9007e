"""Helpers the Python suites share (test/integration, test/ops): a free
loopback port, and polling for a condition."""
import os
import random
import socket
import threading
import time

import pytest


# The ports below the kernel's ephemeral range (where a bind to port 0 and
# every outgoing connection land) that the workers of a pytest-xdist run share
# out, a slice each: the proxy listens with SO_REUSEPORT, so a port two
# workers both found free would be bound by both, each proxy then answering
# some of the other's requests; and a server a test stops and restarts on
# its port would find it taken by another worker or an outgoing connection.
_WORKER_PORTS = 10000
_next_port = None
_port_lock = threading.Lock()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice():
    """(first, count) of this xdist worker's ports, or None outside one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker[2:]) if worker.startswith("gw") else -1
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    except ValueError:
        return None
    low = _ephemeral_low()
    if index < 0 or workers <= 0 or index >= workers or low - _WORKER_PORTS < 1024:
        return None
    count = _WORKER_PORTS // workers
    return low - _WORKER_PORTS + index * count, count


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A TCP port free on 127.0.0.1 right now: in a pytest-xdist worker, one
    of its own slice (see _WORKER_PORTS), taken in turn; elsewhere, one the
    kernel picks."""
    global _next_port
    sl = _worker_slice()
    if sl is not None:
        first, count = sl
        with _port_lock:
            if _next_port is None:
                _next_port = random.randrange(count)
            for _ in range(count):
                port = first + _next_port
                _next_port = (_next_port + 1) % count
                if _bindable(port):
                    return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout=5.0, interval=0.05, what="condition"):
    """Polls cond() until it returns a truthy value; returns it, or fails."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)
