"""A key's scope follows the principal (doc/configuration.md, Scope): a
verified bearer token's issuer and claims, so that a refreshed token is the
same scope, or a header an authenticating gateway in front sets, honoured
only from its addresses. Every token that does not verify is refused with
401 before anything is locked or forwarded. Tokens are minted by PyJWT
(fixtures/tokens.py)."""
import base64
import json
import random
import signal
import time

import pytest

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.proxy import run_binary
from fixtures.routes import access_lines, write_config
from fixtures.tokens import (AUDIENCE, ISSUER, JwksServer, bearer, ec_key, hs256_by_hand, jwk,
                             jwks, public_pem, rsa_key, token, unsigned)
from fixtures.waiting import wait_for

SECRET = b"an HS256 secret of more than thirty-two bytes, for tests"


def jwt_config(tmp_path, keys_line, extra=""):
    return write_config(tmp_path, """
        scope:
          jwt:
            %s
            issuer: "%s"
            audience: %s
            claims: [sub]
            leeway: 5
        %s
        """ % (keys_line, ISSUER, AUDIENCE, extra))


@pytest.fixture
def keys(tmp_path):
    """One key of each kind, and the files that hold their public halves."""
    k = {"rsa": rsa_key(), "ec": ec_key()}
    (tmp_path / "rsa.jwks").write_bytes(jwks(jwk(k["rsa"], kid="r1")))
    (tmp_path / "ec.pem").write_bytes(public_pem(k["ec"]))
    (tmp_path / "both.jwks").write_bytes(jwks(jwk(k["rsa"], kid="r1"), jwk(k["ec"], kid="e1")))
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    return k


def post(p, key, headers, body=b'{"amount": 1000}', path="/echo"):
    return p.request("POST", path, [("Idempotency-Key", key)] + list(headers), body)


def failures(p, reason):
    return metrics_value(p.metrics(), "idemproxy_scope_failures_total",
                         {"route": "default", "reason": reason})


def assert_unverified(resp):
    assert_problem(resp, 401, "idempotency_scope_unverified")
    assert hone(resp[1], "WWW-Authenticate") == 'Bearer error="invalid_token"'


ALGS = [("RS256", "rsa", "keys: %s/rsa.jwks", "r1"),
        ("PS256", "rsa", "keys: %s/both.jwks", "r1"),
        ("ES256", "ec", "keys: %s/ec.pem", None),
        ("HS256", None, "secret-file: %s/secret", None)]


@pytest.mark.parametrize("alg,kind,keys_line,kid", ALGS, ids=[a[0] for a in ALGS])
def test_a_refreshed_token_is_the_same_scope(proxy, upstream, tmp_path, keys, alg, kind,
                                             keys_line, kid):
    p = proxy("--config", str(jwt_config(tmp_path, keys_line % tmp_path)))
    signer = keys[kind] if kind else SECRET
    key = new_key()
    st, h, b1 = post(p, key, bearer(token(signer, alg, kid=kid, sub="alice")))
    assert st == 201 and hone(h, REPLAY) == "false", b1
    # The SDK refreshed its token: another iat, exp and jti, the same subject.
    st, h, b2 = post(p, key, bearer(token(signer, alg, kid=kid, sub="alice", iat=1, jti="x")))
    assert st == 201 and hone(h, REPLAY) == "true" and b2 == b1
    # Another subject with the same key is another scope: it runs.
    st, h, b3 = post(p, key, bearer(token(signer, alg, kid=kid, sub="bob")))
    assert st == 201 and hone(h, REPLAY) == "false" and b3 != b1
    assert upstream.hits("/echo") == 2
    assert "eyJ" not in p.stderr()  # no token in any log line


