"""Admin listener, SIGTERM (SPEC §3, §5)."""
import signal
import socket
import subprocess
import time

from conftest import REPLAY, hone, new_key, redis_record, wait_for
from test_in_flight import start_slow


def test_admin_endpoints(proxy, upstream):
    p = proxy()
    p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    st, h, _ = p.admin_request("GET", "/healthz")
    assert st == 200
    st, _, _ = p.admin_request("GET", "/readyz")
    assert st == 200
    assert upstream.hits() == 1  # admin requests are not proxied


def test_admin_paths_not_served_on_main_listener(proxy, upstream):
    p = proxy()
    for path in ("/healthz", "/readyz", "/metrics"):
        st, _, body = p.request("GET", path)
        assert st == 200
        assert b'"unknown"' in body, "%s was not proxied: %r" % (path, body[:200])
        assert upstream.hits(path) == 1



def test_sigterm_idle_exits_0(proxy):
    p = proxy()
    t0 = time.monotonic()
    assert p.stop() == 0, p.stderr()
    assert time.monotonic() - t0 < 5


def test_sigint_exits_0(proxy):
    p = proxy()
    p.proc.send_signal(signal.SIGINT)
    try:
        rc = p.proc.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    assert rc == 0, p.stderr()
    assert p.stop() == 0


def test_sigterm_lets_running_request_finish(proxy, upstream, rdb):
    p = proxy()
    key = new_key()
    first = start_slow(p, rdb, key, 1500)
    p.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: _refused(p.port), timeout=1.0, what="the listening socket to close")
    st, h, _ = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert p.proc.wait(15) == 0, p.stderr()
    assert redis_record(rdb, key)["state"] == b"C"
    p.stop()


def _refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True  # reset: the probe reached the backlog just as the listener closed


def test_sigterm_shutdown_timeout_releases_lock(proxy, upstream, rdb):
    p = proxy("--shutdown-timeout", "0.5")
    key = new_key()
    first = start_slow(p, rdb, key, 4000)
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert time.monotonic() - t0 < 3.5
    assert redis_record(rdb, key) is None, "lock not released on shutdown"
    try:
        first(timeout=10)
    except Exception:  # noqa: BLE001  the dropped request may fail on the client side
        pass
    p.stop()




def test_second_signal_exits_at_once(proxy, upstream, rdb):
    p = proxy()
    first = start_slow(p, rdb, new_key(), 4000)
    p.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert p.proc.poll() is None, "the first signal waits for the running request"
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(5) == 0, p.stderr()
    assert time.monotonic() - t0 < 1.5, "a second signal did not stop the drain"
    try:
        first(timeout=5)
    except OSError:
        pass  # its connection was dropped: the operator asked to stop at once
    p.stop()
