"""contrib/kubernetes (doc/operations.md, Kubernetes): the base and the
native-sidecar overlay rendered by `kubectl kustomize` (kubectl, or Debian's
kubernetes-client), and what they say checked against the binary itself: its
flags, its ports, the paths the probes ask for, the drain arithmetic, a
non-root user on a read-only root."""
import os
import shutil
import signal
import subprocess

import pytest
import yaml

from conftest import BIN, ROOT, free_port, http, run, wait_for

KUBE = ROOT / "contrib" / "kubernetes"


def render(name):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (scripts/test installs kubernetes-client)"
    p = run([kubectl, "kustomize", KUBE / name], timeout=60)
    return {d["kind"]: d for d in yaml.safe_load_all(p.stdout) if d}


def flags(container):
    """{--flag: value} of a container's args (all --flag=value)."""
    out = {}
    for a in container["args"]:
        assert a.startswith("--") and "=" in a, "args are --flag=value: %r" % a
        k, v = a.split("=", 1)
        out[k] = v
    return out


def env(container):
    return {e["name"]: e for e in container.get("env", [])}


def help_flags():
    return {ln.split()[0] for ln in run([BIN, "--help"]).stdout.splitlines()
            if ln.startswith("  --")}


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def check_proxy_container(c, pod, grace):
    """What the idemproxy container says, against the binary."""
    f = flags(c)
    assert set(f) <= help_flags(), set(f) - help_flags()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == port_of(f["--listen"])
    assert ports["admin"] == port_of(f["--admin-listen"])
    assert f["--admin-listen"].startswith("0.0.0.0:"), "the kubelet probes from outside the pod"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert grace >= float(f["--drain-delay"]) + float(f["--shutdown-timeout"]), (grace, f)
    assert float(f["--drain-delay"]) > 0
    url = env(c)["IDEMPROXY_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert url["name"] and url["key"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    return f


def serve_as_rendered(f, upstream):
    """Starts the binary with the rendered flags, on loopback ports and the
    memory store, and checks that its admin listener answers the probes'
    paths; then SIGTERM: /readyz 503 while the drain delay runs."""
    port, admin = free_port(), free_port()
    args = ["%s=%s" % (k, v) for k, v in f.items()
            if k not in ("--listen", "--admin-listen", "--drain-delay")]
    args += ["--listen=127.0.0.1:%d" % port, "--admin-listen=127.0.0.1:%d" % admin,
             "--drain-delay=1", "--upstream=" + upstream]
    e = {k: v for k, v in os.environ.items() if not k.startswith("IDEMPROXY_")}
    proc = subprocess.Popen([str(BIN)] + args, env=e, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _status(admin, "/healthz") == 200, timeout=10, what="/healthz 200")
        assert _status(admin, "/readyz") == 200
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _status(admin, "/readyz") == 503, timeout=2, what="/readyz 503")
        assert _status(admin, "/healthz") == 200
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _status(port, path):
    try:
        return http(port, "GET", path)[0]
    except OSError:
        return None


def test_base_renders_a_gateway_that_agrees_with_the_binary():
    docs = render("base")
    assert set(docs) == {"Deployment", "Service", "PodDisruptionBudget"}
    d = docs["Deployment"]
    assert d["spec"]["replicas"] == 2
    pod = d["spec"]["template"]["spec"]
    labels = d["spec"]["template"]["metadata"]["labels"]
    [c] = pod["containers"]
    f = check_proxy_container(c, pod, pod["terminationGracePeriodSeconds"])
    assert env(c)["IDEMPROXY_UPSTREAM"]["value"].startswith("http://")
    svc = docs["Service"]["spec"]
    assert svc["selector"].items() <= labels.items()
    names = {p["name"] for p in c["ports"]}
    assert {p["targetPort"] for p in svc["ports"]} <= names
    pdb = docs["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] == 1 < d["spec"]["replicas"]
    serve_as_rendered(f, "http://127.0.0.1:%d" % free_port())


def test_sidecar_overlay_runs_the_proxy_as_a_native_sidecar():
    docs = render("sidecar")
    d = docs["Deployment"]
    pod = d["spec"]["template"]["spec"]
    [proxy] = pod["initContainers"]
    assert proxy["name"] == "idemproxy" and proxy["restartPolicy"] == "Always"
    f = check_proxy_container(proxy, pod, pod["terminationGracePeriodSeconds"])
    [app] = pod["containers"]
    upstream = env(proxy)["IDEMPROXY_UPSTREAM"]["value"]
    assert upstream.startswith("http://127.0.0.1:")
    assert {p["containerPort"] for p in app["ports"]} == {port_of(upstream)}
    assert app["securityContext"]["readOnlyRootFilesystem"] is True
    # the Service still sends to the proxy's port, never the application's
    svc = docs["Service"]["spec"]
    assert {p["targetPort"] for p in svc["ports"]} <= {p["name"] for p in proxy["ports"]}
    serve_as_rendered(f, upstream)


@pytest.mark.parametrize("name", ["base", "sidecar"])
def test_the_manifests_name_only_what_exists(name):
    """Every file a kustomization names is there (a render would fail), and
    the docs' commands name these folders."""
    text = (KUBE / name / "kustomization.yaml").read_text()
    assert "kubectl apply -k contrib/kubernetes/" + name in text
    ops = (ROOT / "doc" / "operations.md").read_text()
    assert "contrib/kubernetes/" + name in ops
