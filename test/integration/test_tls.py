"""TLS to the upstream and on the listener (doc/configuration.md, Options;
Recipes: HTTPS both ways), and upstream errors
that name their cause: a real HTTPS upstream (fixtures/upstream.py behind
Python's ssl module) with a throwaway CA made by the openssl CLI
(fixtures.pki.make_pki), and real TLS clients (curl, Python's ssl)."""
import json
import os
import socket
import ssl
import subprocess
import warnings

import pytest

from fixtures.client import assert_problem, hone, http_request, keyed, new_key
from fixtures.marks import store_independent
from fixtures.pki import make_pki
from fixtures.proxy import run_binary
from fixtures.upstream import FakeUpstream

REPLAY = "X-Idempotency-Replayed"

# https:// goes through libcurl whatever the option; the http:// upstreams
# here (errors that name their cause) run on both clients.
pytestmark = pytest.mark.both_clients


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def server_context(cert, key, client_ca=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@pytest.fixture
def https_upstream(pki):
    """An HTTPS upstream whose certificate the test CA signed for localhost
    and 127.0.0.1."""
    srv = FakeUpstream(tls=server_context(pki.server_crt, pki.server_key)).start()
    yield srv
    srv.stop()


@pytest.fixture
def wrong_name_upstream(pki):
    """An HTTPS upstream whose certificate names wrong.example only."""
    srv = FakeUpstream(tls=server_context(pki.wrong_crt, pki.wrong_key)).start()
    yield srv
    srv.stop()


@pytest.fixture
def mtls_upstream(pki):
    """An HTTPS upstream that asks for a client certificate of the test CA."""
    srv = FakeUpstream(tls=server_context(pki.server_crt, pki.server_key,
                                          client_ca=pki.ca_crt)).start()
    yield srv
    srv.stop()


def executes_then_replays_at(p, upstream, path="/echo"):
    key = new_key()
    st, h, body = p.request(*keyed(key, path=path))
    assert st == 201, (st, body, p.stderr())
    assert hone(h, REPLAY) == "false"
    st2, h2, body2 = p.request(*keyed(key, path=path))
    assert (st2, hone(h2, REPLAY), body2) == (201, "true", body)
    assert upstream.hits(path) == 1
    return json.loads(body)


def failed_with(p, cause, log_words=(), status=502, code="upstream_unavailable"):
    """A keyed POST fails with <status> whose detail names <cause>, and the
    log line names it too (with <log_words>, curl's own)."""
    st, h, body = p.request(*keyed(new_key()))
    doc = assert_problem((st, h, body), status, code)
    assert cause.lower() in doc["detail"].lower(), doc
    err = p.stderr()
    line = [ln for ln in err.splitlines() if "upstream POST /echo failed" in ln]
    assert line and cause in line[-1], err
    for w in log_words:
        assert w in line[-1], line[-1]
    return line[-1]


# ---------------------------------------------------------------- upstream TLS

@store_independent
def test_https_upstream_verified_by_ca_file(proxy, https_upstream, pki):
    url = "https://localhost:%d" % https_upstream.port
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, upstream_url=url)
    doc = executes_then_replays_at(p, https_upstream)
    assert ["X-Forwarded-Proto", "http"] in doc["headers"]


@store_independent
def test_https_upstream_unknown_ca_is_named(proxy, https_upstream):
    # The system's CAs do not know the test CA.
    p = proxy(upstream_url="https://localhost:%d" % https_upstream.port)
    failed_with(p, "the upstream's TLS certificate failed verification",
                ("unable to get local issuer certificate",))
    assert https_upstream.hits() == 0
    # Nothing reached the upstream: the key was released and runs again.
    assert "may have reached it" not in p.stderr()


@store_independent
def test_https_upstream_by_ip_with_server_name(proxy, wrong_name_upstream, pki):
    ip_url = "https://127.0.0.1:%d" % wrong_name_upstream.port
    # The certificate does not name 127.0.0.1: refused, and why.
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, upstream_url=ip_url)
    failed_with(p, "the upstream's TLS certificate failed verification", ("127.0.0.1",))
    p.stop()
    # The name it does carry, verified and sent as SNI.
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, "--upstream-tls-server-name",
              "wrong.example", upstream_url=ip_url)
    doc = executes_then_replays_at(p, wrong_name_upstream)
    # The client's Host still goes upstream, not the server name.
    assert ["Host", "127.0.0.1:%d" % p.port] in doc["headers"], doc["headers"]
    p.stop()
    # Another name is refused.
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, "--upstream-tls-server-name",
              "other.example", upstream_url=ip_url)
    failed_with(p, "the upstream's TLS certificate failed verification", ("other.example",))


