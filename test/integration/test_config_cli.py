"""Command line and environment (doc/configuration.md, Options)."""
import socket

import pytest

from fixtures.client import REPLAY, assert_problem, hone, new_key, recv_until_closed
from fixtures.marks import store_independent
from fixtures.probes import assert_free, redis_keys
from fixtures.proxy import run_binary
from fixtures.waiting import free_port

OPTIONS = [
    "--listen", "--upstream", "--redis", "--admin-listen", "--methods", "--key-header",
    "--replay-header", "--require-key", "--scope-header", "--key-prefix", "--ttl", "--max-ttl",
    "--ttl-header", "--lock-ttl", "--no-cache-status", "--max-body", "--max-response",
    "--memory-max-bytes", "--upstream-timeout", "--client-timeout", "--shutdown-timeout",
    "--store-timeout", "--wait", "--on-store-error", "--max-connections", "--log-format",
    "--log-level",
]


def base_args():
    return ["--listen", "127.0.0.1:%d" % free_port(),
            "--admin-listen", "127.0.0.1:%d" % free_port()]


def test_help_mentions_every_option():
    r = run_binary(["--help"])
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    missing = [o for o in OPTIONS if o not in out]
    assert not missing, "--help does not mention: %s" % missing


def test_help_mentions_environment_variables():
    r = run_binary(["--help"])
    out = r.stdout.decode()
    names = ["IDEMPROXY_REDIS_URL", "IDEMPOTENCY_ENABLED", "IDEMPOTENCY_DEFAULT_TTL_SEC"]
    names += ["IDEMPROXY_" + o[2:].upper().replace("-", "_") for o in OPTIONS if o != "--redis"]
    missing = [n for n in names if n not in out]
    assert not missing, "--help does not mention: %s" % missing


BAD = [
    (["--ttl", "0"], "--ttl"),
    (["--ttl", "abc"], "--ttl"),
    (["--ttl", "-5"], "--ttl"),
    (["--max-body", "1X"], "--max-body"),
    (["--max-body", "-1"], "--max-body"),
    (["--max-response", "K"], "--max-response"),
    (["--on-store-error", "maybe"], "--on-store-error"),
    (["--on-unknown-outcome", "maybe"], "--on-unknown-outcome"),
    (["--upstream-late-timeout", "-1"], "--upstream-late-timeout"),
    (["--lock-ttl", "0"], "--lock-ttl"),
    (["--upstream-timeout", "0"], "--upstream-timeout"),
    (["--upstream-timeout", "-1"], "--upstream-timeout"),
    (["--store-timeout", "x"], "--store-timeout"),
    (["--client-timeout", "0"], "--client-timeout"),
    (["--log-format", "xml"], "--log-format"),
    (["--log-level", "loud"], "--log-level"),
    (["--max-connections", "many"], "--max-connections"),
    (["--no-cache-status", "6xx"], "--no-cache-status"),
    (["--listen", "nohostport"], "--listen"),
    (["--bogus-option"], "--bogus-option"),
]


