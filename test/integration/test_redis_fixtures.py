"""Tests of redis_fixtures itself (redis-py only, no idemproxy): the PKI, the
TLS servers, ACL users and the Sentinel set behave as the tests that use them
assume. Run:

    /usr/bin/python3 -m pytest -q -p no:cacheprovider test/integration/test_redis_fixtures.py
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import redis

sys.path.insert(0, os.path.dirname(__file__))
import redis_fixtures as rf  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.access(rf.REDIS_SERVER, os.X_OK) or shutil.which(rf.OPENSSL) is None,
    reason="needs %s and the openssl CLI" % rf.REDIS_SERVER)

# Bounds asserted on the Sentinel set, generous against the measured times
# (start-up about 1.4 s, a kill-master failover about 2.3 s on an idle machine).
STARTUP_BOUND = 10.0
FAILOVER_BOUND = 15.0


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return rf.make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki, tmp_path_factory):
    srv = rf.TlsRedisServer(tmp_path_factory.mktemp("tls"), pki)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def mtls_server(pki, tmp_path_factory):
    srv = rf.TlsRedisServer(tmp_path_factory.mktemp("mtls"), pki, tls_auth_clients="yes")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


ACL = ["user app on >secret ~idem:* &idemproxy:* +@all", "user default off"]


@pytest.fixture(scope="module", params=["plain", "tls"])
def acl_server(request, pki, tmp_path_factory):
    srv = rf.RedisInstance(tmp_path_factory.mktemp("acl"), acl=ACL,
                           pki=pki if request.param == "tls" else None)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory):
    """A plain set shared by the tests that do not fail it over."""
    ss = rf.SentinelSet(tmp_path_factory.mktemp("sentinel"))
    try:
        ss.start()
        yield ss
    finally:
        ss.stop()


@pytest.fixture
def fresh_sentinel_set(tmp_path):
    """factory(**SentinelSet kwargs): a started set of the test's own, stopped
    at teardown."""
    started = []

    def factory(**kw):
        ss = rf.SentinelSet(tmp_path / ("set%d" % len(started)), **kw)
        started.append(ss)
        return ss.start()

    yield factory
    for ss in started:
        ss.stop()


def assert_all_stopped(procs):
    for p in procs:
        assert p.proc is None, p.describe()


# --------------------------------------------------------------------------- PKI

def openssl_verify(pki, cafile, cert, *extra):
    r = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", cafile] + list(extra)
                       + [cert], capture_output=True, text=True, timeout=30, cwd=pki.dir)
    return r.returncode == 0, r.stdout + r.stderr


def test_pki_certificates(pki):
    for name in rf.Pki.FILES:
        assert os.path.getsize(pki[name]) > 0, name
    ok, out = openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslserver",
                             "-verify_hostname", "localhost")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslserver",
                             "-verify_ip", "127.0.0.1")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.client_crt, "-purpose", "sslclient")
    assert ok, out
    # the server certificate is for servers only, the client one for clients only
    assert not openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslclient")[0]
    assert not openssl_verify(pki, pki.ca_crt, pki.client_crt, "-purpose", "sslserver")[0]
    # wrong.crt: the good CA, another name only
    ok, out = openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-purpose", "sslserver",
                             "-verify_hostname", "wrong.example")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-verify_hostname", "localhost")
    assert not ok and "mismatch" in out, out
    assert not openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-verify_ip", "127.0.0.1")[0]
    # the other CA vouches for none of them
    assert not openssl_verify(pki, pki.other_ca_crt, pki.server_crt)[0]
    text = subprocess.run(["openssl", "x509", "-in", pki.ca_crt, "-noout", "-text"],
                          capture_output=True, text=True, timeout=30).stdout
    assert re.search(r"Basic Constraints: critical\s+CA:TRUE", text), text


# --------------------------------------------------------------------------- TLS

def test_tls_server_answers_with_the_right_ca(tls_server):
    assert tls_server.url() == "rediss://127.0.0.1:%d" % tls_server.port
    c = tls_server.client(check_hostname=True)  # the name checked is 127.0.0.1 (IP SAN)
    assert c.set("idem:tls", "v") is True
    assert c.get("idem:tls") == b"v"
    assert c.config_get("port") == {"port": "0"}  # no plain TCP port at all
    assert c.config_get("tls-port") == {"tls-port": str(tls_server.port)}
    c.close()


def test_tls_server_is_not_plain_redis(tls_server):
    c = redis.Redis(host="127.0.0.1", port=tls_server.port, socket_timeout=2,
                    socket_connect_timeout=2)
    with pytest.raises(redis.exceptions.ConnectionError):
        c.ping()


def test_tls_other_ca_fails_verification(tls_server, pki):
    c = tls_server.client(ca=pki.other_ca_crt)
    with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        c.ping()


def test_tls_wrong_name_fails_hostname_check_only(pki, tmp_path):
    with rf.TlsRedisServer(tmp_path, pki, cert=pki.wrong_crt, key=pki.wrong_key).start() as srv:
        assert srv.client().ping()  # the chain is good
        with pytest.raises(redis.exceptions.ConnectionError, match="mismatch"):
            srv.client(check_hostname=True).ping()
    assert srv.proc is None


def test_mutual_tls_needs_a_client_certificate(mtls_server, pki):
    c = mtls_server.client()  # sends the PKI's client certificate
    assert c.ping()
    assert c.config_get("tls-auth-clients") == {"tls-auth-clients": "yes"}
    with pytest.raises(redis.exceptions.ConnectionError):
        mtls_server.client(client_cert=False).ping()
    # a certificate that is not for clients (EKU serverAuth) is refused too
    with pytest.raises(redis.exceptions.ConnectionError):
        mtls_server.client(client_cert=(pki.server_crt, pki.server_key)).ping()


# --------------------------------------------------------------------------- ACL

def test_acl_user_permissions(acl_server):
    app = acl_server.client(username="app", password="secret")
    assert app.set("idem:x", "1") is True
    assert app.get("idem:x") == b"1"
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.set("other:x", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.publish("other:done", "x")
    # PUBLISH on idemproxy:* is allowed, and delivered
    sub = acl_server.client(username="app", password="secret").pubsub()
    sub.subscribe("idemproxy:done")
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    assert app.publish("idemproxy:done", "k1") == 1
    msg = sub.get_message(timeout=2)
    assert msg is not None and msg["data"] == b"k1", msg
    sub.close()
    app.close()


def test_acl_wrong_password_and_default_user_refused(acl_server):
    with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|Invalid"):
        acl_server.client(username="app", password="wrong").ping()
    with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|Invalid"):
        acl_server.client(username="nobody", password="secret").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):  # NOAUTH: default is off
        acl_server.client().ping()
    scheme = "rediss" if acl_server.tls else "redis"
    assert acl_server.url("app", "se cret") == "%s://app:se%%20cret@127.0.0.1:%d" % (
        scheme, acl_server.port)


def test_requirepass_server(tmp_path):
    with rf.RedisInstance(tmp_path, password="p w").start() as srv:
        assert srv.client().ping()  # the fixture's own client uses the password
        with pytest.raises(redis.exceptions.AuthenticationError):
            srv.client(password="").ping()
        with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|invalid"):
            srv.client(password="nope").ping()


# --------------------------------------------------------------------------- Sentinel

def test_sentinel_set_reports_its_master(sentinel_set):
    ss = sentinel_set
    assert ss.startup_seconds < STARTUP_BOUND, ss.startup_seconds
    assert ss.master_addr() == ss.initial_master.addr
    assert set(ss.sentinel_reports().values()) == {ss.initial_master.addr}
    assert ss.master().role() == "master"
    assert [r.role() for r in ss.replicas()] == ["slave"]
    ports = [s.port for s in ss.sentinels]
    assert len(set(ports + [n.port for n in ss.data_nodes])) == 5
    assert ss.sentinel_url() == (
        "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?master=mymaster" % tuple(ports))
    assert ss.sentinel_url(master="other", tls=True).startswith("rediss-sentinel://")
    assert ss.sentinel_url(master="other").endswith("?master=other")
    for s in ss.sentinels:  # sentinels answer as sentinels, each seeing the other two
        sens = s.command("SENTINEL", "SENTINELS", "mymaster")
        assert len(sens) == 2


def test_sentinel_set_replicates(sentinel_set):
    m = sentinel_set.master_client()
    assert m.set("idem:repl", "v1") is True
    assert m.wait(1, 5000) == 1
    (replica,) = sentinel_set.replicas()
    r = replica.client()
    assert r.get("idem:repl") == b"v1"
    with pytest.raises(redis.exceptions.ReadOnlyError):
        r.set("idem:repl", "v2")


def test_sentinel_kill_master_fails_over(fresh_sentinel_set):
    ss = fresh_sentinel_set()
    m = ss.master_client()
    m.set("idem:survives", "yes")
    assert m.wait(1, 5000) == 1
    m.close()
    (replica,) = ss.replicas()
    old_proc = ss.master().proc
    t0 = time.monotonic()
    old = ss.kill_master()
    assert old_proc.poll() is not None  # really gone
    new = ss.wait_failover(old, timeout=FAILOVER_BOUND + 5)
    took = time.monotonic() - t0
    print("sentinel start-up %.2f s, kill-master failover %.2f s" % (ss.startup_seconds, took))
    assert took < FAILOVER_BOUND, took
    assert new == replica.addr != old
    assert set(ss.sentinel_reports().values()) == {new}
    c = ss.master_client()
    assert c.execute_command("ROLE")[0] == b"master"
    assert c.get("idem:survives") == b"yes"
    assert c.set("idem:after", "1") is True  # writable
    procs = ss.data_nodes + ss.sentinels
    ss.stop()
    assert_all_stopped(procs)


def test_sentinel_tls_acl_passwords_freeze_fails_over(fresh_sentinel_set, pki):
    ss = fresh_sentinel_set(pki=pki, tls_auth_clients="yes", username="adm", password="p@ss w",
                            acl_users=["user app on >secret ~idem:* &idemproxy:* +@all"],
                            sentinel_password="sen pw")
    assert ss.startup_seconds < STARTUP_BOUND, ss.startup_seconds
    assert ss.sentinel_url() == (
        "rediss-sentinel://adm:p%%40ss%%20w@127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d"
        "?master=mymaster&sentinel_password=sen%%20pw" % tuple(s.port for s in ss.sentinels))
    # the sentinels and the data nodes want their passwords
    with pytest.raises(redis.exceptions.AuthenticationError):
        ss.sentinels[0].client(password="").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        ss.master().client(password="").ping()
    app = ss.master().client(username="app", password="secret")
    assert app.set("idem:tls", "1") is True
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.set("other:x", "1")
    assert ss.master_client().wait(1, 5000) == 1
    app.close()

    t0 = time.monotonic()
    old = ss.freeze_master()
    assert ss.node(old).frozen
    new = ss.wait_failover(old, timeout=FAILOVER_BOUND + 5)
    took = time.monotonic() - t0
    print("TLS/ACL set: start-up %.2f s, freeze-master failover %.2f s"
          % (ss.startup_seconds, took))
    assert took < FAILOVER_BOUND, took
    assert new != old
    assert ss.node(new).client(username="app", password="secret").get("idem:tls") == b"1"
    ss.thaw()
    assert not ss.node(old).frozen
    assert ss.node(old).client().ping()  # answers again once thawed