def test_every_bad_token_is_refused_and_nothing_forwarded(proxy, upstream, tmp_path, keys):
    p = proxy("--config", str(jwt_config(tmp_path, "keys: %s/both.jwks" % tmp_path)))
    rsa, ec = keys["rsa"], keys["ec"]
    good = token(rsa, "RS256", kid="r1")
    head, payload, sig = good.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged["sub"] = "mallory"
    tampered = "%s.%s.%s" % (head, base64.urlsafe_b64encode(
        json.dumps(forged).encode()).rstrip(b"=").decode(), sig)
    cases = [
        ("algorithm", unsigned()),
        # algorithm confusion: the RSA public key's PEM as an HS256 secret
        ("algorithm", hs256_by_hand(public_pem(rsa), kid="r1")),
        ("algorithm", hs256_by_hand(public_pem(rsa))),
        ("algorithm", token(ec, "ES256", kid="r1")),
        ("unknown_kid", token(rsa, "RS256", kid="nobody")),
        ("signature", tampered),
        ("signature", token(rsa_key(), "RS256", kid="r1")),
        ("expired", token(rsa, "RS256", kid="r1", exp=1700000000)),
        ("expired", token(rsa, "RS256", kid="r1", nbf=4000000000)),
        ("claims", token(rsa, "RS256", kid="r1", iss="https://other.test/")),
        ("claims", token(rsa, "RS256", kid="r1", aud="another-api")),
        ("claims", token(rsa, "RS256", kid="r1", sub=None)),
        ("malformed", "not-a-token"),
        ("malformed", good + ".x"),
    ]
    for reason, tok in cases:
        before = failures(p, reason)
        assert_unverified(post(p, new_key(), bearer(tok)))
        assert failures(p, reason) == before + 1, reason
    # An audience in a list, and a token within the leeway, verify.
    assert post(p, new_key(), bearer(token(rsa, "RS256", kid="r1",
                                           aud=["x", AUDIENCE])))[0] == 201
    assert post(p, new_key(), bearer(token(ec, "ES256", kid="e1",
                                           exp=int(time.time()) - 2)))[0] == 201
    assert upstream.hits("/echo") == 2
    assert metrics_value(p.metrics(), "idemproxy_requests_total",
                         {"route": "default", "outcome": "scope_refused"}) == len(cases)


def test_require_scope_and_on_unverified(proxy, upstream, tmp_path, keys):
    cfg = jwt_config(tmp_path, "keys: %s/rsa.jwks" % tmp_path, """
        require-scope: true
        routes:
          - name: open
            match: {path: /echo}
            on-unverified: passthrough
        """)
    p = proxy("--config", str(cfg), "--log-format", "json")
    resp = post(p, new_key(), [], path="/strict")
    assert_problem(resp, 401, "idempotency_scope_missing")
    assert hone(resp[1], "WWW-Authenticate") == "Bearer"
    assert upstream.hits() == 0
    assert metrics_value(p.metrics(), "idemproxy_scope_failures_total",
                         {"route": "default", "reason": "missing"}) == 1
    # Unverified on a passthrough route: forwarded unprotected, each time.
    key, bad = new_key(), bearer(token(rsa_key(), "RS256", kid="r1"))
    assert post(p, key, bad)[0] == 201
    assert post(p, key, bad)[0] == 201
    assert upstream.hits("/echo") == 2
    line = access_lines(p)[-1]
    assert line["outcome"] == "passthrough" and "on-unverified" in line["reason"], line
    # A request without a key is not scoped at all.
    assert p.request("POST", "/strict", [], b"x")[0] != 401


def test_keys_url_rotation_and_refetch_limit(proxy, upstream, tmp_path):
    a, b = rsa_key(), rsa_key()
    srv = JwksServer(jwks(jwk(a, kid="a")))
    try:
        p = proxy("--config", str(jwt_config(tmp_path, "keys-url: %s" % srv.url)))
        assert srv.count() == 1  # fetched at start
        assert post(p, new_key(), bearer(token(a, "RS256", kid="a")))[0] == 201
        # The issuer rotates to key b before this proxy's next refresh: the
        # first token signed with it waits for the refetch its kid asks for.
        srv.set(jwks(jwk(a, kid="a"), jwk(b, kid="b")))
        key = new_key()
        st, h, body = post(p, key, bearer(token(b, "RS256", kid="b")))
        assert st == 201 and hone(h, REPLAY) == "false", body
        assert srv.count() == 2
        assert hone(post(p, key, bearer(token(b, "RS256", kid="b")))[1], REPLAY) == "true"
        # Another unknown kid within 30 s: refused at once, and no fetch.
        before = failures(p, "unknown_kid")
        assert_unverified(post(p, new_key(), bearer(token(b, "RS256", kid="c"))))
        assert_unverified(post(p, new_key(), bearer(token(b, "RS256", kid="d"))))
        time.sleep(0.5)
        assert srv.count() == 2
        assert failures(p, "unknown_kid") == before + 2 == 2
    finally:
        srv.close()


