"""The Containerfile (doc/operations.md, Container). No image registry can
be reached from these machines, so the image is not built here: the file is
read, its build stage must run only a command CI runs (scripts/package,
which test_package.py runs), and the run stage's settings are given to the
packaged binary."""
import os
import re
import shlex

import pytest

from conftest import ROOT, run


def instructions():
    """[(INSTRUCTION, argument text)] of the Containerfile, continuations joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Containerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages():
    """The instructions of each stage, split at FROM."""
    out = []
    for ins in instructions():
        if ins[0] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def env():
    """The run stage's ENV settings."""
    values = {}
    for word, rest in stages()[-1]:
        if word == "ENV":
            values.update(kv.split("=", 1) for kv in shlex.split(rest))
    return values


def test_two_stages_on_debian_12_slim():
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert froms == ["debian:12-slim AS build", "debian:12-slim"]


def test_the_build_stage_runs_what_ci_runs():
    runs = [rest for word, rest in stages()[0] if word == "RUN"]
    assert runs == ["/src/scripts/package"]
    # ... which CI runs: scripts/test runs test/ops, whose package test runs it.
    assert 'ROOT / "scripts/package"' in (ROOT / "test/ops/conftest.py").read_text()
    assert "test/ops" in (ROOT / "scripts/test").read_text()


def test_the_run_stage_installs_the_package_and_runs_as_a_user():
    run_stage = stages()[-1]
    assert ("COPY", "--from=build /src/build-deb/idemproxy_*.deb /tmp/") in run_stage
    assert any(w == "RUN" and "apt-get install" in r and "/tmp/idemproxy_*.deb" in r
               for w, r in run_stage)
    users = [r.split(":")[0] for w, r in run_stage if w == "USER"]
    # numeric, so that runAsNonRoot can see it is not root
    assert users and users[-1].isdigit() and users[-1] != "0", users
    assert ("ENTRYPOINT", '["/usr/bin/idemproxy"]') in run_stage


def test_healthcheck_and_exposed_ports_are_the_proxy_s():
    run_stage, settings = stages()[-1], env()
    listen = settings["IDEMPROXY_LISTEN"].rsplit(":", 1)[1]
    admin = settings["IDEMPROXY_ADMIN_LISTEN"].rsplit(":", 1)[1]
    assert ("EXPOSE", f"{listen} {admin}") in run_stage
    health = [r for w, r in run_stage if w == "HEALTHCHECK"]
    assert len(health) == 1 and f"http://127.0.0.1:{admin}/healthz" in health[0], health


def test_the_run_stage_s_settings_check_with_the_packaged_binary(root):
    settings = env()
    assert settings["IDEMPROXY_CONFIG"] == "/etc/idemproxy/idemproxy.yaml"
    settings["IDEMPROXY_CONFIG"] = str(root / "etc/idemproxy/idemproxy.yaml")  # dpkg -x put it here
    p = run([root / "usr/bin/idemproxy", "--check-config"],
            env={"PATH": os.environ["PATH"], **settings})
    assert "the configuration is valid" in p.stdout + p.stderr


@pytest.mark.parametrize("pattern", ["/build*", "/.git"])
def test_the_build_context_leaves_out_build_trees_and_git(pattern):
    assert pattern in (ROOT / ".dockerignore").read_text().split()
