"""Redis over TLS and with ACL users (doc/stores.md, Pointing idemproxy at
Redis): the proxy's own connections against real TLS redis-servers with a
throwaway CA (fixtures/redis.py).

Verification is on by default and a certificate that fails it is a store
error (503, /readyz 503) with the reason in the log, never a silent fallback
to plain TCP; plain TCP against a TLS port and TLS against a plain port
never work either."""
import pytest

from fixtures.marks import redis_only
from fixtures.pki import make_pki
from fixtures.probes import executes_then_replays, readyz, refused_503
from fixtures.proxy import run_binary
from fixtures.redis import RedisServer, TlsRedisServer
from fixtures.waiting import wait_for

ACL = ["user app on >s3cret ~idem:* &idemproxy:* +@all",
       "user open on nopass ~idem:* &idemproxy:* +@all", "user default off"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory, pki):
    srv = TlsRedisServer(str(tmp_path_factory.mktemp("tls")), pki).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mtls_redis(tmp_path_factory, pki):
    srv = TlsRedisServer(str(tmp_path_factory.mktemp("mtls")), pki, tls_auth_clients="yes",
                         acl=ACL).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def wrong_name_redis(tmp_path_factory, pki):
    srv = TlsRedisServer(str(tmp_path_factory.mktemp("wrongname")), pki, cert=pki.wrong_crt,
                         key=pki.wrong_key).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    srv = RedisServer(str(tmp_path_factory.mktemp("acl")), acl=ACL).start()
    yield srv
    srv.stop()






def stored_keys(client):
    return [k for k in client.scan_iter(match="idem:*", count=1000)]




@redis_only
def test_rediss_verified_by_ca_executes_and_replays_redis(proxy, upstream, tls_redis, pki):
    p = proxy("--redis-tls-ca-file", pki.ca_crt, redis_url=tls_redis.url)
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200 over TLS")
    key = executes_then_replays(p, upstream)
    assert any(k.decode().endswith(":" + key) for k in stored_keys(tls_redis.client()))
    # the name form: localhost is in the certificate too
    p2 = proxy("--redis-tls-ca-file", pki.ca_crt,
               redis_url="rediss://localhost:%d" % tls_redis.port)
    executes_then_replays(p2, upstream)


@redis_only
def test_rediss_with_another_ca_is_a_store_error_with_the_reason_redis(proxy, upstream,
                                                                       tls_redis, pki):
    p = proxy("--redis-tls-ca-file", pki.other_ca_crt, redis_url=tls_redis.url)
    refused_503(p, upstream, "certificate failed verification")
    assert "TLS" in p.stderr()


@redis_only
def test_rediss_wrong_name_is_refused_and_server_name_is_what_is_checked_redis(
        proxy, upstream, wrong_name_redis, pki):
    p = proxy("--redis-tls-ca-file", pki.ca_crt, redis_url=wrong_name_redis.url)
    refused_503(p, upstream, "certificate failed verification", "mismatch")
    # the certificate is for wrong.example: that is the name to check
    p2 = proxy("--redis-tls-ca-file", pki.ca_crt, "--redis-tls-server-name", "wrong.example",
               redis_url=wrong_name_redis.url)
    wait_for(lambda: readyz(p2) == 200, timeout=5, what="/readyz 200 with the server name")
    executes_then_replays(p2, upstream)


@redis_only
def test_rediss_insecure_skips_verification_and_warns_redis(proxy, upstream, tls_redis, pki):
    p = proxy("--redis-tls-ca-file", pki.other_ca_crt, "--redis-tls-insecure",
              redis_url=tls_redis.url)
    executes_then_replays(p, upstream)
    assert "--redis-tls-insecure" in p.stderr() and "not verified" in p.stderr()


@redis_only
def test_plain_tcp_to_a_tls_port_and_tls_to_a_plain_port_never_work_redis(
        proxy, upstream, tls_redis, redis_server, pki):
    p = proxy(redis_url="redis://127.0.0.1:%d" % tls_redis.port)
    refused_503(p, upstream)
    p2 = proxy("--redis-tls-ca-file", pki.ca_crt,
               redis_url="rediss://127.0.0.1:%d" % redis_server.port)
    refused_503(p2, upstream, "TLS")


