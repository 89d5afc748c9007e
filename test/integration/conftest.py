"""Fixtures for the idemproxy integration suite: a real redis-server, a fake
upstream and a factory that starts the proxy binary, and the hooks that
collect each pass. The code they run is in the fixtures package
(fixtures/__init__.py lists its modules); this file keeps the pytest side.

One behaviour suite, two stores: the `proxy` factory runs the proxy on the
store of the `store` fixture, parametrised "redis" and "memory", so every test
that starts a proxy runs on both (ids `test_executed[redis]`,
`test_executed[memory]`). A test narrows that with one decorator:

  @redis_only          the behaviour exists or is observable only with Redis
                       (PTTL values, hash edits, Redis down, several proxies
                       sharing one Redis); the test name must say "redis"
  @shared_store        several proxies share one store (Redis; PostgreSQL in its
                       pass); the test name must say "shared"
  @memory_only         a property of the memory store (eviction, restart);
                       the test name must say "memory"
  @store_independent   the test does not depend on the store (CLI, forwarding):
                       it runs once, on the memory store, the default

The names are checked at collection (the decorators are in fixtures/marks.py).
State is checked through the helpers of fixtures/probes.py,
assert_locked / assert_completed / assert_free / assert_nothing_stored /
wait_completed, which probe behaviour on both stores (a duplicate gets 409, is
replayed, or executes) and, on Redis, also read the hash.

On PostgreSQL: with IDEMPROXY_TEST_STORE=postgresql, the `store` fixture has a
third value, "postgresql" (a server of fixtures/postgres.py, one per worker, its
table emptied before each test), and only the tests that run on it are
collected; the state probes read its rows as they read Redis's hashes.
scripts/test runs this pass once, in the plain build.

On a cluster: with IDEMPROXY_TEST_REDIS_KIND=cluster, the "redis" store is a
Redis Cluster of three masters and three replicas (fixtures.redis.ClusterSet,
started once for the session; rdb is then a redis-py RedisCluster client, which
sums DBSIZE and scans every master), and only the tests that run on it are
collected: those of the "redis" store, less the ones marked
@single_redis_server (they stop or restart the one server, or connect to its
port by another name) and those of test_redis_*.py (they start servers of
their own). scripts/test runs the suite both ways.

Run: IDEMPROXY_BIN=build/src/idemproxy /usr/bin/python3 -m pytest -q test/integration
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the fixtures package
from fixtures.marks import CLIENTS, ON_CLUSTER, ON_PG, SANITIZED, STORES  # noqa: E402
from fixtures.postgres import PgServer  # noqa: E402
from fixtures.proxy import Proxy  # noqa: E402
from fixtures.redis import REDIS_SERVER, ClusterServer, RedisServer  # noqa: E402
from fixtures.upstream import FakeUpstream  # noqa: E402


# --------------------------------------------------------------------------- stores
@pytest.fixture(params=STORES)
def store(request):
    """The store the proxy factory uses by default: "redis" or "memory" (and
    "postgresql" in the PostgreSQL pass)."""
    return request.param


@pytest.fixture(scope="session")
def pg_server():
    """The suite's PostgreSQL server (one per worker), for the PostgreSQL pass."""
    with PgServer() as pg:
        yield pg


@pytest.fixture
def pgdb(request):
    """The suite's PgServer with the proxy's table emptied (when it exists)."""
    pg = request.getfixturevalue("pg_server")
    pg.sql("DO $$ BEGIN IF to_regclass('idemproxy_keys') IS NOT NULL THEN "
           "TRUNCATE idemproxy_keys; END IF; END $$")
    return pg


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip("no %s" % REDIS_SERVER)
    if ON_CLUSTER:
        srv = ClusterServer(str(tmp_path_factory.mktemp("cluster")))
    else:
        srv = RedisServer(str(tmp_path_factory.mktemp("redis")))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def rdb(redis_server):
    """A client of a running, empty redis_server (restarted if a test stopped it)."""
    if not redis_server.running():
        redis_server.start()
    c = redis_server.client()
    c.flushall()
    yield c
    if not redis_server.running():
        redis_server.start()
    c.close()


# --------------------------------------------------------------------------- upstream
@pytest.fixture
def upstream():
    srv = FakeUpstream().start()
    yield srv
    srv.stop()


@pytest.fixture
def upstream_client(request):
    """The client the proxy factory asks for: "own" unless the test's module
    is marked both_clients, which runs its tests on each."""
    return getattr(request, "param", "own")


def pytest_generate_tests(metafunc):
    if (metafunc.definition.get_closest_marker("both_clients")
            and "proxy" in metafunc.fixturenames):
        metafunc.parametrize("upstream_client", CLIENTS, indirect=True)


