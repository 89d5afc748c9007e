"""meson install, and the hardened systemd unit it installs (doc/operations.md,
Running it under systemd).

The install goes to a prefix in a temporary directory, so that the unit's
paths exist on this machine, as systemd-analyze verify wants. This machine has
no systemd running (tests run in a container), so the sandbox is checked as
far as it can be without one: systemd-analyze verify and security read the
unit, and the proxy runs under strace through a workload while the test checks
that every system call, socket family and file it uses is one the unit allows.
"""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, free_port, http, project_version, run, unit_settings, wait_for
from fixtures.upstream import FakeUpstream  # the integration suite's upstream (conftest's path)

UNIT = "lib/systemd/system/idemproxy.service"
INSTALLED = {
    "bin/idemproxy",
    "etc/idemproxy/idemproxy.yaml",
    UNIT,
    "share/man/man1/idemproxy.1",
    "share/doc/idemproxy/examples/idemproxy.yaml",
    "share/doc/idemproxy/examples/payments-api.yaml",
    "share/idemproxy/prometheus/idemproxy.rules.yml",
    "share/idemproxy/grafana/idemproxy.json",
    "share/idemproxy/postgresql/schema.sql",
}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """meson setup --prefix=<tmp>/prefix, build the binary, meson install."""
    d = tmp_path_factory.mktemp("install")
    run(["meson", "setup", d / "build", ROOT, f"--prefix={d / 'prefix'}"])
    run(["ninja", "-C", d / "build", "src/idemproxy"])
    out = run(["meson", "install", "-C", d / "build", "--no-rebuild"]).stdout
    assert "Installing" in out and f"{d / 'prefix'}/etc/idemproxy" in out, out
    return d / "prefix"


@pytest.fixture(scope="module")
def unit(prefix):
    return (prefix / UNIT).read_text()


def installed_files(root):
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_meson_install_puts_each_file_in_its_place_and_nothing_else(prefix):
    assert installed_files(prefix) == INSTALLED
    assert os.access(prefix / "bin/idemproxy", os.X_OK)
    assert (prefix / "etc/idemproxy/idemproxy.yaml").read_bytes() == \
        (ROOT / "contrib/idemproxy.yaml").read_bytes()
    assert (prefix / "share/doc/idemproxy/examples/payments-api.yaml").read_bytes() == \
        (ROOT / "examples/idemproxy.yaml").read_bytes()


def test_the_installed_binary_runs_and_checks_the_installed_config(prefix):
    out = run([prefix / "bin/idemproxy", "--version"]).stdout
    assert out.strip() == f"idemproxy {project_version()}"
    # As the unit starts it: the file named by IDEMPROXY_CONFIG, no flag.
    env = {"PATH": os.environ["PATH"],
           "IDEMPROXY_CONFIG": str(prefix / "etc/idemproxy/idemproxy.yaml")}
    p = run([prefix / "bin/idemproxy", "--check-config"], env=env)
    assert "the configuration is valid" in p.stdout + p.stderr


def test_the_unit_names_the_installed_paths(prefix, unit):
    s = unit_settings(unit)
    assert ("ExecStart", f"{prefix}/bin/idemproxy") in s
    assert ("Environment", f"IDEMPROXY_CONFIG={prefix}/etc/idemproxy/idemproxy.yaml") in s
    # The reload checks the configuration first, then sends SIGHUP.
    assert [v for k, v in s if k == "ExecReload"] == \
        [f"{prefix}/bin/idemproxy --check-config", "/bin/sh -c 'kill -HUP $$MAINPID'"]
    assert ("EnvironmentFile", "-/etc/default/idemproxy") in s
    assert s.index(("Environment", f"IDEMPROXY_CONFIG={prefix}/etc/idemproxy/idemproxy.yaml")) < \
        s.index(("EnvironmentFile", "-/etc/default/idemproxy")), \
        "/etc/default must be able to override the file's name"