@redis_only
def test_mutual_tls_with_an_acl_user_redis(proxy, upstream, mtls_redis, pki, tmp_path):
    url = "rediss://app:s3cret@127.0.0.1:%d" % mtls_redis.port
    # no client certificate: the server hangs up in the handshake
    p = proxy("--redis-tls-ca-file", pki.ca_crt, redis_url=url)
    refused_503(p, upstream, "TLS")
    # with one, and the ACL user's password from a file (none in the URL)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    p2 = proxy("--redis-tls-ca-file", pki.ca_crt, "--redis-tls-cert-file", pki.client_crt,
               "--redis-tls-key-file", pki.client_key, "--redis-password-file", str(pw),
               redis_url="rediss://app:@127.0.0.1:%d" % mtls_redis.port)
    wait_for(lambda: readyz(p2) == 200, timeout=5, what="/readyz 200 with mutual TLS")
    executes_then_replays(p2, upstream)
    assert "s3cret" not in p2.stderr()


@redis_only
def test_acl_user_wrong_password_is_refused_and_never_logged_redis(proxy, upstream, acl_redis,
                                                                     tmp_path):
    p = proxy(redis_url="redis://app:s3cret@127.0.0.1:%d" % acl_redis.port)
    executes_then_replays(p, upstream)
    # the password file beats the URL's password (doc/stores.md, Pointing
    # idemproxy at Redis)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    p3 = proxy("--redis-password-file", str(pw),
               redis_url="redis://app:Wr0ngInUrl@127.0.0.1:%d" % acl_redis.port)
    executes_then_replays(p3, upstream)
    assert "Wr0ngInUrl" not in p3.stderr()
    p2 = proxy(redis_url="redis://app:Wr0ngPass@127.0.0.1:%d" % acl_redis.port)
    refused_503(p2, upstream, "refused")
    assert "Wr0ngPass" not in p2.stderr() and "s3cret" not in p2.stderr()
    assert "app:***@" in p2.stderr()  # the URL is logged, its password masked


@redis_only
def test_acl_user_named_alone_in_the_url_redis(proxy, upstream, acl_redis, tmp_path):
    """redis://USER@HOST names an ACL user (doc/stores.md, Pointing
    idemproxy at Redis): its password comes from --redis-password-file, or
    there is none (a nopass user); it is never taken for a password, and
    never masked as one."""
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    p = proxy("--redis-password-file", str(pw),
              redis_url="redis://app@127.0.0.1:%d" % acl_redis.port)
    executes_then_replays(p, upstream)
    assert "redis://app@127.0.0.1" in p.stderr()
    p2 = proxy(redis_url="redis://open@127.0.0.1:%d" % acl_redis.port)
    executes_then_replays(p2, upstream)
    p3 = proxy(redis_url="redis://app@127.0.0.1:%d" % acl_redis.port)  # no password: refused
    refused_503(p3, upstream, "WRONGPASS")


def test_redis_tls_options_are_checked_at_start(tmp_path, pki, upstream):
    def start(*args):
        return run_binary(["--upstream", upstream.url] + list(args))

    r = start("--redis", "redis://127.0.0.1:6379", "--redis-tls-ca-file", pki.ca_crt)
    assert r.returncode == 2 and b"--redis-tls-ca-file: needs a rediss://" in r.stderr
    r = start("--redis", "rediss://127.0.0.1:6379", "--redis-tls-cert-file", pki.client_crt)
    assert r.returncode == 2 and b"needs both --redis-tls-cert-file and" in r.stderr
    r = start("--redis", "rediss://127.0.0.1:6379", "--redis-tls-ca-file",
              str(tmp_path / "missing.pem"))
    assert r.returncode == 2 and b"--redis-tls-ca-file: cannot read" in r.stderr
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    r = start("--redis", "rediss://u:hunter2@127.0.0.1:1", "--redis-tls-ca-file", str(bad))
    assert r.returncode == 2 and b"cannot load the CA file" in r.stderr, r.stderr
    assert b"hunter2" not in r.stderr and b"u:***@" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = start("--redis", "redis://127.0.0.1:6379", "--redis-password-file", str(empty))
    assert r.returncode == 2 and b"--redis-password-file" in r.stderr