def test_keys_url_unreachable_is_keys_unavailable(proxy, upstream, tmp_path):
    srv = JwksServer(b"")
    url = srv.url
    srv.close()  # nothing listens there any more
    p = proxy("--config", str(jwt_config(tmp_path, "keys-url: %s" % url)))
    assert_unverified(post(p, new_key(), bearer(token(rsa_key(), "RS256", kid="a"))))
    assert failures(p, "keys_unavailable") == 1
    assert "cannot fetch the JWKS" in p.stderr()
    assert upstream.hits() == 0


def test_a_refreshed_token_does_not_run_an_unknown_request_again(proxy, upstream, tmp_path,
                                                                 keys):
    """Token A's request is reset after it reached the upstream: its key is
    unknown. The client refreshes its token and retries: same principal, so
    the retry gets 502 idempotency_outcome_unknown, and it ran once."""
    p = proxy("--config", str(jwt_config(tmp_path, "keys: %s/rsa.jwks" % tmp_path)))
    key = new_key()
    st, _, _ = post(p, key, bearer(token(keys["rsa"], "RS256", kid="r1", sub="u")), path="/reset")
    assert st == 502
    retry = post(p, key, bearer(token(keys["rsa"], "RS256", kid="r1", sub="u", jti="refreshed")),
                 path="/reset")
    assert_problem(retry, 502, "idempotency_outcome_unknown")
    assert upstream.hits("/reset") == 1


def test_same_scope_iff_same_issuer_and_claims(proxy, upstream, tmp_path):
    """Random pairs of tokens: the second request with the first's key is a
    replay exactly when iss and the named claims are equal (whatever else the
    tokens carry)."""
    cfg = write_config(tmp_path, """
        scope:
          jwt: {secret-file: %s/secret, issuer: "%s", claims: [sub, tenant]}
        """ % (tmp_path, ISSUER))
    (tmp_path / "secret").write_bytes(SECRET)
    p = proxy("--config", str(cfg))
    rnd = random.Random(39)
    values = ["a", "b", 1, "1", {"x": 1}]
    for _ in range(40):
        c1 = {"sub": rnd.choice(values), "tenant": rnd.choice(values)}
        c2 = dict(c1) if rnd.random() < 0.5 else {"sub": rnd.choice(values),
                                                     "tenant": rnd.choice(values)}
        key = new_key()
        t1 = token(SECRET, "HS256", iat=rnd.randrange(10 ** 9), **c1)
        t2 = token(SECRET, "HS256", jti=str(rnd.random()), **c2)
        assert post(p, key, bearer(t1))[0] == 201
        st, h, _ = post(p, key, bearer(t2))
        assert st == 201 and hone(h, REPLAY) == ("true" if c1 == c2 else "false"), (c1, c2)


def test_trusted_principal_header(proxy, upstream, tmp_path):
    trusted = write_config(tmp_path, """
        scope: {header: X-Principal, trusted: [127.0.0.0/8, "::1"]}
        """, name="trusted.yaml")
    elsewhere = write_config(tmp_path, """
        require-scope: true
        scope: {header: X-Principal, trusted: [10.0.0.0/8]}
        routes:
          - name: lax
            match: {path: /echo}
            require-scope: false
        """, name="elsewhere.yaml")
    p = proxy("--config", str(trusted))
    key = new_key()
    assert hone(post(p, key, [("X-Principal", "alice")])[1], REPLAY) == "false"
    assert hone(post(p, key, [("X-Principal", "alice")])[1], REPLAY) == "true"
    assert hone(post(p, key, [("X-Principal", "bob")])[1], REPLAY) == "false"
    # From a peer outside the networks the header is ignored: as if absent.
    q = proxy("--config", str(elsewhere))
    key = new_key()
    assert hone(post(q, key, [("X-Principal", "alice")])[1], REPLAY) == "false"
    assert hone(post(q, key, [("X-Principal", "bob")])[1], REPLAY) == "true"
    assert_problem(post(q, new_key(), [("X-Principal", "alice")], path="/other"), 401,
                   "idempotency_scope_missing")


