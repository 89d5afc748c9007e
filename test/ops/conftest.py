"""Shared by the packaging and operations tests (test/ops), which scripts/test
runs once, after the plain build: meson install and the systemd unit, the
Debian package, the container file, the alerting rules and the dashboard."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("IDEMPROXY_BIN", ROOT / "build" / "src" / "idemproxy"))


def run(args, check=True, env=None, timeout=600, cwd=None):
    """Runs args, returns the CompletedProcess (text); on failure with check
    set, the assertion shows the command and its output."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=cwd)
    assert not check or p.returncode == 0, \
        f"{' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def project_version():
    """The version meson.build declares, the one place it is written."""
    m = re.search(r"project\('idemproxy', 'c', version: '([^']+)'", (ROOT / "meson.build").read_text())
    assert m, "meson.build declares no version"
    return m.group(1)


def unit_settings(text):
    """[(key, value)] of a unit file's assignments, in order (a key may repeat)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


@pytest.fixture(scope="session")
def deb():
    """scripts/package, once: the path of the .deb it built."""
    p = run([ROOT / "scripts/package"], timeout=1200)
    path = p.stdout.strip().splitlines()[-1]
    assert path.endswith(".deb") and f"idemproxy_{project_version()}_" in path, p.stdout
    return path


@pytest.fixture(scope="session")
def root(deb, tmp_path_factory):
    """A throwaway root the package is unpacked into (dpkg -x)."""
    d = tmp_path_factory.mktemp("root")
    run(["dpkg", "-x", deb, d])
    return d
