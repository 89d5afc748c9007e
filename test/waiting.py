"""Helpers the Python suites share (test/integration, test/ops): a free
loopback port, and polling for a condition."""
import socket
import time

import pytest


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
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