@pytest.mark.parametrize("setting", [
    ("DynamicUser", "yes"), ("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""), ("AmbientCapabilities", ""),
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ("SystemCallFilter", "@system-service"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
    ("RestartPreventExitStatus", "2"), ("WantedBy", "multi-user.target"),
])
def test_the_unit_is_hardened(unit, setting):
    assert setting in unit_settings(unit)


def verify(unit, prefix):
    env = dict(os.environ, MANPATH=str(prefix / "share/man"))  # Documentation=man:idemproxy(1)
    p = run(["systemd-analyze", "verify", unit], check=False, env=env)
    return p.returncode, p.stdout + p.stderr


def test_systemd_analyze_verify_reports_nothing(prefix):
    assert verify(prefix / UNIT, prefix) == (0, "")


@pytest.mark.parametrize("old,new,said", [
    ("ProtectHome=", "ProtectHomme=", "Unknown key 'ProtectHomme'"),
    ("ExecStart=/", "ExecStart=/nonexistent/", "/nonexistent/"),
    ("Documentation=man:idemproxy(1)", "Documentation=man:idemproxy-nonexistent(1)",
     "idemproxy-nonexistent"),
])
def test_systemd_analyze_verify_can_fail(prefix, tmp_path, old, new, said):
    bad = tmp_path / "idemproxy.service"
    text = (prefix / UNIT).read_text()
    assert old in text
    bad.write_text(text.replace(old, new))
    assert said in verify(bad, prefix)[1]


def test_systemd_analyze_security_level_is_the_docs(prefix):
    p = run(["systemd-analyze", "security", "--offline=yes", prefix / UNIT], check=False)
    m = re.search(r"Overall exposure level for idemproxy\.service: (\d+\.\d) (\w+)", p.stdout)
    assert m, p.stdout + p.stderr
    level, word = float(m.group(1)), m.group(2)
    assert level <= 2.0 and word in ("OK", "SAFE"), m.group(0)
    docs = " ".join((ROOT / "doc" / "operations.md").read_text().split())
    assert f"exposure level {m.group(1)} ({word})" in docs, \
        f"doc/operations.md should state the level systemd-analyze security gives: {m.group(0)}"


def expand_filter(spec, seen=None):
    """The system call names of a SystemCallFilter= value ('@group name ...')."""
    names = set()
    for item in spec.split():
        if item.startswith("@"):
            out = run(["systemd-analyze", "syscall-filter", item]).stdout
            for line in out.splitlines()[1:]:
                line = line.strip()
                if line and not line.startswith("#"):
                    names |= expand_filter(line)
        else:
            names.add(item)
    return names


def allowed_syscalls(unit):
    """What the unit's SystemCallFilter= lines allow: the first list, less
    every ~list (systemd applies them in order)."""
    allowed = None
    for key, value in unit_settings(unit):
        if key != "SystemCallFilter":
            continue
        if value.startswith("~"):
            allowed -= expand_filter(value[1:])
        else:
            allowed = (allowed or set()) | expand_filter(value)
    assert allowed, "the unit sets no SystemCallFilter"
    return allowed


@pytest.fixture(scope="module", params=["memory", "redis", "postgresql"])
def traced(request, prefix, tmp_path_factory, redis_url, pg_url):
    """The installed proxy, started as the unit starts it (IDEMPROXY_CONFIG,
    a config file with a route), under strace -f, through a workload: a new
    key through an upstream named by host name, its replay, the key reused
    for another body, a route's JSON key and its replay, the admin endpoints,
    a reload and a graceful stop. Returns the strace log."""
    tmp_path = tmp_path_factory.mktemp("strace")
    up = FakeUpstream()
    up.start()
    port, admin = free_port(), free_port()
    conf = tmp_path / "idemproxy.yaml"
    conf.write_text(f"upstream: http://localhost:{up.port}\nlisten: 127.0.0.1:{port}\n"
                    f"admin-listen: 127.0.0.1:{admin}\n"
                    + (f"redis: {redis_url}\n" if request.param == "redis" else "")
                    + (f"store: {pg_url}\n" if request.param == "postgresql" else "")
                    + "routes:\n  - name: hooks\n    match: {path: /api/*}\n    key: {json: /id}\n")
    log = tmp_path / "strace.log"
    env = {"PATH": os.environ["PATH"], "IDEMPROXY_CONFIG": str(conf)}
    p = subprocess.Popen(["strace", "-f", "-qq", "-o", log, prefix / "bin/idemproxy"], env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        def ready():
            assert p.poll() is None, "the proxy exited: %s" % p.stderr.read()
            try:
                return http(admin, "GET", "/readyz")[0] == 200
            except OSError:
                return False

        wait_for(ready, timeout=10, what="the traced proxy's /readyz")
        key = {"Idempotency-Key": f"strace-{request.param}-{time.time_ns()}"}
        assert http(port, "POST", "/echo", key, b"one")[0] == 201
        assert http(port, "POST", "/echo", key, b"one")[0] == 201
        assert http(port, "POST", "/echo", key, b"two")[0] == 422
        hook = b'{"id": "evt_%d"}' % time.time_ns()
        first = http(port, "POST", "/api/echo", body=hook)
        assert http(port, "POST", "/api/echo", body=hook) == first
        assert up.hits("/echo") == 2, "the hook's replay reached the upstream"
        assert http(admin, "GET", "/metrics")[0] == 200
        proxy = tracee(p.pid)
        os.kill(proxy, signal.SIGHUP)
        reloaded = b'idemproxy_config_reloads_total{result="ok"} 1'
        wait_for(lambda: reloaded in http(admin, "GET", "/metrics")[1], timeout=10,
                 what="the reload, counted")
        os.kill(proxy, signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 0, err
        assert "reload:" in err and "applied" in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        up.stop()
    return log.read_text()


def tracee(strace_pid):
    """The process strace started (signals go to it, as systemd's would)."""
    children = Path(f"/proc/{strace_pid}/task/{strace_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_the_syscall_filter_allows_every_call_the_proxy_makes(traced, unit):
    used = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)[( ]", traced, re.M))
    used -= {"execve"}  # strace's own exec of the binary, before the filter would apply
    assert {"epoll_wait", "accept4", "connect", "sendto", "recvfrom"} & used, \
        "strace saw no traffic"
    denied = used - allowed_syscalls(unit)
    assert not denied, f"the unit's SystemCallFilter would refuse {sorted(denied)}"


def test_the_proxy_uses_only_the_unit_s_address_families(traced, unit):
    families = set(re.findall(r"\bsocket\((AF_[A-Z0-9]+)", traced))
    assert "AF_INET" in families, "strace saw no socket"
    allowed = set(dict(unit_settings(unit))["RestrictAddressFamilies"].split())
    assert families <= allowed, f"RestrictAddressFamilies would refuse {sorted(families - allowed)}"


def test_the_proxy_writes_no_file_and_reads_no_hidden_proc(traced):
    # ProtectSystem=strict leaves nothing writable; ProcSubset=pid hides all of
    # /proc but the processes' own directories.
    opens = re.findall(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]*)", ([A-Z_|]+)', traced)
    assert opens, "strace saw no open"
    writes = [(f, m) for f, m in opens
              if re.search(r"O_WRONLY|O_RDWR|O_CREAT", m) and f not in ("/dev/null",)]
    assert not writes, writes
    hidden = [f for f, _ in opens
              if f.startswith("/proc/") and not re.match(r"/proc/(self|thread-self|\d+)/", f)]
    assert not hidden, hidden


def test_meson_install_keeps_an_edited_config(prefix):
    conf = prefix / "etc/idemproxy/idemproxy.yaml"
    edited = conf.read_text() + "# an operator's edit\n"
    conf.write_text(edited)
    run(["meson", "install", "-C", prefix.parent / "build", "--no-rebuild"])
    assert conf.read_text() == edited
    conf.unlink()  # and a missing one is installed again
    run(["meson", "install", "-C", prefix.parent / "build", "--no-rebuild"])
    assert conf.read_bytes() == (ROOT / "contrib/idemproxy.yaml").read_bytes()


def docs_dropins():
    text = (ROOT / "doc" / "operations.md").read_text()
    section = text[text.index("## Install and operate"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    return re.findall(r"```ini\n(.*?)```", section.replace("\n  ", "\n"), re.S)


def test_the_docs_drop_ins_verify(prefix, tmp_path):
    """Each drop-in doc/operations.md suggests, added to the unit, still verifies."""
    dropins = docs_dropins()
    assert len(dropins) == 5, dropins  # Redis's credential, PostgreSQL's, the store keys, TLS files, a low port
    for i, dropin in enumerate(dropins):
        unit = tmp_path / str(i) / "idemproxy.service"
        unit.parent.mkdir()
        unit.write_text((prefix / UNIT).read_text() + "\n" + dropin)
        assert verify(unit, prefix) == (0, ""), dropin
