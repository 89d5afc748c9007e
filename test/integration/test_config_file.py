"""The configuration file on the command line (doc/configuration.md,
Configuration file: The file, Problems; doc/configuration.md, Options):
--check-config on a valid file and on a broken one (every problem as
PATH:LINE:COLUMN), a file that will not start, --config and
IDEMPROXY_CONFIG, flag > environment > file, and every option of --help as
a key of the file. Reloading is test_reload.py's.
"""
import json
import re

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key
from fixtures.marks import redis_only, store_independent
from fixtures.pki import make_pki
from fixtures.probes import redis_keys
from fixtures.proxy import run_binary
from fixtures.routes import check_lines, write_config
from fixtures.waiting import free_port


# --------------------------------------------------------------------------- helpers
def cli_args():
    return ["--listen", "127.0.0.1:%d" % free_port(),
            "--admin-listen", "127.0.0.1:%d" % free_port()]


# =========================================================================== 1. the command line
def test_check_config_valid_file(tmp_path):
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        max-body: 2M
        scope-header: [Authorization, Stripe-Account]
        routes:
          - name: payments
            match: {methods: [POST], path: /v1/payments}
            require-key: true
          - name: stripe-webhooks
            match: {methods: [POST], path: /webhooks/stripe}
            key: {json: /id}
            scope-header: []
          - name: cloudevents
            match: {path: /events/*}
            key: {headers: [ce-source, ce-id]}
          - name: legacy
            match: {path: /v1/*}
            key: {header: X-Idempotency, fallback: fingerprint}
            errors: stripe
          - name: internal
            match: {path: /internal/*}
            enforce: false
    """)
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert len(out.splitlines()) == 1 and out.endswith("\n"), out
    assert str(path) in out and "5 routes" in out, out
    assert r.stderr == b""


BROKEN = """\
upstream: http://127.0.0.1:3000
ttl: abc
bogus-option: 1
check-config: true
routes:
  - name: Bad Name
    match: {path: nopath}
  - name: dup
    key: {json: id}
  - name: dup
    errors: soap
    match: {host: "a b", paths: /x}
  - match: {path: /y}
    enforce: maybe
"""
# (line, column) of each problem of BROKEN: the value that is wrong, or the key
BROKEN_AT = {(2, 6), (3, 1), (4, 1), (6, 11), (7, 19), (9, 17), (10, 11), (11, 13), (12, 19),
             (12, 26), (13, 5), (14, 14)}


def test_check_config_invalid_file_prints_every_problem(tmp_path):
    path = write_config(tmp_path, BROKEN, name="broken.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == b""
    got = check_lines(r.stderr, path)
    assert {(ln, col) for ln, col, _ in got} == BROKEN_AT and len(got) == len(BROKEN_AT), got
    # a few messages, at the value (or key) that is wrong
    by_at = {(ln, col): msg for ln, col, msg in got}
    assert "ttl" in by_at[(2, 6)]
    assert "bogus-option" in by_at[(3, 1)]
    assert "check-config" in by_at[(4, 1)]
    assert "Bad Name" in by_at[(6, 11)]
    assert "soap" in by_at[(11, 13)]
    assert "'dup'" in by_at[(10, 11)]
    assert "paths" in by_at[(12, 26)] and "maybe" in by_at[(14, 14)]
    assert "name is required" in by_at[(13, 5)]


def test_starting_with_a_broken_file_exits_2_with_its_problems(tmp_path):
    path = write_config(tmp_path, BROKEN, name="broken.yaml")
    r = run_binary(["--config", str(path)] + cli_args())
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert {(ln, col) for ln, col, _ in check_lines(r.stderr, path)} == BROKEN_AT
    # the same with the file named by IDEMPROXY_CONFIG
    r = run_binary(cli_args(), env={"IDEMPROXY_CONFIG": str(path)})
    assert r.returncode == 2
    assert {(ln, col) for ln, col, _ in check_lines(r.stderr, path)} == BROKEN_AT


@pytest.mark.parametrize("text,line", [
    pytest.param("upstream: [unterminated\n", 2, id="unterminated-flow"),
    pytest.param("routes:\n  - name: a\n    match: {path: /a}\n  bad indent\n", 5,
                 id="bad-indent"),  # line 5: where libyaml notices it
    pytest.param("upstream: http://127.0.0.1:1\n---\nttl: 5\n", 2, id="two-documents"),
])
def test_check_config_yaml_syntax_error(tmp_path, text, line):
    path = write_config(tmp_path, text, name="syntax.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2
    got = check_lines(r.stderr, path)
    assert len(got) == 1 and got[0][0] == line, got


@pytest.mark.parametrize("text,at,says", [
    # a misspelt key names the nearest at every level, not only the top
    ("upstrem: http://127.0.0.1:1\n", (1, 1), "unknown key 'upstrem' (did you mean upstream?)"),
    ("routes:\n  - name: a\n    tll: 5\n", (3, 5),
     "route: unknown key 'tll' (did you mean ttl?)"),
    ("routes:\n  - name: a\n    match: {pth: /a}\n", (3, 13),
     "match: unknown key 'pth' (did you mean path?)"),
    ("routes:\n  - name: a\n    key: {heder: X-Id}\n", (3, 11),
     "key: unknown key 'heder' (did you mean header?)"),
    ("routes:\n  - name: a\n    fingerprint: {bdy: json}\n", (3, 19),
     "fingerprint: unknown key 'bdy' (did you mean body?)"),
    ("routes:\n  - name: a\n    scope: {jwtt: {}}\n", (3, 13),
     "scope: unknown key 'jwtt' (did you mean jwt?)"),
    ("routes:\n  - name: a\n    scope: {jwt: {isuer: x}}\n", (3, 19),
     "scope.jwt: unknown key 'isuer' (did you mean issuer?)"),
    ("routes:\n  - name: a\n    resource: {jsn: /id}\n", (3, 16),
     "resource: unknown key 'jsn' (did you mean json?)"),
    # a tab, which libyaml's own words do not name
    ("routes:\n\t- name: a\n", (2, 1), "this is a tab, and YAML indents with spaces only"),
    ("routes:\n  - name: a\n  \tttl: 5\n", None, "this is a tab, and YAML indents with spaces"),
    # a store URL a typo away from a store's, or written without its //
    ("store: postgresq://db/pay\n", (1, 8), "'postgresq' is no store's scheme: did you mean "
     "postgresql://?; use postgresql://"),
    ("store: rediss//cache:6380\n", (1, 8), "a rediss URL begins rediss:// (a colon, two "
     "slashes); use a Redis URL"),
])
def test_config_messages_name_what_was_meant(tmp_path, text, at, says):
    """doc/configuration.md, Problems: each message says what was meant."""
    path = write_config(tmp_path, "upstream: http://127.0.0.1:1\n" * ("upstr" not in text) + text,
                        name="c.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    got = check_lines(r.stderr, path)
    assert len(got) == 1, got
    line, col, msg = got[0]
    if at:
        shift = 0 if "upstr" in text else 1
        assert (line - shift, col) == at, got
    assert says in msg, got
    assert "postgresql://, postgres://, redis://" not in msg, msg  # not every scheme


def test_routes_that_are_not_a_list_are_refused(tmp_path):
    """One route written without its "- ": `routes` is then a mapping, a
    value of the wrong type (doc/configuration.md, Configuration file), and
    must not be taken for no routes at all."""
    path = write_config(tmp_path, """
        upstream: http://127.0.0.1:3000
        routes:
          name: payments
          match: {methods: [POST], path: /v1/payments}
          require-key: true
    """, name="routes-mapping.yaml")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 2, (r.stdout, r.stderr)
    got = check_lines(r.stderr, path)
    assert len(got) == 1 and got[0][0] in (2, 3) and "routes" in got[0][2], got
    r = run_binary(["--config", str(path)] + cli_args())
    assert r.returncode == 2, (r.stdout, r.stderr)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_config_file_exits_2_naming_it(tmp_path, what):
    path = tmp_path / ("absent.yaml" if what == "missing" else "a-directory.yaml")
    if what == "directory":
        path.mkdir()
    for args in (["--check-config", "--config", str(path)], ["--config", str(path)] + cli_args()):
        r = run_binary(args + ["--upstream", "http://127.0.0.1:1"])
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        err = r.stderr.decode().strip()
        assert len(err.splitlines()) == 1 and str(path) in err, err


@store_independent
def test_precedence_flag_env_file_for_max_body(proxy, upstream, tmp_path):
    path = str(write_config(tmp_path, "max-body: 100\n"))

    def limit_is(p, n):
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x" * n)
        assert st == 201 and hone(h, REPLAY) == "false"
        assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())],
                                 b"x" * (n + 1)), 413, "payload_too_large")

    limit_is(proxy("--config", path), 100)
    limit_is(proxy("--config", path, env={"IDEMPROXY_MAX_BODY": "200"}), 200)
    limit_is(proxy("--config", path, "--max-body", "300", env={"IDEMPROXY_MAX_BODY": "200"}), 300)
    limit_is(proxy("--config", path, "--max-body", "300"), 300)


@store_independent
def test_precedence_flag_beats_the_files_upstream(proxy, upstream, tmp_path):
    """The file names an upstream nobody listens on; the fixture's --upstream wins."""
    path = str(write_config(tmp_path, "upstream: http://127.0.0.1:%d\n" % free_port()))
    p = proxy("--config", path)
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"
    assert upstream.hits("/echo") == 1
    # and without the flag, the file's upstream is the one used (502: nobody there)
    p2 = proxy("--config", path, upstream_url=False)
    st, _, b = p2.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 502 and json.loads(b)["code"] == "upstream_unavailable"
    assert upstream.hits("/echo") == 1


@store_independent
def test_precedence_a_list_from_env_or_flag_replaces_the_files(proxy, upstream, tmp_path):
    path = str(write_config(tmp_path, "scope-header: [X-Tenant]\nmethods: [DELETE]\n"))

    def replays(p):
        """Replay headers of one key sent by (tenant t1, user u1), then (t2, u1)."""
        key = new_key()
        return [hone(p.request("POST", "/echo", [("Idempotency-Key", key), ("X-Tenant", t),
                                                  ("X-User", "u1")], b"x")[1], REPLAY)
                for t in ("t1", "t2")]

    assert replays(proxy("--config", path)) == [None, None]  # POST is not enforced
    env = {"IDEMPROXY_METHODS": "POST", "IDEMPROXY_SCOPE_HEADER": "X-User"}
    assert replays(proxy("--config", path, env=env)) == ["false", "true"]  # X-Tenant is gone
    env = {"IDEMPROXY_METHODS": "POST"}
    assert replays(proxy("--config", path, "--scope-header", "X-User", env=env)) == [
        "false", "true"]
    assert replays(proxy("--config", path, env=env)) == ["false", "false"]  # the file's scope


@redis_only
def test_precedence_flag_env_file_for_ttl_on_redis(proxy, upstream, rdb, tmp_path):
    path = str(write_config(tmp_path, "ttl: 1000\n"))

    def ttl_is(p, s):
        key = new_key()
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
        assert hone(h, REPLAY) == "false"
        pttl = rdb.pttl(redis_keys(rdb, key)[0])
        assert (s - 10) * 1000 < pttl <= s * 1000, (s, pttl)

    ttl_is(proxy("--config", path), 1000)
    ttl_is(proxy("--config", path, env={"IDEMPOTENCY_DEFAULT_TTL_SEC": "2000"}), 2000)
    ttl_is(proxy("--config", path, env={"IDEMPOTENCY_DEFAULT_TTL_SEC": "2000",
                                        "IDEMPROXY_TTL": "3000"}), 3000)
    ttl_is(proxy("--config", path, "--ttl", "4000", env={"IDEMPROXY_TTL": "3000"}), 4000)


@store_independent
def test_idemproxy_config_names_the_file(proxy, upstream, tmp_path):
    strict = str(write_config(tmp_path, "require-key: true\n"))
    lax = str(write_config(tmp_path, "routes: []\n"))
    p = proxy(env={"IDEMPROXY_CONFIG": strict})
    assert_problem(p.request("POST", "/echo", body=b"x"), 400, "idempotency_key_missing", "2.1")
    # --config beats IDEMPROXY_CONFIG
    p = proxy("--config", lax, env={"IDEMPROXY_CONFIG": strict})
    st, h, _ = p.request("POST", "/echo", body=b"x")
    assert st == 201 and hone(h, REPLAY) is None
    assert upstream.hits("/echo") == 1
    # --check-config reads it too
    r = run_binary(["--check-config", "--upstream", "http://127.0.0.1:1"],
                   env={"IDEMPROXY_CONFIG": strict})
    assert r.returncode == 0 and strict in r.stdout.decode(), (r.stdout, r.stderr)


# --------------------------------------------------------------------------- every option is a key
HELP_ACTIONS = ("--help", "--version", "--check-config", "--config")


def help_options():
    """{flag: default or None} of `idemproxy --help`'s Options section (as
    test_manpage.parse_help reads it)."""
    r = run_binary(["--help"])
    assert r.returncode == 0, r.stderr
    options, current, section = {}, None, None
    for line in r.stdout.decode().splitlines():
        if line == "Options:":
            section = "options"
        elif line.endswith(":") and not line.startswith(" "):
            section = None
        elif section and line.startswith("  ") and not line.startswith("   "):
            current = line.strip().partition(" ")[0]
            options[current] = None
        elif section and current and line.strip().startswith("[") and line.strip().endswith("]"):
            for part in line.strip()[1:-1].split(", "):
                if part.startswith("default "):
                    options[current] = part[len("default "):]
    return options


def yaml_scalar(v):
    return v if re.fullmatch(r"[A-Za-z0-9_./,+-]+", v) else json.dumps(v)


def test_every_help_option_is_a_file_key(tmp_path):
    for name in ("password", "ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "token").write_text("an-admin-token-of-some-length-0123456789\n")
    (tmp_path / "store-keys").write_text("k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n")
    pki = make_pki(str(tmp_path / "pki"))  # TLS files are loaded by --check-config
    # options with no default: a valid sample value
    samples = {
        "--upstream": "https://127.0.0.1:3000",  # https: the upstream TLS options apply
        "--upstream-tls-ca-file": pki.ca_crt,
        "--upstream-tls-cert-file": pki.client_crt,
        "--upstream-tls-key-file": pki.client_key,
        "--upstream-tls-server-name": "api.example.com",
        "--tls-cert-file": pki.server_crt,
        "--tls-key-file": pki.server_key,
        "--store": "",  # none: --redis names the store (one of the two, not both)
        "--store-password-file": str(tmp_path / "password"),
        "--redis": "rediss://127.0.0.1:6380",  # rediss: the TLS options below apply
        "--redis-password-file": str(tmp_path / "password"),
        "--redis-tls-ca-file": str(tmp_path / "ca.pem"),
        "--redis-tls-cert-file": str(tmp_path / "cert.pem"),
        "--redis-tls-key-file": str(tmp_path / "key.pem"),
        "--redis-tls-server-name": "redis.example.com",
        "--admin-token-file": str(tmp_path / "token"),
        "--store-encryption-key-file": str(tmp_path / "store-keys"),
        "--otlp-endpoint": "http://127.0.0.1:4318/v1/traces",
    }
    options = help_options()
    assert "--ttl" in options and "--max-body" in options, options
    lines = []
    for flag, default in options.items():
        if flag in HELP_ACTIONS:
            continue
        value = default if default is not None else samples.get(flag)
        assert value is not None, "no default and no sample value for %s" % flag
        lines.append("%s: %s" % (flag[2:], yaml_scalar(value)))
    path = tmp_path / "every-option.yaml"
    path.write_text("\n".join(lines) + "\n")
    r = run_binary(["--check-config", "--config", str(path)])
    assert r.returncode == 0, (path.read_text(), r.stderr.decode())
    assert len(r.stdout.decode().splitlines()) == 1
    # and each is a key of the file: an unknown one is not
    bad = tmp_path / "unknown-option.yaml"
    bad.write_text(path.read_text() + "no-such-option: 1\n")
    r = run_binary(["--check-config", "--config", str(bad)])
    assert r.returncode == 2
    got = check_lines(r.stderr, bad)
    assert got == [(len(lines) + 1, 1, got[0][2])] and "no-such-option" in got[0][2], got