@store_independent
def test_https_upstream_client_certificate(proxy, mtls_upstream, pki):
    url = "https://localhost:%d" % mtls_upstream.port
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, "--upstream-tls-cert-file", pki.client_crt,
              "--upstream-tls-key-file", pki.client_key, upstream_url=url)
    executes_then_replays_at(p, mtls_upstream)
    p.stop()
    # Without one the upstream's TLS refuses the handshake. With TLS 1.3 its
    # alert comes after curl wrote the request, which the upstream never
    # read: the key is released, not made unknown, and the cause is named.
    # (The upstream closes as nginx does, reading what came before it closes:
    # one that closed on unread bytes would reset the connection, losing the
    # alert, and the proxy could then only say the request may have reached it.)
    p = proxy("--upstream-tls-ca-file", pki.ca_crt, upstream_url=url)
    key = new_key()
    for _ in range(2):
        doc = assert_problem(p.request(*keyed(key)), 502, "upstream_unavailable")
        assert "the upstream refused the tls handshake" in doc["detail"].lower(), doc
    assert mtls_upstream.hits() == 1  # only the first proxy's request
    assert "refused the connection" not in p.stderr()
    assert "may have reached it" not in p.stderr()


@store_independent
def test_sighup_reloads_the_upstream_tls_files(proxy, https_upstream, pki, tmp_path):
    """SIGHUP reads --upstream-tls-ca-file (and the client pair) again for
    new connections; between reloads the bytes read last are used, so a
    file replaced with one that does not load changes nothing
    (doc/operations.md, Reloading TLS files)."""
    import shutil
    import signal

    ca = str(tmp_path / "upstream-ca.pem")
    shutil.copy(pki.other_ca_crt, ca)  # not the CA that signed the upstream
    p = proxy("--upstream-tls-ca-file", ca,
              upstream_url="https://localhost:%d" % https_upstream.port)
    assert p.request("GET", "/x")[0] == 502
    shutil.copy(pki.ca_crt, ca)
    assert p.request("GET", "/x")[0] == 502  # read at start: not yet
    p.proc.send_signal(signal.SIGHUP)
    p.wait_log("the upstream's TLS files read again", timeout=5)
    assert p.request("GET", "/x")[0] == 200
    with open(ca, "w") as f:
        f.write("not a certificate\n")
    # the upstream closes this connection: the next request opens another
    assert p.request("GET", "/connection-header")[0] == 200
    p.proc.send_signal(signal.SIGHUP)
    p.wait_log("nothing was changed", timeout=5)
    assert p.request("GET", "/x")[0] == 200
    assert https_upstream.hits("/x") == 2


@store_independent
def test_an_exchange_running_through_a_reload_does_not_keep_the_old_tls_files(
        proxy, https_upstream, pki, tmp_path):
    """A transfer that runs while SIGHUP reads the TLS files again ends with
    the old ones: its handle is not kept for the next exchange, which gets
    the files read last (here a CA that does not know the upstream)."""
    import shutil
    import signal

    from fixtures.probes import start_held

    ca = str(tmp_path / "upstream-ca.pem")
    shutil.copy(pki.ca_crt, ca)
    p = proxy("--upstream-tls-ca-file", ca,
              upstream_url="https://localhost:%d" % https_upstream.port)
    key = new_key()
    held = start_held(p, key, upstream=https_upstream)
    shutil.copy(pki.other_ca_crt, ca)
    p.proc.send_signal(signal.SIGHUP)
    p.wait_log("the upstream's TLS files read again", timeout=5)
    https_upstream.release(key)
    assert held()[0] == 200
    st, _, body = p.request("GET", "/x")
    assert st == 502 and b"verification" in body, (st, body)


@store_independent
def test_https_upstream_insecure_warns(proxy, https_upstream):
    p = proxy("--upstream-tls-insecure",
              upstream_url="https://localhost:%d" % https_upstream.port)
    assert "--upstream-tls-insecure: the upstream's certificate is not verified" in p.stderr()
    executes_then_replays_at(p, https_upstream)


@store_independent
def test_tls_to_a_plain_upstream_is_a_failed_handshake(proxy, upstream):
    p = proxy(upstream_url="https://127.0.0.1:%d" % upstream.port)
    failed_with(p, "the TLS handshake with the upstream failed")