def test_scope_config_problems(tmp_path, upstream):
    (tmp_path / "junk").write_text("hello")
    for text, needle in [
        ("scope: {jwt: {keys: %s/nope, issuer: x}}" % tmp_path, "cannot read"),
        ("scope: {jwt: {keys: %s/junk, issuer: x}}" % tmp_path, "not a JWKS"),
        ("scope: {jwt: {keys-url: 'http://example.com/k', issuer: x}}", "not an https:// URL"),
        ("scope: {jwt: {keys-url: 'http://127.0.0.1@evil.test/k', issuer: x}}",
         "not an https:// URL"),
        ("scope: {jwt: {secret-file: %s/junk, issuer: x, claims: []}}" % tmp_path,
         "name at least one claim"),
        ("routes:\n  - name: r\n    scope-header: [A]\n    scope: {header: X, trusted: [\"::1\"]}",
         "not both"),
        ("scope: {jwt: {secret-file: %s/junk, issuer: x}}" % tmp_path, "at least 32 bytes"),
        ("scope: {jwt: {secret-file: %s/junk}}" % tmp_path, "issuer is required"),
        ("scope: {header: X-P}", "needs trusted"),
        ("scope: {header: X-P, trusted: [10.0.0.300/8]}", "is not a network"),
        ("scope: {headers: [A], jwt: {issuer: x}}", "give one of"),
        ("scope: {jwts: {}}", "unknown key 'jwts'"),
    ]:
        path = write_config(tmp_path, text + "\n")
        r = run_binary(["--config", str(path), "--upstream", upstream.url, "--check-config"])
        assert r.returncode == 2 and needle in r.stderr.decode(), (text, r.stderr)


def test_keys_files_reload_on_sighup(proxy, upstream, tmp_path):
    a, b = ec_key(), ec_key()
    (tmp_path / "keys.pem").write_bytes(public_pem(a))
    p = proxy("--config", str(jwt_config(tmp_path, "keys: %s/keys.pem" % tmp_path)))
    assert post(p, new_key(), bearer(token(a, "ES256")))[0] == 201
    assert_unverified(post(p, new_key(), bearer(token(b, "ES256"))))
    reloads = lambda: metrics_value(p.metrics(), "idemproxy_config_reloads_total",  # noqa: E731
                                    {"result": "ok"})
    (tmp_path / "keys.pem").write_bytes(public_pem(b))
    p.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads() == 1, timeout=10, what="the reload")
    assert post(p, new_key(), bearer(token(b, "ES256")))[0] == 201
    assert_unverified(post(p, new_key(), bearer(token(a, "ES256"))))
    # A keys file that does not load: the reload changes nothing.
    (tmp_path / "keys.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnope\n")
    p.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: metrics_value(p.metrics(), "idemproxy_config_reloads_total",
                                   {"result": "error"}) == 1, timeout=10, what="the refusal")
    assert "keys.pem" in p.stderr()
    assert post(p, new_key(), bearer(token(b, "ES256")))[0] == 201


def test_a_principal_never_hashes_like_another_kind(proxy, upstream, tmp_path):
    """A client of a route scoped by its own headers cannot send the value a
    trusted gateway sets on another route and land in that principal's keys:
    each kind of principal hashes its tag first."""
    cfg = write_config(tmp_path, """
        routes:
          - name: gateway
            match: {host: gw.test}
            scope: {header: X-Principal, trusted: [127.0.0.0/8]}
          - name: open
            match: {host: open.test}
            scope-header: [X-Principal]
        """)
    p = proxy("--config", str(cfg))
    key = new_key()
    hdrs = [("X-Principal", "alice")]
    st, h, b1 = p.request("POST", "/echo", [("Idempotency-Key", key), ("Host", "gw.test")] + hdrs,
                          b"same")
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, b2 = p.request("POST", "/echo", [("Idempotency-Key", key), ("Host", "open.test")] + hdrs,
                          b"same")
    assert st == 201 and hone(h, REPLAY) == "false" and b2 != b1  # its own key, not alice's
    assert upstream.hits("/echo") == 2
