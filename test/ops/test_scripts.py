"""The scripts' own arguments (README.md, doc/architecture.md: Tests):
--help prints what the script does and exits 0 at once, without installing
or building anything; an argument a script does not take stops it with
exit status 2 and a line saying what it takes, before anything starts.
Each run is bounded by a timeout far below what any real work would take."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import ROOT, run

SCRIPTS = ["scripts/test", "scripts/run", "scripts/package", "scripts/bench", "scripts/sandbox"]


def state_of_builds():
    """What the build folders are now: a --help must not touch them."""
    return {p.name: p.stat().st_mtime_ns for p in ROOT.glob("build*")}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_says_what_it_does_and_does_nothing(script):
    before = state_of_builds()
    t0 = time.monotonic()
    p = run([ROOT / script, "--help"], timeout=10)
    assert time.monotonic() - t0 < 5, "--help took as long as real work"
    assert script in p.stdout and p.stderr == "", (p.stdout, p.stderr)
    assert state_of_builds() == before


@pytest.mark.parametrize("script, arg", [("scripts/test", "--bogus"), ("scripts/test", "-k"),
                                         ("scripts/package", "--help-me"),
                                         ("scripts/bench", "quick"),
                                         ("scripts/sandbox", "--redis")])
def test_an_argument_it_does_not_take_stops_it_with_2(script, arg):
    before = state_of_builds()
    p = run([ROOT / script, arg], check=False, timeout=10)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert arg in p.stderr and "--help" in p.stderr, p.stderr
    assert p.stdout == "" and state_of_builds() == before


def test_sandbox_serves_redis_postgresql_and_a_ca_until_ctrl_c(tmp_path):
    """scripts/sandbox prints the URLs and files the recipes use; they work;
    Ctrl-C (SIGINT to its process group, as a terminal sends it) stops both
    servers and removes its folder."""
    import psycopg2

    out = open(tmp_path / "out", "w+")
    proc = subprocess.Popen([ROOT / "scripts/sandbox"], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "Ctrl-C" not in text or "client pair" not in text:
            assert proc.poll() is None and time.monotonic() < deadline, open(out.name).read()
            time.sleep(0.2)
            text = open(out.name).read()
        folder = re.search(r"sandbox in (\S+)", text).group(1)
        redis_port = int(re.search(r"redis://127\.0\.0\.1:(\d+)", text).group(1))
        pg_url = re.search(r"(postgresql://\S+)", text).group(1)
        ca = re.search(r"test CA +(\S+)", text).group(1)
        with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16) == b"+PONG\r\n"
        with psycopg2.connect(pg_url, connect_timeout=5) as c, c.cursor() as cur:
            cur.execute("select 1")
            assert cur.fetchone() == (1,)
        c.close()
        assert os.path.isfile(ca) and ca.startswith(folder)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0, open(out.name).read()
        assert not os.path.exists(folder)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", redis_port), timeout=2).close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