# ---------------------------------------------------------------- causes named

@store_independent
def test_upstream_name_that_does_not_resolve_is_named(proxy):
    p = proxy(upstream_url="http://nosuch.invalid:80")
    failed_with(p, "the upstream's host name does not resolve", ("nosuch.invalid",))


@store_independent
def test_upstream_refused_is_named(proxy):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    p = proxy(upstream_url="http://127.0.0.1:%d" % port)
    failed_with(p, "the upstream refused the connection")


@store_independent
def test_upstream_reset_after_sending_is_named(proxy, upstream):
    p = proxy()
    st, h, body = p.request(*keyed(new_key(), path="/reset"))
    doc = assert_problem((st, h, body), 502, "upstream_unavailable")
    assert "after the request was sent" in doc["detail"], doc
    assert "the request may have reached it" in p.stderr()


def test_check_config_warns_for_an_upstream_that_does_not_resolve():
    r = run_binary(["--upstream", "http://nosuch.invalid:8080", "--check-config"])
    assert r.returncode == 0, r.stderr
    assert b"warning: --upstream: the host nosuch.invalid does not resolve" in r.stderr
    r = run_binary(["--upstream", "http://127.0.0.1:8080", "--check-config"])
    assert r.returncode == 0 and b"warning" not in r.stderr, r.stderr


# ---------------------------------------------------------------- start-up checks

def test_tls_options_are_checked_at_start(tmp_path, pki):
    def start(*args, upstream="https://127.0.0.1:1"):
        return run_binary(["--upstream", upstream, "--check-config"] + list(args))

    r = start("--upstream-tls-ca-file", pki.ca_crt, upstream="http://127.0.0.1:1")
    assert r.returncode == 2 and b"--upstream-tls-ca-file: needs an https:// --upstream" \
        in r.stderr, r.stderr
    r = start("--upstream-tls-insecure", upstream="http://127.0.0.1:1")
    assert r.returncode == 2 and b"--upstream-tls-insecure: needs an https://" in r.stderr
    r = start("--upstream-tls-ca-file", str(tmp_path / "missing.pem"))
    assert r.returncode == 2 and b"--upstream-tls-ca-file: cannot read" in r.stderr, r.stderr
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    r = start("--upstream-tls-ca-file", str(bad))
    assert r.returncode == 2 and b"--upstream-tls-ca-file: cannot load the CA file" \
        in r.stderr, r.stderr
    r = start("--upstream-tls-cert-file", pki.client_crt)
    assert r.returncode == 2 and b"needs both --upstream-tls-cert-file and " \
        b"--upstream-tls-key-file" in r.stderr, r.stderr
    r = start("--upstream-tls-cert-file", pki.client_crt, "--upstream-tls-key-file",
              pki.server_key)
    assert r.returncode == 2 and b"--upstream-tls-key-file: the key" in r.stderr, r.stderr
    r = start("--upstream-tls-cert-file", str(bad), "--upstream-tls-key-file", pki.client_key)
    assert r.returncode == 2 and b"--upstream-tls-cert-file: cannot load the certificate" \
        in r.stderr, r.stderr
    r = start("--tls-cert-file", pki.server_crt)
    assert r.returncode == 2 and b"needs both --tls-cert-file and --tls-key-file" in r.stderr
    r = start("--tls-cert-file", pki.server_crt, "--tls-key-file", pki.client_key)
    assert r.returncode == 2 and b"--tls-key-file: the key" in r.stderr, r.stderr
    r = start("--tls-cert-file", pki.server_crt, "--tls-key-file", str(bad))
    assert r.returncode == 2 and b"--tls-key-file: cannot load the key" in r.stderr, r.stderr
    r = start("--upstream-tls-ca-file", pki.ca_crt, "--upstream-tls-cert-file", pki.client_crt,
              "--upstream-tls-key-file", pki.client_key, "--upstream-tls-server-name",
              "api.internal", "--tls-cert-file", pki.server_crt, "--tls-key-file",
              pki.server_key)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- the listener

def tls_listener(proxy, pki, *extra):
    return proxy("--tls-cert-file", pki.server_crt, "--tls-key-file", pki.server_key, *extra)


def curl(*args):
    return subprocess.run(["curl", "-sS", "--max-time", "10"] + list(args), capture_output=True,
                          timeout=20, stdin=subprocess.DEVNULL)


