"""The Prometheus alerting rules (contrib/prometheus) and the Grafana dashboard
(contrib/grafana), checked with promtool and against what a running idemproxy
exports.

- the rules pass `promtool check rules`, and their unit tests
  (idemproxy.rules.test.yml) pass `promtool test rules`; every alert there has
  a case where it fires and one where it must not;
- every alert doc/operations.md (Alerts, Alert runbook) documents exists,
  with a severity and the annotations the runbook relies on;
- every query of the dashboard (targets, variables, annotations), with
  Grafana's variables replaced by values, passes `promtool check rules` as a
  recording rule;
- every metric the rules and the dashboard name is in a real scrape of the
  proxy (memory store, Redis and PostgreSQL), the dashboard shows every family the proxy
  exports, and both scrapes pass `promtool check metrics`;
- the dashboard's JSON is importable: unique ids, a grid position and the
  datasource variable on every panel, the panels doc/operations.md names.

Redis: IDEMPROXY_TEST_REDIS_URL when set (scripts/test exports one), else a
redis-server started here on a free port; PostgreSQL: IDEMPROXY_TEST_PG_URL,
else a server of test/integration/fixtures/postgres.py.

Run: IDEMPROXY_PROMTOOL=build-tools/prometheus/usr/bin/promtool
     IDEMPROXY_BIN=build/src/idemproxy
     /usr/bin/python3 -m pytest -q -p no:cacheprovider test/ops/test_alerts.py
"""
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import BIN, ROOT, free_port, http, stop, wait_for

RULES = str(ROOT / "contrib/prometheus/idemproxy.rules.yml")
RULE_TESTS = str(ROOT / "contrib/prometheus/idemproxy.rules.test.yml")
DASHBOARD = str(ROOT / "contrib/grafana/idemproxy.json")
PROMTOOL = os.environ.get("IDEMPROXY_PROMTOOL") or shutil.which("promtool") or str(
    ROOT / "build-tools/prometheus/usr/bin/promtool")

# The alerts of doc/operations.md (Alerts, Alert runbook): store down, error
# and 5xx rates, lock_lost, memory store nearly full, unreplicated writes, a
# key became unknown, a store that may forget keys, and what an operator
# needs besides.
REQUIRED_ALERTS = {
    "IdemproxyDown", "IdemproxyTargetMissing", "IdemproxyRedisDisconnected",
    "IdemproxyStoreUnavailable", "IdemproxyHigh5xxRatio", "IdemproxyUpstreamErrors",
    "IdemproxyLockLost", "IdemproxyMemoryStoreNearlyFull", "IdemproxyMemoryStoreEvicting",
    "IdemproxyUnreplicatedWrites", "IdemproxyConfigReloadFailed", "IdemproxyUnknownOutcome",
    "IdemproxyStoreNotDurable", "IdemproxyPostgresDisconnected",
    # The upstream's own 5xx, memory store locks near their share, a restart
    # that forgot every key.
    "IdemproxyUpstream5xx", "IdemproxyMemoryStoreLocksNearBudget",
    "IdemproxyMemoryStoreRestarted",
    # Probes of unknown keys that keep failing (doc/configuration.md, Reconcile).
    "IdemproxyReconcileFailing",
}
RUNBOOK = "doc/operations.md, Alert runbook → %s"

REQUIRED_PANELS = {
    "Requests by route and outcome", "5xx answered by the proxy", "In-flight requests",
    "Request latency", "Upstream latency", "Store latency by op", "Store errors",
    "Memory store use", "Memory store entries and reclaims", "Redis connected",
    "Redis failovers and redirections", "Unreplicated writes", "Config reloads", "Locks lost",
    "Keys with an unknown outcome", "Store keeps its keys through a restart",
    "PostgreSQL connected", "PostgreSQL expired rows deleted", "Answers by status class",
    "Connections refused", "Restarts", "Probes of unknown keys by route and result",
    "Trace spans dropped",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# 40 panel targets, 1 annotation query, 2 variable queries: an extraction that
# misses some (or all) of them fails here rather than checking nothing.
DASHBOARD_QUERIES = 43

# Grafana's variables, as valid PromQL: durations for the built-in ones,
# a regex matching anything for the dashboard's own (used with =~).
GRAFANA_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h",
                "instance": ".*", "route": ".*"}
