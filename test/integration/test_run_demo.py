"""scripts/run: the demo (no arguments) runs the example payments API and the
proxy and prints curl commands; the commands printed are run here as printed,
and must show what the guide says. With arguments it runs the proxy itself."""
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from fixtures.client import REPLAY, hone, http_request
from fixtures.proxy import IDEMPROXY_BIN, REPO
from fixtures.waiting import free_port, wait_for

RUN = os.path.join(REPO, "scripts", "run")
SLOW_SECONDS = 3  # the demo's slow endpoint; the 409 duplicate is sent about 1 s in


def distinct_ports(n):
    ports = set()
    while len(ports) < n:
        ports.add(free_port())
    return list(ports)


def run_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("IDEMPROXY_") and not k.startswith("IDEMPOTENCY_")}
    env["IDEMPROXY_BIN"] = os.path.abspath(IDEMPROXY_BIN)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def default_sigint():
    # A shell cannot trap a signal that was ignored when it started (as it is
    # for background jobs of a non-interactive shell): give scripts/run a clean one.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid):
    """True while <pid> exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def parse_http(out):
    """The output of `curl -si`: (status, [(name, value)], body bytes)."""
    head, sep, body = out.partition(b"\r\n\r\n")
    assert sep, "no HTTP head in %r" % out[:500]
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    assert m, lines[0]
    headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
    return int(m.group(1)), headers, body


def shell(cmd, timeout=20):
    """Runs one printed line the way a shell would; returns its stdout."""
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, "%r exited %d: %r" % (cmd, r.returncode, r.stderr)
    return r.stdout


class Demo:
    """scripts/run without arguments, its stdout read line by line in a thread."""

    def __init__(self, tmp_path, **env):
        self.stderr_path = str(tmp_path / "run.stderr")
        with open(self.stderr_path, "wb") as err:
            # Its own process group, as a terminal gives a command: Ctrl-C is
            # sent to that group (interrupt()).
            self.proc = subprocess.Popen([RUN], cwd=REPO, env=run_env(**env),
                                         stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL, preexec_fn=default_sigint,
                                         start_new_session=True)
        self.lines = []
        self.pids = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-20000:]

    def guide(self, timeout=60.0):
        """Waits for the whole guide (its last line starts with 'Running;')."""
        def done():
            if any(line.startswith("Running;") for line in self.lines):
                return True
            if self.proc.poll() is not None:
                pytest.fail("scripts/run exited %d before its guide:\n%s\n%s"
                            % (self.proc.returncode, "\n".join(self.lines), self.stderr()))
            return False

        wait_for(done, timeout=timeout, what="the guide of scripts/run")
        text = "\n".join(self.lines)
        api = re.search(r"^  example API  http://127\.0\.0\.1:(\d+) .*pid (\d+)\)$", text, re.M)
        proxy = re.search(r"^  idemproxy    http://127\.0\.0\.1:(\d+) .*pid (\d+)\)$", text, re.M)
        assert api and proxy, text
        self.api_port, self.pids = int(api.group(1)), [int(api.group(2)), int(proxy.group(2))]
        return text

    def steps(self):
        """{step number: (comment, [command lines])} from the guide."""
        steps, n = {}, None
        for line in self.lines:
            m = re.match(r"# (\d)\. (.*)", line)
            if m:
                n = int(m.group(1))
                steps[n] = (m.group(2), [])
            elif n is not None and re.match(r"(curl|sleep) ", line):
                steps[n][1].append(line)
        return steps

    def interrupt(self):
        """Ctrl-C in a terminal: SIGINT to the script's whole process group
        (the API and idemproxy run in sessions of their own)."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:  # what the shell was doing, for the report
                with open("/proc/%d/status" % self.proc.pid) as f:
                    status = "".join(l for l in f if l.split(":")[0] in
                                     ("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))
                with open("/proc/%d/wchan" % self.proc.pid) as f:
                    status += "wchan: " + f.read() + "\n"
            except OSError as e:
                status = str(e)
            pytest.fail("scripts/run still running after %.0fs:\n%s\n%s"
                        % (timeout, status, self.stderr()))

    def kill_all(self):
        """Teardown: whatever is still running of what this test started."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.stdout.close()


@pytest.fixture
def demo(tmp_path):
    started = []

    def factory(**env):
        d = Demo(tmp_path, **env)
        started.append(d)
        return d

    yield factory
    for d in started:
        d.kill_all()


def test_demo_prints_commands_that_show_each_outcome(demo):
    port, admin = distinct_ports(2)
    d = demo(IDEMPROXY_RUN_PORT=port, IDEMPROXY_RUN_ADMIN_PORT=admin,
             IDEMPROXY_DEMO_SLOW_SECONDS=SLOW_SECONDS)
    text = d.guide()
    assert "http://127.0.0.1:%d/payments" % port in text
    assert "http://127.0.0.1:%d/healthz" % admin in text
    assert "memory store" in text
    steps = d.steps()
    assert sorted(steps) == [1, 2, 3, 4, 5, 6, 7, 8, 9], text
    assert "examples/demo.yaml" in text
    for n, (_, cmds) in steps.items():
        for c in cmds:
            # the proxy's port; step 9's is the admin listener's
            assert ("127.0.0.1:%d" % (admin if n == 9 else port) in c
                    or c.startswith("sleep ")), c

    # 1. executed
    (create,) = steps[1][1]
    st, h, first = parse_http(shell(create))
    assert st == 201, first
    assert hone(h, REPLAY) == "false"
    pay = json.loads(first)
    assert pay["id"] == "pay_000001" and pay["number"] == 1 and pay["amount"] == 1000
    assert hone(h, "Location") == "/payments/pay_000001"

    # 2. replayed: the same command, the same bytes
    assert steps[2][1] == [create]
    st, h, again = parse_http(shell(create))
    assert st == 201
    assert hone(h, REPLAY) == "true"
    assert again == first

    # 3. the API created it once
    (listing,) = steps[3][1]
    assert json.loads(shell(listing))["count"] == 1

    # 4. in flight: the first line in the background (as '&' does), then the second
    bg_line, dup_line = steps[4][1]
    assert bg_line.endswith(" &"), bg_line
    bg = subprocess.Popen(["bash", "-c", bg_line[:-2]], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        # The duplicate must come while the first one is inside the API.
        wait_for(lambda: json.loads(http_request("127.0.0.1", d.api_port, "GET", "/payments")[2])
                 ["in_progress"] == 1, timeout=10, what="the slow creation to reach the API")
        t0 = time.monotonic()
        st, h, body = parse_http(shell(dup_line))
        assert st == 409, body
        assert hone(h, "Retry-After") == "1"
        assert json.loads(body)["code"] == "idempotency_key_in_use"
        assert time.monotonic() - t0 < SLOW_SECONDS, "the duplicate waited for the first"
        out, err = bg.communicate(timeout=SLOW_SECONDS + 15)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(5)
    assert bg.returncode == 0, err
    slow_pay = json.loads(out)
    assert slow_pay["id"] == "pay_000002" and slow_pay["number"] == 2
    # "the same again then replays it"
    st, h, body = parse_http(shell(dup_line))
    assert st == 201 and hone(h, REPLAY) == "true"
    assert json.loads(body) == slow_pay

    # 5. mismatch
    (mismatch,) = steps[5][1]
    st, h, body = parse_http(shell(mismatch))
    assert st == 422, body
    assert json.loads(body)["code"] == "idempotency_key_mismatch"
    assert json.loads(body)["resource"] == "pay_000001"

    # 6. invalid key
    (invalid,) = steps[6][1]
    st, h, body = parse_http(shell(invalid))
    assert st == 400, body
    assert json.loads(body)["code"] == "idempotency_key_invalid"

    # 7. missing key on the route that requires one
    (keyless,) = steps[7][1]
    st, h, body = parse_http(shell(keyless))
    assert st == 400, body
    assert json.loads(body)["code"] == "idempotency_key_missing"

    # 8. a webhook delivered twice: processed once, the second delivery replayed
    hook, hook_again, deliveries = steps[8][1]
    assert hook_again == hook
    st, h, first_hook = parse_http(shell(hook))
    assert st == 200 and hone(h, REPLAY) == "false", first_hook
    st, h, again = parse_http(shell(hook))
    assert st == 200 and hone(h, REPLAY) == "true" and again == first_hook
    assert json.loads(shell(deliveries)) == {"processed": 1, "events": ["evt_1"]}

    # 9. the key that created pay_000001
    (which,) = steps[9][1]
    (rec,) = json.loads(shell(which))["records"]
    assert rec["key"] == "order-1" and rec["resource"] == "pay_000001", rec

    # Two payments in all: nothing ran twice.
    assert json.loads(shell(listing))["count"] == 2
    assert d.stderr().count("payments-api: created") == 2, d.stderr()

    # Ctrl-C stops both and exits 0.
    assert all(alive(pid) for pid in d.pids)
    d.interrupt()
    assert d.wait(40) == 0, d.stderr()
    wait_for(lambda: not any(alive(pid) for pid in d.pids), timeout=5,
             what="the API and idemproxy to be gone")


def test_demo_stops_the_proxy_when_the_api_dies(demo):
    port, admin = distinct_ports(2)
    d = demo(IDEMPROXY_RUN_PORT=port, IDEMPROXY_RUN_ADMIN_PORT=admin)
    d.guide()
    api_pid, proxy_pid = d.pids
    os.kill(api_pid, signal.SIGKILL)  # a crash: not the clean SIGTERM exit
    assert d.wait(40) != 0
    assert not alive(proxy_pid)
    assert "the example API stopped by itself" in d.stderr()


def listening(port):
    try:
        http_request("127.0.0.1", port, "GET", "/healthz", None, None, 1)
        return True
    except OSError:
        return False


def test_demo_piped_into_a_reader_that_leaves_still_stops_both_on_ctrl_c(tmp_path):
    """scripts/run 2>&1 | head -n 3: head leaves while the guide is printed,
    and the script lives on (its writes fail) until Ctrl-C, which stops
    idemproxy and the example API: none keeps its port."""
    port, admin = distinct_ports(2)
    proc = subprocess.Popen(["bash", "-c", "%s 2>&1 | head -n 3 >/dev/null" % RUN], cwd=REPO,
                            env=run_env(IDEMPROXY_RUN_PORT=port, IDEMPROXY_RUN_ADMIN_PORT=admin),
                            stdin=subprocess.DEVNULL, preexec_fn=default_sigint,
                            start_new_session=True)
    try:
        wait_for(lambda: listening(admin), timeout=60, what="the demo's proxy")
        time.sleep(1.5)  # the guide is printed (into a closed pipe) by now
        assert proc.poll() is None, "scripts/run died when its reader left"
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(40)
        wait_for(lambda: not listening(port) and not listening(admin), timeout=5,
                 what="the demo's ports to be free")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_demo_reports_a_busy_port(demo, upstream):
    busy = int(upstream.url.rsplit(":", 1)[1])
    d = demo(IDEMPROXY_RUN_PORT=busy, IDEMPROXY_RUN_ADMIN_PORT=free_port())
    assert d.wait(40) == 1
    assert "idemproxy did not start" in d.stderr()
    assert not any(line.startswith("Running;") for line in d.lines)


def test_with_arguments_runs_the_proxy_itself_on_the_memory_store(upstream, tmp_path):
    port, admin = distinct_ports(2)
    with open(str(tmp_path / "run.stderr"), "wb") as err:
        proc = subprocess.Popen(
            [RUN, "--upstream", upstream.url, "--listen", "127.0.0.1:%d" % port,
             "--admin-listen", "127.0.0.1:%d" % admin], cwd=REPO, env=run_env(),
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    try:
        def healthy():
            assert proc.poll() is None, "scripts/run exited %d" % proc.returncode
            try:
                return http_request("127.0.0.1", admin, "GET", "/healthz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_for(healthy, timeout=30, what="/healthz")
        # The proxy runs in place of the script (exec): the signal reaches it directly.
        assert os.path.realpath("/proc/%d/exe" % proc.pid) == os.path.realpath(IDEMPROXY_BIN)
        for replayed in ("false", "true"):
            st, h, _ = http_request("127.0.0.1", port, "POST", "/echo",
                                    [("Idempotency-Key", "run-args")], b"x")
            assert st == 201 and hone(h, REPLAY) == replayed
        assert upstream.hits("/echo") == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "run.stderr").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "memory" in (tmp_path / "run.stderr").read_text()  # the start-up line names the store


def test_help_lists_the_options():
    r = subprocess.run([RUN, "--help"], cwd=REPO, env=run_env(), capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert b"--upstream URL" in r.stdout and b"--memory-max-bytes" in r.stdout