@store_independent
def test_listener_over_tls_with_curl(proxy, upstream, pki):
    p = tls_listener(proxy, pki)
    assert "(HTTPS: TLS 1.2 and 1.3)" in p.stderr()
    key = new_key()
    url = "https://localhost:%d/echo" % p.port
    outs = []
    for _ in range(2):
        r = curl("--cacert", pki.ca_crt, "-X", "POST", "-H", "Idempotency-Key: " + key,
                 "--data-binary", "x", "-D", "-", url)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.decode())
    assert "X-Idempotency-Replayed: false" in outs[0] and "X-Idempotency-Replayed: true" in outs[1]
    assert outs[0].split("\r\n\r\n", 1)[1] == outs[1].split("\r\n\r\n", 1)[1]
    assert upstream.hits("/echo") == 1
    body = json.loads(outs[0].split("\r\n\r\n", 1)[1])
    assert ["X-Forwarded-Proto", "https"] in body["headers"]
    # TLS 1.1 and older are refused; 1.2 and 1.3 both work.
    r = curl("--cacert", pki.ca_crt, "--tls-max", "1.1", url)
    assert r.returncode != 0
    for v in ("1.2", "1.3"):
        r = curl("--cacert", pki.ca_crt, "--tlsv" + v, "--tls-max", v, "-o", "/dev/null",
                 "-w", "%{http_code}", "https://localhost:%d/x" % p.port)
        assert r.returncode == 0 and r.stdout == b"200", (v, r.stderr)
    # Plain HTTP on the TLS port gets nothing, and is said once per client
    # address per 10 s; the admin listener stays plain.
    for _ in range(2):
        with pytest.raises(Exception):
            http_request("127.0.0.1", p.port, "GET", "/x", timeout=3)
    p.wait_log("a client at 127.0.0.1 sent plain HTTP", timeout=5)
    assert p.stderr().count("sent plain HTTP") == 1, p.stderr()
    assert p.admin_request("GET", "/healthz")[0] == 200


def _serial(conn):
    """The serial of the certificate <conn> (an open HTTPSConnection) was shown."""
    der = conn.sock.getpeercert(binary_form=True)
    r = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial"], input=der,
                       capture_output=True, timeout=10)
    return int(r.stdout.decode().strip().split("=", 1)[1], 16)


@store_independent
def test_sighup_reloads_the_listener_certificate(proxy, upstream, pki, tmp_path):
    """SIGHUP reads --tls-cert-file and --tls-key-file again: a new
    connection gets the renewed certificate, a kept-alive one goes on; a
    pair that does not load is refused and the last good one kept
    (doc/operations.md, Reloading TLS files)."""
    import http.client
    import shutil
    import signal
    from fixtures.pki import reissue

    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    shutil.copy(pki.server_crt, cert)
    shutil.copy(pki.server_key, key)
    p = proxy("--tls-cert-file", cert, "--tls-key-file", key)
    ctx = ssl.create_default_context(cafile=pki.ca_crt)

    def fresh():
        c = http.client.HTTPSConnection("localhost", p.port, context=ctx, timeout=10)
        c.request("GET", "/x")
        assert c.getresponse().read() is not None
        return c

    kept = fresh()
    first = _serial(kept)
    new_crt, new_key, new_serial = reissue(pki, "renewed-%d" % p.port)
    shutil.copy(new_crt, cert)
    shutil.copy(new_key, key)
    p.proc.send_signal(signal.SIGHUP)
    p.wait_log("read again: new connections use them", timeout=5)
    c = fresh()
    assert _serial(c) == new_serial != first
    c.close()
    kept.request("GET", "/y")  # the kept connection goes on with its own
    assert kept.getresponse().status == 200 and _serial(kept) == first
    # A broken pair: the key of another certificate. The reload is refused
    # whole, and the pair in use stays.
    shutil.copy(pki.wrong_key, key)
    p.proc.send_signal(signal.SIGHUP)
    p.wait_log("is not the key of the certificate", timeout=5)
    p.wait_log("nothing was changed", timeout=5)
    c = fresh()
    assert _serial(c) == new_serial
    c.close()
    kept.close()


@store_independent
def test_listener_over_tls_with_python(proxy, upstream, pki):
    p = tls_listener(proxy, pki)
    ctx = ssl.create_default_context(cafile=pki.ca_crt)
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: py-"
                      + os.urandom(4).hex().encode()
                      + b"\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    assert data.startswith(b"HTTP/1.1 201"), data[:200]
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki.ca_crt)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        old.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, OSError)):
            with old.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
                s.recv(100)
