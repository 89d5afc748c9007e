"""Admin listener, SIGTERM (doc/configuration.md, Options; doc/guarantees.md,
Guarantees and failure behaviour)."""
import signal
import socket
import subprocess
import time

from fixtures.client import REPLAY, assert_problem, hone, http_request, new_key
from fixtures.marks import shared_store, store_independent
from fixtures.probes import (assert_free, assert_locked, assert_unknown, redis_state, start_held,
                             start_slow, stored_state)
from fixtures.waiting import wait_for


def test_admin_endpoints(proxy, upstream):
    p = proxy()
    p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    st, h, _ = p.admin_request("GET", "/healthz")
    assert st == 200
    st, _, _ = p.admin_request("GET", "/readyz")
    assert st == 200
    assert upstream.hits() == 1  # admin requests are not proxied


@store_independent
def test_admin_errors_are_problems(proxy):
    """Every error of the admin listener is problem+json (doc/operations.md,
    The admin listener): an unknown path, a method it does not take (with
    Allow), a bad /keys call."""
    p = proxy()

    def admin(method, path, body=None):
        return http_request("127.0.0.1", p.admin_port, method, path, None, body, 5.0)

    assert_problem(admin("GET", "/nope"), 404, "not_found")
    assert_problem(admin("GET", "/healthz/x"), 404, "not_found")
    for path in ("/healthz", "/readyz", "/metrics"):
        resp = admin("POST", path, b"x")
        assert_problem(resp, 405, "method_not_allowed")
        assert hone(resp[1], "Allow") == "GET, HEAD"
    resp = admin("POST", "/keys/k")
    assert_problem(resp, 405, "method_not_allowed")
    assert hone(resp[1], "Allow") == "GET, DELETE, PUT"
    resp = admin("DELETE", "/keys")
    assert_problem(resp, 405, "method_not_allowed")
    assert hone(resp[1], "Allow") == "GET"
    assert_problem(admin("GET", "/keys/%01"), 400, "bad_request")
    assert_problem(admin("DELETE", "/keys/k?scope=zz"), 400, "bad_request")
    assert_problem(admin("GET", "/keys?state=done"), 400, "bad_request")
    # what is not an error stays as it was
    st, h, body = admin("GET", "/healthz")
    assert st == 200 and body == b"ok\n"


@store_independent
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
    first = start_slow(p, key, 1500)
    p.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: _refused(p.port), timeout=2.0, what="the listening socket to close")
    st, h, _ = first()
    assert st == 200 and hone(h, REPLAY) == "false"
    assert p.proc.wait(15) == 0, p.stderr()
    if p.store == "redis":  # (the memory store ends with the process)
        assert redis_state(rdb, key) == "C"
    p.stop()


def _refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True  # reset: the probe reached the backlog just as the listener closed
    except TimeoutError:
        # A SYN that met a listener of the SO_REUSEPORT group as it was being
        # shut down is dropped, not answered: ask again.
        return False


def test_sigterm_shutdown_timeout_drops_running_request(proxy, upstream):
    p = proxy("--shutdown-timeout", "0.5")
    key = new_key()
    first = start_held(p, key)
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert time.monotonic() - t0 < 3.5
    # Its upstream call was cancelled, its lock released, its client answered.
    assert_problem(first(timeout=10), 502, "upstream_unavailable")
    p.stop()


@shared_store
def test_sigterm_shutdown_timeout_cut_request_is_unknown_shared_redis(proxy, upstream, rdb):
    """A request cut at --shutdown-timeout had reached the upstream: its key
    is unknown (doc/guarantees.md, Unknown outcomes), which only a store
    that outlives the process shows: another proxy on it answers 502
    idempotency_outcome_unknown."""
    p = proxy("--shutdown-timeout", "0.5")
    other = proxy()
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    first = start_held(p, key)
    assert_locked(other, key, req)
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert stored_state(other, key) == "U", "the cut request's key is not unknown"
    upstream.release(key)
    assert_unknown(other, req, path="/hold")
    assert_problem(first(timeout=10), 502, "upstream_unavailable")
    p.stop()


@shared_store
def test_sigterm_shutdown_timeout_releases_lock_retry_shared_redis(proxy, upstream, rdb):
    """Under --on-unknown-outcome retry the cut request's lock is released:
    gone from Redis, and another proxy on it executes the key at once."""
    p = proxy("--shutdown-timeout", "0.5", "--on-unknown-outcome", "retry")
    other = proxy()
    key = new_key()
    req = ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], b"held")
    first = start_held(p, key)
    assert_locked(other, key, req)
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0, p.stderr()
    assert stored_state(other, key) is None, "lock not released on shutdown"
    upstream.release(key)
    assert_free(other, key, req)
    assert_problem(first(timeout=10), 502, "upstream_unavailable")
    p.stop()




@store_independent
def test_drain_delay_readyz_503_while_the_listener_accepts(proxy, upstream):
    """--drain-delay: on SIGTERM /readyz is 503 at once (/healthz 200) while
    new connections are still served for the delay; then the listener
    closes and the process exits 0 (doc/operations.md, Drain)."""
    p = proxy("--drain-delay", "1.5")
    assert p.admin_request("GET", "/readyz")[:3:2] == (200, b"ready\n")
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: p.admin_request("GET", "/readyz")[0] == 503, timeout=1.0, interval=0.01,
             what="/readyz 503 on SIGTERM")
    assert time.monotonic() - t0 < 0.5
    st, _, body = p.admin_request("GET", "/readyz")
    assert (st, body) == (503, b"draining\n")
    assert p.admin_request("GET", "/healthz")[0] == 200
    # a new connection during the delay is served, keyed or not
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert time.monotonic() - t0 < 1.2, "the test itself was too slow to show the delay"
    wait_for(lambda: _refused(p.port), timeout=5.0, what="the listener to close after the delay")
    assert time.monotonic() - t0 >= 1.4
    assert p.proc.wait(10) == 0, p.stderr()
    assert "still accepting for --drain-delay 1.5 s" in p.stderr()
    p.stop()


def test_second_signal_exits_at_once(proxy, upstream):
    p = proxy()
    first = start_held(p, new_key())
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