# --------------------------------------------------------------------------- proxy
@pytest.fixture
def proxy(request, store, upstream, redis_server, rdb, tmp_path, upstream_client):
    """proxy(*extra_args, env=None, upstream_url=None, redis_url=None, store=None,
    redis_arg=None, start=True): starts idemproxy against the upstream fixture, on
    the store of the `store` fixture unless store= says otherwise, and on the
    upstream client of the `upstream_client` fixture.
    upstream_url=False omits --upstream. On "redis", --redis is the suite's Redis
    (or redis_url); on "memory" there is no --redis. redis_arg=False omits --redis
    even on Redis (the URL then comes from env)."""
    started = []
    request.node._idem_proxies = started
    default_store = store

    def factory(*extra, env=None, upstream_url=None, redis_url=None, store=None,
                redis_arg=None, start=True):
        kind = store or ("redis" if redis_url else default_store)
        assert kind in STORES, kind
        if redis_arg is None:
            redis_arg = kind == "redis"
        args = [] if upstream_url is False else ["--upstream", upstream_url or upstream.url]
        if redis_arg:
            args += ["--redis", redis_url or redis_server.url]
        pg = request.getfixturevalue("pgdb") if kind == "postgresql" else None
        if pg is not None:
            args += ["--store", pg.url]
        if upstream_client == "curl":
            args += ["--upstream-client", "curl"]
        args += list(extra)
        p = Proxy(args, env, str(tmp_path), "proxy%d" % len(started), store=kind, rdb=rdb,
                  upstream=upstream if upstream_url in (None, False) else None, pg=pg)
        started.append(p)
        if start:
            p.start()
        return p

    yield factory
    upstream.release_all()  # a /hold left waiting would hold the drain
    bad = []
    for p in started:
        if p.proc is None:
            continue
        rc = p.stop()
        if rc != 0:
            bad.append((p, rc))
    if bad:
        pytest.fail("\n".join("idemproxy %s exited with %s on SIGTERM (expected 0):\n%s"
                              % (p.name, rc, p.stderr()) for p, rc in bad))
    # A proxy on the memory store never writes to Redis.
    if started and all(p.store == "memory" for p in started) and redis_server.running():
        assert rdb.dbsize() == 0, "a memory-store proxy wrote to Redis: %r" % (
            [k for k in rdb.scan_iter(count=1000)],)


# --------------------------------------------------------------------------- collection and reports
def pytest_configure(config):
    config.addinivalue_line("markers", "store_independent: the test runs once, on the "
                            "memory store, because it does not depend on the store")
    config.addinivalue_line("markers", "single_redis_server: the test needs the suite's Redis "
                            "to be one server; it does not run on a cluster")
    config.addinivalue_line("markers", "heavy: the test moves hundreds of MiB: plain build only")
    config.addinivalue_line("markers", "both_clients: the module's tests run on both upstream "
                            "clients, idemproxy's own and libcurl's (plain pass, memory store)")
    config.addinivalue_line("markers", "concurrency: the test exercises threads racing (duplicates, "
                            "--wait, reload, heartbeats, failover): scripts/test runs it under "
                            "ThreadSanitizer too")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that runs on one store only says why in its name."""
    bad = set()
    for item in items:
        if "store" not in getattr(item, "fixturenames", ()):
            continue
        for m in item.iter_markers("parametrize"):
            names = m.args[0]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
            if list(names) != ["store"]:
                continue
            values = sorted(set(m.args[1]))
            name = item.originalname or item.name
            if "postgresql" in values and "memory" not in values and "shared" not in name:
                bad.add("%s: runs on the shared stores only, its name must say shared"
                        % item.nodeid)
            elif values == ["redis"] and "redis" not in name:
                bad.add("%s: runs on Redis only, its name must say redis" % item.nodeid)
            elif (values == ["memory"] and "memory" not in name
                  and item.get_closest_marker("store_independent") is None):
                bad.add("%s: runs on the memory store only, its name must say memory "
                        "(or mark it @store_independent)" % item.nodeid)
    if bad:
        raise pytest.UsageError("\n".join(sorted(bad)))
    # libcurl's client runs the both_clients tests in the plain pass, once:
    # on the memory store, or on the store a test is bound to.
    drop = []
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params or params.get("upstream_client") != "curl":
            continue
        name = item.originalname or item.name
        if (SANITIZED or ON_PG or ON_CLUSTER
                or (params.get("store") == "redis" and "redis" not in name
                    and "shared" not in name)):
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
    if SANITIZED:
        drop = [i for i in items if i.get_closest_marker("heavy")]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [i for i in items if i not in drop]
    if ON_PG:
        # The PostgreSQL pass: the tests of the "postgresql" store only.
        keep = [i for i in items if getattr(i, "callspec", None) is not None
                and i.callspec.params.get("store") == "postgresql"]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep
    if ON_CLUSTER:
        # The cluster pass: the tests of the suite's Redis store, now a cluster.
        keep, drop = [], []
        for item in items:
            callspec = getattr(item, "callspec", None)
            on_redis = callspec is not None and callspec.params.get("store") == "redis"
            # test_redis_*.py start Redis servers of their own (TLS, Sentinel, a cluster)
            own_servers = item.module.__name__.startswith("test_redis_")
            if (on_redis and not own_servers
                    and not item.get_closest_marker("single_redis_server")):
                keep.append(item)
            else:
                drop.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "setup"):
        for p in getattr(item, "_idem_proxies", []):
            rep.sections.append(("idemproxy %s stderr (%s)" % (p.name, " ".join(p.args[1:])),
                                 p.stderr()))