GRAFANA_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset", "inf", "nan"}
# Series Prometheus writes itself, not the proxy.
PROMETHEUS_SERIES = {"up"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# --------------------------------------------------------------------------- helpers


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_dashboard():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def alert_rules():
    return [r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args, stdin=None):
    """Runs promtool; returns (exit status, stdout + stderr)."""
    assert os.access(PROMTOOL, os.X_OK), "no promtool at %s (set IDEMPROXY_PROMTOOL)" % PROMTOOL
    p = subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def assert_promtool_ok(*args, stdin=None):
    rc, out = promtool(*args, stdin=stdin)
    assert rc == 0, "promtool %s failed (%d):\n%s" % (" ".join(args), rc, out)
    return out


def all_panels(dashboard):
    """Every panel, those inside collapsed rows included."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def query_panels(dashboard):
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def variable_promql(var):
    """The PromQL of a query variable: label_values(EXPR, label) -> EXPR,
    query_result(EXPR) -> EXPR; None for label_values(label) and the like."""
    q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    m = re.fullmatch(r"\s*(?:label_values\((.*),\s*\w+\s*\)|query_result\((.*)\))\s*", q, re.S)
    return (m.group(1) or m.group(2)) if m else None


def dashboard_queries(dashboard):
    """Every PromQL query the dashboard runs, as (where, expr)."""
    out = [("panel %d %s" % (p["id"], t["refId"]), t["expr"])
           for p in query_panels(dashboard) for t in p.get("targets", [])]
    out += [("variable " + v["name"], variable_promql(v))
            for v in dashboard["templating"]["list"] if v["type"] == "query"]
    out += [("annotation " + a["name"], a["expr"])
            for a in dashboard["annotations"]["list"] if "expr" in a]
    return [(where, e) for where, e in out if e]


def substitute_grafana_vars(expr):
    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in GRAFANA_VARS, "unknown Grafana variable $%s in %s" % (name, expr)
        return GRAFANA_VARS[name]

    return GRAFANA_VAR.sub(value, expr)


def promql_metric_names(expr):
    """The metric names a PromQL expression selects. Drops strings, label
    matchers, ranges and grouping labels, then keeps the identifiers that are
    neither keywords nor followed by "(" (functions, aggregations)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", e):
        if m.group(0).lower() not in PROMQL_KEYWORDS and not e[m.end():].lstrip().startswith("("):
            names.add(m.group(0))
    return names


def scrape_proxy(tmp_path, name, extra_args):
    """Starts the proxy with <extra_args>, returns its /metrics text, stops it."""
    admin = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("IDEMPROXY_", "IDEMPOTENCY_"))}
    log = open(tmp_path / ("%s.log" % name), "w+")
    proc = subprocess.Popen(
        [BIN, "--upstream", "http://127.0.0.1:1", "--listen",
         "127.0.0.1:%d" % free_port(), "--admin-listen", "127.0.0.1:%d" % admin, *extra_args],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def scraped():
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail("idemproxy (%s) exited %d:\n%s" % (name, proc.returncode, log.read()))
            try:
                return http(admin, "GET", "/metrics")[1].decode()
            except OSError:
                return None

        return wait_for(scraped, timeout=10, what="the %s proxy's /metrics" % name)
    finally:
        stop(proc)
        log.close()


def exposed_samples(text):
    """The sample names of an exposition: histogram families as _bucket, _sum, _count."""
    return {re.match(r"[A-Za-z_:][\w:]*", line).group(0)
            for line in text.splitlines() if line and not line.startswith("#")}


def exposed_families(text):
    """{family: type} from the # TYPE lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def family_of(name, families):
    """The family a sample name belongs to: a histogram's _bucket/_sum/_count
    count as the histogram."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[:-len(suffix)]
        if name.endswith(suffix) and families.get(base) == "histogram":
            return base
    return name


def rule_exprs():
    return [(r["alert"], r["expr"]) for r in alert_rules()]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory, redis_url, pg_url):
    """{store: /metrics text} of a real proxy on each store."""
    d = tmp_path_factory.mktemp("proxy")
    return {"memory": scrape_proxy(d, "memory", []),
            "redis": scrape_proxy(d, "redis", ["--redis", redis_url]),
            "postgresql": scrape_proxy(d, "postgresql", ["--store", pg_url])}


# --------------------------------------------------------------------------- rules


def test_rules_pass_promtool_check():
    out = assert_promtool_ok("check", "rules", RULES)
    assert "SUCCESS: %d rules found" % len(alert_rules()) in out, out


def test_rule_unit_tests_pass_promtool_test():
    # promtool reads rule_files relative to the test file.
    assert_promtool_ok("test", "rules", RULE_TESTS)