@pytest.mark.parametrize("args,name", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_exits_2(args, name):
    r = run_binary(["--upstream", "http://127.0.0.1:1"] + base_args() + args, timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, (r.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, "expected one line on stderr, got %r" % err
    assert name in lines[0], lines[0]


def test_ttl_above_max_ttl_exits_2():
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--ttl", "200", "--max-ttl", "100"] +
                   base_args(), timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1 and "ttl" in err, err


def test_missing_upstream_exits_2():
    r = run_binary(base_args(), timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1 and "--upstream" in err, err


def test_missing_value_exits_2():
    r = run_binary(base_args() + ["--upstream"], timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1 and "--upstream" in err, err


def test_bad_upstream_scheme_exits_2():
    r = run_binary(base_args() + ["--upstream", "ftp://127.0.0.1:1"], timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1 and "--upstream" in err, err


@pytest.mark.parametrize("env,names", [
    ({"IDEMPROXY_MAX_BODY": "1X"}, ("IDEMPROXY_MAX_BODY", "--max-body")),
    ({"IDEMPROXY_TTL": "0"}, ("IDEMPROXY_TTL", "--ttl")),
    ({"IDEMPOTENCY_ENABLED": "maybe"}, ("IDEMPOTENCY_ENABLED",)),
    ({"IDEMPOTENCY_DEFAULT_TTL_SEC": "abc"}, ("IDEMPOTENCY_DEFAULT_TTL_SEC",)),
], ids=["max-body", "ttl", "enabled", "default-ttl"])
def test_bad_env_exits_2(env, names):
    r = run_binary(["--upstream", "http://127.0.0.1:1"] + base_args(), env=env, timeout=5)
    err = r.stderr.decode().strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1, err
    assert any(n in err for n in names), err


@store_independent
def test_upstream_from_env(proxy, upstream):
    p = proxy(upstream_url=False, env={"IDEMPROXY_UPSTREAM": upstream.url})
    st, _, _ = p.request("GET", "/echo")
    assert st == 201 and upstream.hits("/echo") == 1
    # The flag beats the environment: the flag's dead upstream is used.
    p2 = proxy(upstream_url="http://127.0.0.1:1", env={"IDEMPROXY_UPSTREAM": upstream.url})
    assert_problem(p2.request("GET", "/echo"), 502, "upstream_unavailable")
    assert upstream.hits("/echo") == 1


@store_independent
def test_env_max_body_applies_and_flag_beats_it(proxy, upstream):
    p = proxy(env={"IDEMPROXY_MAX_BODY": "1K"})
    assert_problem(p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 2048),
                   413, "payload_too_large")
    assert upstream.hits() == 0
    p2 = proxy("--max-body", "4K", env={"IDEMPROXY_MAX_BODY": "1K"})
    st, h, _ = p2.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x" * 2048)
    assert st == 201 and hone(h, REPLAY) == "false"


def test_env_list_and_flag_replaces_it(proxy, upstream, rdb):
    p = proxy(env={"IDEMPROXY_METHODS": "DELETE,POST"})
    k = new_key()
    st, h, _ = p.request("DELETE", "/echo", [("Idempotency-Key", k)])
    assert hone(h, REPLAY) == "false"
    st, h, _ = p.request("PUT", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert hone(h, REPLAY) is None
    p2 = proxy("--methods", "PUT", env={"IDEMPROXY_METHODS": "DELETE,POST"})
    st, h, _ = p2.request("PUT", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert hone(h, REPLAY) == "false"
    st, h, _ = p2.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert hone(h, REPLAY) is None
    k3 = new_key()
    st, h, _ = p2.request("DELETE", "/echo", [("Idempotency-Key", k3)])
    assert st == 201 and hone(h, REPLAY) is None
    if p2.store == "redis":
        assert redis_keys(rdb, k3) == []
    # The passthrough DELETE left nothing under k3: a PUT with it executes.
    assert_free(p2, k3, ("PUT", "/echo", [("Idempotency-Key", k3)], b"x"))


@pytest.mark.parametrize("value,enforced", [("false", False), ("0", False), ("off", False),
                                            ("no", False), ("true", True), ("on", True)])
@store_independent
def test_idempotency_enabled_values(proxy, upstream, value, enforced):
    p = proxy(env={"IDEMPOTENCY_ENABLED": value})
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201
    assert hone(h, REPLAY) == ("false" if enforced else None)


@store_independent
def test_fractional_seconds_and_byte_suffixes_accepted(proxy, upstream):
    p = proxy("--upstream-timeout", "1.5", "--lock-ttl", "2.5", "--max-body", "1M",
              "--max-response", "2M", "--memory-max-bytes", "1G", "--store-timeout", "0.25",
              "--log-format", "json", "--log-level", "debug")
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"


@store_independent
def test_ipv6_listen(proxy, upstream):
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
        port = s.getsockname()[1]
        s.close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    p = proxy("--listen", "[::1]:%d" % port)
    s = socket.create_connection(("::1", port), timeout=5)
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = recv_until_closed(s)
    s.close()
    assert data.startswith(b"HTTP/1.1 201")
    assert p.alive()


def test_listen_address_held_by_another_process_is_refused():
    """A listener elsewhere on --listen: exit 1 with one line naming the option."""
    port = free_port()
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    try:
        r = run_binary(["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:%d" % port,
                        "--admin-listen", "127.0.0.1:%d" % free_port()])
    finally:
        s.close()
    assert r.returncode == 1
    assert b"--listen 127.0.0.1:%d: cannot listen there" % port in r.stderr, r.stderr


@store_independent
def test_misspelt_names_get_the_nearest_one(proxy, upstream, tmp_path):
    """An unknown option or file key stops start-up naming the nearest known
    one; an IDEMPROXY_* variable that names no option is ignored with a
    warning that does (doc/configuration.md, Options)."""
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--max-bdy", "1M"])
    assert r.returncode == 2
    assert b"unknown option '--max-bdy' (did you mean --max-body? see --help)" in r.stderr
    f = tmp_path / "c.yaml"
    f.write_text("upstream: http://127.0.0.1:1\nrequire_key: true\n")
    r = run_binary(["--config", str(f), "--check-config"])
    assert r.returncode == 2
    assert b"unknown key 'require_key' (did you mean require-key?)" in r.stderr, r.stderr
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--check-config"],
                   env={"IDEMPROXY_MAX_BDY": "1M"})
    assert r.returncode == 0
    assert (b"warning: IDEMPROXY_MAX_BDY names no option and is ignored "
            b"(did you mean IDEMPROXY_MAX_BODY?)") in r.stderr, r.stderr
    p = proxy(env={"IDEMPROXY_UPSTRAEM": "http://elsewhere"})
    assert ("environment: IDEMPROXY_UPSTRAEM names no option and is ignored "
            "(did you mean IDEMPROXY_UPSTREAM?)") in p.stderr()


@store_independent
def test_start_line_says_what_a_keyless_request_gets(proxy, upstream):
    """An operator need not guess: the start-up lines say whether a POST
    without a key goes through unprotected or is refused
    (doc/configuration.md, Options: --require-key)."""
    p = proxy()
    assert ("a POST/PUT/PATCH without Idempotency-Key is passed through unprotected "
            "(--require-key refuses it with 400") in p.stderr()
    p2 = proxy("--require-key", "--methods", "POST", "--key-header", "X-Key")
    assert "a POST without X-Key is refused with 400 (--require-key" in p2.stderr()
    assert_problem(p2.request("POST", "/echo", body=b"x"), 400, "idempotency_key_missing", "2.1")


@pytest.mark.parametrize("listen,admin", [
    ("127.0.0.1:{p}", "127.0.0.1:{p}"),
    ("0.0.0.0:{p}", "127.0.0.1:{p}"),   # a wildcard overlaps every address
    ("127.0.0.1:{p}", "[::]:{p}"),
    ("[::1]:{p}", "[::1]:{p}"),
])
def test_listen_and_admin_listen_on_one_address_stop_start_up(listen, admin):
    """--listen and --admin-listen sharing a port of an address: both would
    bind it and the kernel would split the clients between them
    (doc/configuration.md, Options): exit 2, naming the option, before
    anything listens."""
    port = free_port()
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--listen", listen.format(p=port),
                    "--admin-listen", admin.format(p=port)])
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode().count("\n") == 1, r.stderr
    assert b"--admin-listen: " in r.stderr and b"a port of its own" in r.stderr, r.stderr
    # other ports, or other addresses of one port, are two listeners
    other = free_port()
    assert run_binary(["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:%d" % port,
                       "--admin-listen", "127.0.0.2:%d" % port, "--check-config"]).returncode == 0
    assert run_binary(["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:%d" % port,
                       "--admin-listen", "127.0.0.1:%d" % other, "--check-config"]).returncode == 0


def test_second_proxy_on_the_same_listen_address_is_refused(proxy, upstream):
    """The front ends share the address between their event loops (SO_REUSEPORT):
    a second idemproxy started there by mistake must not share it (each with its
    own memory store, a retry could run on the other one)."""
    p = proxy()
    r = run_binary(["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:%d" % p.port,
                    "--admin-listen", "127.0.0.1:%d" % free_port()])
    assert r.returncode == 1
    assert b"another process listens on it" in r.stderr, r.stderr
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", new_key())], b"x")
    assert st == 201 and hone(h, REPLAY) == "false"  # the first one still serves
