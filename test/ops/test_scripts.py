"""The scripts' own arguments (README.md, doc/architecture.md: Tests):
--help prints what the script does and exits 0 at once, without installing
or building anything; an argument a script does not take stops it with
exit status 2 and a line saying what it takes, before anything starts.
Each run is bounded by a timeout far below what any real work would take."""
import time

import pytest

from conftest import ROOT, run

SCRIPTS = ["scripts/test", "scripts/package", "scripts/bench"]


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
                                         ("scripts/bench", "quick")])
def test_an_argument_it_does_not_take_stops_it_with_2(script, arg):
    before = state_of_builds()
    p = run([ROOT / script, arg], check=False, timeout=10)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert arg in p.stderr and "--help" in p.stderr, p.stderr
    assert p.stdout == "" and state_of_builds() == before