def test_rules_define_the_required_alerts():
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names)), "an alert is defined twice: %s" % names
    assert set(names) == REQUIRED_ALERTS


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_has_severity_and_runbook(rule):
    assert rule["labels"]["severity"] in ("page", "ticket")
    notes = rule["annotations"]
    assert set(notes) == {"summary", "description", "runbook"}
    assert notes["runbook"] == RUNBOOK % rule["alert"]
    runbook = (ROOT / "doc" / "operations.md").read_text()
    assert "\n#### %s\n" % rule["alert"] in runbook, "doc/operations.md has no runbook for " + rule["alert"]
    if not rule["expr"].startswith("absent("):  # absent() has no instance
        assert "{{ $labels.instance }}" in notes["summary"] + notes["description"]


def rule_test_cases(alert):
    """The exp_alerts of each promtool case that evaluates <alert>."""
    return [case.get("exp_alerts") or [] for group in load_yaml(RULE_TESTS)["tests"]
            for case in group.get("alert_rule_test", []) if case["alertname"] == alert]


@pytest.mark.parametrize("alert", sorted(REQUIRED_ALERTS))
def test_alert_has_firing_and_silent_unit_tests(alert):
    """Silent: a case expecting no alert at all (below the threshold, too
    little traffic, a blip shorter than "for", or after the cause went away)."""
    cases = rule_test_cases(alert)
    assert any(cases), "no case where %s fires" % alert
    assert [] in cases, "no case where %s must stay silent" % alert


# --------------------------------------------------------------------------- dashboard


def test_dashboard_queries_pass_promtool(tmp_path):
    queries = dashboard_queries(load_dashboard())
    assert len(queries) == DASHBOARD_QUERIES, [w for w, _ in queries]
    rules = {"groups": [{"name": "idemproxy_dashboard", "rules": [
        {"record": "dashboard:query_%d" % i, "expr": substitute_grafana_vars(e)}
        for i, (_, e) in enumerate(queries)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules, allow_unicode=True))
    out = assert_promtool_ok("check", "rules", str(path))
    assert "SUCCESS: %d rules found" % DASHBOARD_QUERIES in out, out


def test_dashboard_structure():
    d = load_dashboard()
    assert "__inputs" not in d and 37 <= d["schemaVersion"] <= 39
    ids = [p["id"] for p in all_panels(d)]
    assert len(ids) == len(set(ids)), "panel ids repeat: %s" % ids
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "route"):
        assert variables[name]["datasource"] == DATASOURCE
        assert variable_promql(variables[name]), "%s: not label_values(EXPR, label)" % name
    assert REQUIRED_PANELS <= {p["title"] for p in query_panels(d)}


@pytest.mark.parametrize("panel", query_panels(load_dashboard()), ids=lambda p: p["title"])
def test_dashboard_panel_is_complete(panel):
    assert panel["datasource"] == DATASOURCE
    assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
    assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    refs = [t["refId"] for t in panel["targets"]]
    assert refs and len(refs) == len(set(refs))
    for t in panel["targets"]:
        assert t["datasource"] == DATASOURCE and t["expr"].strip()


def test_dashboard_panels_do_not_overlap():
    cells = {}
    for p in all_panels(load_dashboard()):
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, "%r overlaps %r" % (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]


# --------------------------------------------------------------------------- a real scrape


@pytest.mark.parametrize("source,exprs", [
    ("rules", rule_exprs()),
    ("dashboard", dashboard_queries(load_dashboard())),
], ids=["rules", "dashboard"])
def test_named_metrics_are_exported(scrapes, source, exprs):
    exported = set().union(*(exposed_samples(t) for t in scrapes.values())) | PROMETHEUS_SERIES
    unnamed = [where for where, e in exprs if not promql_metric_names(e)]
    assert exprs and not unnamed, "no metric name found in the %s: %s" % (source, unnamed)
    named = {(where, n) for where, e in exprs for n in promql_metric_names(e)}
    missing = sorted((where, n) for where, n in named if n not in exported)
    assert not missing, "not in a scrape of the proxy: %s" % missing


def test_dashboard_shows_every_exported_family(scrapes):
    families = {}
    for text in scrapes.values():
        families.update(exposed_families(text))
    shown = {family_of(n, families) for _, e in dashboard_queries(load_dashboard())
             for n in promql_metric_names(e)}
    assert not set(families) - shown, "families no panel shows: %s" % sorted(set(families) - shown)


@pytest.mark.parametrize("store", ["memory", "redis", "postgresql"])
def test_scrape_passes_promtool_check_metrics(scrapes, store):
    assert "idemproxy_requests_total{" in scrapes[store]
    out = assert_promtool_ok("check", "metrics", stdin=scrapes[store])
    assert not out.strip(), "promtool check metrics found problems:\n" + out
