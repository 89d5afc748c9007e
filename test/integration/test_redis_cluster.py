"""Redis Cluster (doc/stores.md, Pointing idemproxy at Redis: Redis Cluster):
the proxy finds the cluster from any seed node (CLUSTER SLOTS), sends each
store key to its slot's master (CRC16, hash tags honoured), follows MOVED and
ASK while a slot moves, rides out a master's failover without a restart, wakes
--wait duplicates across nodes, and /keys scans every master. Real servers:
three masters with a replica each (fixtures.redis.ClusterSet,
cluster-node-timeout 2000 ms).

A store key is idem:<32 hex scope>:<client key>; its first "{" is the client
key's, so a client key "{t}-1" puts the store key in the slot of "t"
whatever the scope: the tests pick a master (or one slot) that way.

The shared cluster (module scope) serves the tests that leave it as it was;
the migration, the failover and TLS get clusters of their own."""
import json
import threading
import time
import urllib.parse
import uuid

import pytest
import redis

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.load import Load
from fixtures.marks import redis_only
from fixtures.pki import make_pki
from fixtures.probes import assert_free, start_held
from fixtures.redis import SCRIPTS, ClusterSet, Monitor, cut_links
from fixtures.waiting import free_port, in_thread, wait_for

# How long service may stop when a master dies: the other masters flag it
# PFAIL after cluster-node-timeout (2 s) and FAIL once a majority agrees (a
# gossip round or two); its replica then waits 500 ms + up to 500 ms random
# (+ 1 s per rank, none here: one replica) before its election, which takes a
# round trip to the masters (the fixture measures about 4 s in all). The
# proxy then needs one CLUSTER SLOTS (asked at most once a second, and every
# second by its readiness check while a master does not answer) and a retry
# within --store-timeout (1 s). 15 s bounds that with room for a loaded
# machine, as test_redis_sentinel.py's FAILOVER_BOUND_S does.
FAILOVER_BOUND_S = 15.0


def readyz(p):
    return p.admin_request("GET", "/readyz")[0]


def execute(p, key, body=b"c", timeout=10):
    return p.request("POST", "/echo", [("Idempotency-Key", key)], body, timeout=timeout)


def held_req(key, body=b"held"):
    return ("POST", "/hold?id=%s" % key, [("Idempotency-Key", key)], body)


def redirections(p):
    return metrics_value(p.metrics(), "idemproxy_redis_redirections_total")


def client_key(store_key):
    """The client key of a store key idem:<scope>:<key> (str or bytes)."""
    if isinstance(store_key, bytes):
        store_key = store_key.decode()
    return store_key.split(":", 2)[2]


def stored_on(cs, addr, prefix="idem:*"):
    """The store keys the master at addr holds (SCAN MATCH), as str: records,
    not their tombstones (idem:t:...) or resource links (idem:r:...)."""
    c = cs.node_client(addr)
    try:
        return [k.decode() for k in c.scan_iter(match=prefix, count=1000)
                if not k.startswith((b"idem:t:", b"idem:r:"))]
    finally:
        c.close()


def tag_on(cs, master, prefix="t"):
    """A hash tag whose slot the master at <master> serves: a client key
    "{tag}-..." is stored there."""
    ranges = cs.slots_of(master)
    for i in range(10000):
        tag = "%s%d" % (prefix, i)
        slot = cs.slot_of(tag)
        if any(a <= slot <= b for a, b in ranges):
            return tag
    raise AssertionError("no tag found for %s:%d" % master)


def exists_asking(cs, addr, key):
    """EXISTS <key> on the node at addr after ASKING (a slot it imports
    answers MOVED otherwise): 1 or 0."""
    c = cs.node_client(addr)
    try:
        pipe = c.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.exists(key)
        return pipe.execute()[1]
    finally:
        c.close()


def assert_ask(cs, src, dst, slot, key):
    """The source of a slot being migrated does not hold <key>: it answers
    ASK to the destination for it."""
    c = cs.node_client(src)
    try:
        with pytest.raises(redis.exceptions.ResponseError,
                           match=r"^ASK %d 127\.0\.0\.1:%d$" % (slot, dst[1])):
            c.exists(key)
    finally:
        c.close()


def use_cluster_client(p, cs):
    """The probes (start_held, assert_free...) read the store through
    p.rdb: point it at the cluster (a RedisCluster scans every master)."""
    p.rdb = cs.client()
    return p


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for the tests that do not break it (they leave every slot
    where it was and every node running)."""
    cs = ClusterSet(str(tmp_path_factory.mktemp("cluster")))
    try:
        cs.start()
        print("shared cluster up in %.2f s" % cs.startup_seconds)
        yield cs
    finally:
        cs.stop()


@pytest.fixture
def own_cluster(tmp_path):
    """factory(**ClusterSet kwargs): a cluster of the test's own (it kills a
    master or moves a slot), stopped at teardown."""
    started = []

    def factory(**kw):
        cs = ClusterSet(str(tmp_path / ("cluster%d" % len(started))), **kw)
        started.append(cs)
        cs.start()
        print("own cluster up in %.2f s" % cs.startup_seconds)
        return cs

    yield factory
    for cs in started:
        cs.stop()


# --------------------------------------------------------------------------- routing


@redis_only
def test_cluster_keys_spread_over_every_master_each_on_its_slot_redis(proxy, upstream, cluster):
    """Proves the routing: 60 keys executed through the proxy are stored
    each exactly once, as one completed hash, on the master that serves
    the store key's slot (CLUSTER KEYSLOT, i.e. CRC16 of the whole store
    key: no tag), every master getting some; all 60 replay byte for byte
    without reaching the upstream."""
    cs = cluster
    p = proxy(redis_url=cs.seed_url(seeds=3))
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 on the cluster")
    keys = [new_key() for _ in range(60)]
    bodies = {}
    for k in keys:
        st, h, body = execute(p, k, k.encode())
        assert st == 201 and hone(h, REPLAY) == "false", (st, h, body[:200])
        bodies[k] = body
    assert upstream.hits("/echo") == 60
    ours = set(keys)
    where = {}  # client key -> [(master, store key)]
    per_master = {}
    for m in cs.masters():
        found = [sk for sk in stored_on(cs, m) if client_key(sk) in ours]
        per_master["%s:%d" % m] = len(found)
        c = cs.node_client(m)
        try:
            for sk in found:
                where.setdefault(client_key(sk), []).append((m, sk))
                assert c.type(sk) == b"hash", sk
                assert c.hget(sk, "state") == b"C", (sk, c.hgetall(sk))
                # the master that holds it is the one its slot belongs to
                assert cs.master_of_slot(cs.slot_of(sk)) == m, sk
        finally:
            c.close()
    print("60 keys over the masters: %s" % per_master)
    assert all(n > 0 for n in per_master.values()), per_master
    # each key stored once, on one master only (no copy on another master)
    assert sorted(where) == sorted(keys)
    assert all(len(v) == 1 for v in where.values()), {k: v for k, v in where.items()
                                                      if len(v) != 1}
    for k in keys:
        st, h, body = execute(p, k, k.encode())
        assert st == 201 and hone(h, REPLAY) == "true" and body == bodies[k], (k, st, h)
    assert upstream.hits("/echo") == 60
    # nothing was redirected: the proxy's map was right from the start
    assert redirections(p) == 0


@redis_only
def test_cluster_one_seed_even_a_replica_finds_the_whole_cluster_redis(proxy, upstream,
                                                                       cluster):
    """Proves discovery: seeded with one replica's address only (and, in a
    second proxy, a dead address first), the proxy learns every master from
    CLUSTER SLOTS: /readyz 200, and keys of every master execute and replay
    there (the replica never holds a write of its own: writes go to its
    master)."""
    cs = cluster
    replica = cs.replicas()[0]
    dead = ("127.0.0.1", free_port())  # nothing listens there
    p = proxy(redis_url=cs.seed_url(seeds=[replica]))
    p2 = proxy(redis_url=cs.seed_url(seeds=[dead, cs.replicas()[1]]))
    for q in (p, p2):
        t0 = time.monotonic()
        wait_for(lambda: readyz(q) == 200, timeout=10, what="/readyz 200 from one seed")
        print("%s: /readyz 200 %.2f s after the first look" % (q.name, time.monotonic() - t0))
        for m in cs.masters():
            key = "{%s}-%s" % (tag_on(cs, m), uuid.uuid4().hex)
            before = upstream.hits()
            st, h, body = execute(q, key)
            assert st == 201 and hone(h, REPLAY) == "false", (st, h, body[:200])
            st, h, body2 = execute(q, key)
            assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
            assert upstream.hits() == before + 1
            assert [client_key(sk) for sk in stored_on(cs, m, "idem:*:" + key)] == [key]
    assert redirections(p) == 0 and redirections(p2) == 0


# --------------------------------------------------------------------------- a slot moves


@redis_only
@pytest.mark.concurrency
def test_cluster_slot_migrated_under_load_ask_and_moved_redis(proxy, upstream, own_cluster):
    """Proves MOVED and ASK are followed, and that no request is lost or
    executed twice while a slot moves: a load of new keys and replays in one
    slot runs through the proxy across begin_migration, two partial
    MIGRATEs and finish_migration; every answer is a 201 (executed the first
    time, replayed byte for byte after) and the upstream saw each key once.
    ASK: a key created before the move and migrated (only on the
    destination, the slot still MIGRATING, so the map still names the
    source) replays, and a new key is created on the destination, each
    counted as a redirection. MOVED: after the move, the first replays sent
    by the stale map are redirected (counted) and succeed."""
    cs = own_cluster()
    src = cs.masters()[0]
    dst = cs.masters()[1]
    tag = tag_on(cs, src)
    slot = cs.slot_of(tag)
    assert cs.slot_of("idem:%s:{%s}-1" % ("0" * 32, tag)) == slot
    p = proxy(redis_url=cs.seed_url(seeds=3))
    t_start = time.monotonic()
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    pre = {}
    for i in range(20):
        key = "{%s}-pre-%d-%s" % (tag, i, uuid.uuid4().hex[:8])
        st, h, body = execute(p, key, b"load " + key.encode())
        assert st == 201 and hone(h, REPLAY) == "false"
        pre[key] = body
    assert sorted(client_key(k) for k in stored_on(cs, src)) == sorted(pre)
    assert redirections(p) == 0

    # new keys and replays (of <pre> and of its own keys) in the slot, each answer checked
    load = Load([p], workers=3, tag=tag, replays=0.5, known=pre, check=True, pace_s=0.01).start()
    try:
        time.sleep(0.4)
        assert cs.begin_migration(slot, dst) == src
        time.sleep(0.4)
        c = cs.node_client(src)
        half = c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) // 2
        c.close()
        moved = cs.migrate_keys(slot, count=half)
        assert len(moved) == half > 0
        time.sleep(0.4)

        load.pause()
        n_before_ask = load.count()
        # ASK, for a replay: a key completed on the source before the migration
        # began (new keys since then went to the destination), migrated, so
        # now on the destination only
        probe_sk = next(sk for sk in moved if client_key(sk) in load.bodies)
        probe = client_key(probe_sk)
        assert_ask(cs, src, dst, slot, probe_sk)
        assert exists_asking(cs, dst, probe_sk) == 1
        assert cs.master_of_slot(slot) == src  # the map still says the source
        r0 = redirections(p)
        hits = upstream.hits("/echo")
        st, h, body = execute(p, probe, b"load " + probe.encode())
        assert st == 201 and hone(h, REPLAY) == "true" and body == load.bodies[probe], (st, h)
        assert upstream.hits("/echo") == hits
        r1 = redirections(p)
        assert r1 >= r0 + 1, (r0, r1)
        # ASK, for a new key: the source has no such key, the destination takes it
        fresh = "{%s}-fresh-%s" % (tag, uuid.uuid4().hex)
        st, h, fresh_body = execute(p, fresh, b"load " + fresh.encode())
        assert st == 201 and hone(h, REPLAY) == "false"
        fresh_sk = "idem:%s:%s" % (probe_sk.split(":")[1], fresh)
        assert exists_asking(cs, dst, fresh_sk) == 1
        assert_ask(cs, src, dst, slot, fresh_sk)
        r2 = redirections(p)
        assert r2 >= r1 + 1, (r1, r2)
        load.bodies[fresh] = fresh_body
        print("ASK: a migrated key replayed and a new key created on the destination "
              "(redirections %d -> %d -> %d)" % (r0, r1, r2))
        load.resume()

        time.sleep(0.5)
        rest = cs.migrate_keys(slot)
        time.sleep(0.4)

        load.pause()
        n_before_moved = load.count()
        assert n_before_moved > n_before_ask  # the load ran during the migration
        cs.finish_migration(slot, dst)
        assert cs.master_of_slot(slot) == dst
        r3 = redirections(p)
        # MOVED: the proxy's map still names the source, which now says MOVED
        for k in list(pre)[:5]:
            st, h, body = execute(p, k, b"load " + k.encode())
            assert st == 201 and hone(h, REPLAY) == "true" and body == pre[k], (k, st, h)
        r4 = redirections(p)
        assert r4 >= r3 + 1, (r3, r4)
        took = time.monotonic() - t_start
        print("MOVED after finish_migration (redirections %d -> %d), %.1f s after the "
              "proxy started (its idle map refresh is every 10 s)" % (r3, r4, took))
        load.resume()
        time.sleep(0.5)
    finally:
        load.stop()
    assert load.errors == [], load.errors[:10]
    n_during = load.count()
    print("load: %d executed, %d replayed, none refused; %d keys moved (%d, then %d)"
          % (load.executed, load.replayed, len(moved) + len(rest), len(moved), len(rest)))
    assert load.executed >= 10 and load.replayed >= 10, (load.executed, load.replayed)
    assert n_during > n_before_moved
    # every key lives on the destination now, and nowhere else
    on_dst = {client_key(k) for k in stored_on(cs, dst)}
    assert set(load.bodies) <= on_dst
    assert not {client_key(k) for k in stored_on(cs, src)} & set(load.bodies)
    # each key reached the upstream exactly once, and all of them replay still
    for key, body in load.bodies.items():
        assert upstream.received("Idempotency-Key", key) == 1, key
    hits = upstream.hits("/echo")
    for key, body in load.bodies.items():
        st, h, b = execute(p, key, b"load " + key.encode())
        assert st == 201 and hone(h, REPLAY) == "true" and b == body, key
    assert upstream.hits("/echo") == hits == len(load.bodies)


# --------------------------------------------------------------------------- a master dies


@redis_only
@pytest.mark.concurrency
def test_cluster_master_killed_under_load_service_resumes_redis(proxy, upstream, own_cluster):
    """Proves a failover is ridden out without a restart: the master of slot
    0 is SIGKILLed while keys of its slots (and of another master's) are
    executed one after another; its replica takes over; the proxy answers
    only 201 or 503 store_unavailable meanwhile, /readyz says 503 while
    those slots have no master that answers and 200 again after, requests
    for those slots succeed again within FAILOVER_BOUND_S (measured and
    printed), a key completed (and replicated) before the kill still
    replays, new keys of those slots are stored on the promoted replica,
    and the failover is counted. The proxy is seeded with the killed master
    alone: it must go on from the map it learned."""
    cs = own_cluster()
    victim = cs.master_of_slot(0)
    other = next(m for m in cs.masters() if m != victim)
    (replica,) = cs.replicas(master=victim)
    vtag, otag = tag_on(cs, victim, "v"), tag_on(cs, other, "o")
    p = proxy(redis_url=cs.seed_url(seeds=[victim]))
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    done_key = "{%s}-done-%s" % (vtag, uuid.uuid4().hex)
    st, _, done_body = execute(p, done_key, b"before")
    assert st == 201
    vc = cs.node_client(victim)
    # replicated before the kill: Redis promises no more than that
    assert vc.wait(1, 2000) >= 1
    vc.close()
    assert metrics_value(p.metrics(), "idemproxy_redis_failovers_total") == 0

    # new keys of each master's slots, one after another
    vload, oload = Load([p], tag=vtag).start(), Load([p], tag=otag).start()
    vres, ores = vload.answers, oload.answers
    ready_samples = []
    stop_ready = threading.Event()

    def poll_ready():
        while not stop_ready.is_set():
            try:
                ready_samples.append((time.monotonic(), readyz(p)))
            except OSError:
                ready_samples.append((time.monotonic(), 0))
            time.sleep(0.05)

    rt = threading.Thread(target=poll_ready, daemon=True)
    try:
        time.sleep(0.5)
        assert vres and all(a.status == 201 for a in vres), vres
        rt.start()
        old = cs.kill_master(victim)
        t_kill = time.monotonic()
        wait_for(lambda: readyz(p) == 503, timeout=3, what="/readyz 503 with a master gone")
        took = cs.wait_failover(old, timeout=FAILOVER_BOUND_S)
        assert cs.promoted[old] == replica
        # service resumes without a restart of the proxy
        wait_for(lambda: any(a.sent > t_kill and a.status == 201 for a in vres[-20:]),
                 timeout=FAILOVER_BOUND_S, what="a 201 on the failed master's slots")
        wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200 after the failover")
        t_ready = time.monotonic()
        time.sleep(0.5)
    finally:
        stop_ready.set()
        vload.stop()
        oload.stop()
        if rt.ident is not None:
            rt.join(15)
    resumed = min(a.done for a in vres if a.sent > t_kill and a.status == 201) - t_kill
    for name, res in (("failed master", vres), ("other master", ores)):
        outcomes = {(a.status, a.code) for a in res}
        # refused while there was no master, never worse (no 5xx of another kind, no hang)
        assert outcomes <= {(201, None), (503, "store_unavailable")}, (name, outcomes)
    assert resumed < FAILOVER_BOUND_S
    # /readyz: 503 from shortly after the kill (its detection: a failed op, or
    # the readiness PING every second) until the proxy saw the new master,
    # which cannot be before cluster-node-timeout (2 s): no replica is
    # elected before its master is flagged; then 200 for good
    after = [(t, s) for t, s in ready_samples if t > t_kill + 1.5]
    back = next((t for t, s in after if s == 200), None)
    assert back is not None, after
    assert back - t_kill >= 2.0, (back - t_kill, after)
    assert {s for t, s in after if t < back} == {503}, after
    assert {s for t, s in after if t >= back} == {200}, after
    refused_v = sum(1 for a in vres if a.status == 503)
    refused_o = sum(1 for a in ores if a.status == 503)
    print("failover: the cluster promoted the replica %.2f s after the kill; the proxy "
          "served the failed master's slots again %.2f s after it, /readyz 200 after "
          "%.2f s; failed master's slots: %d requests, %d refused; other master's: %d "
          "requests, %d refused" % (took, resumed, t_ready - t_kill, len(vres), refused_v,
                                    len(ores), refused_o))
    assert p.alive()
    # the answer completed and replicated before the kill still replays
    st, h, body = execute(p, done_key, b"before")
    assert st == 201 and hone(h, REPLAY) == "true" and body == done_body
    # a new key of those slots lands on the promoted replica
    key = "{%s}-after-%s" % (vtag, uuid.uuid4().hex)
    assert execute(p, key)[0] == 201
    assert [client_key(k) for k in stored_on(cs, replica, "idem:*:" + key)] == [key]
    assert metrics_value(p.metrics(), "idemproxy_redis_failovers_total") >= 1
    assert metrics_value(p.metrics(), "idemproxy_redis_connected") == 1


# --------------------------------------------------------------------------- --wait


@redis_only
@pytest.mark.concurrency
def test_cluster_wait_across_two_proxies_woken_on_every_master_redis(proxy, upstream, cluster):
    """Proves --wait notifications cross the cluster: proxy A runs a held
    request for a key of each master in turn; proxy B (seeded with the third
    master only), with --wait 5, holds a duplicate; when the upstream
    answers A, B replays A's answer (replayed true, one upstream hit) at
    once: it was woken by the PUBLISH of A's completion, which Redis
    Cluster sends to every node, whichever one B subscribed on.

    "At once" is what tells a notification from B's own fallback: a held
    duplicate is also retried, unnotified, every WAITLIST_POLL_MS (500 ms)
    from when it was held. A is released 0.3 s after B's duplicate was
    sent, so B's poll would answer about 0.2 s after the release; a
    notification answers within milliseconds (measured ~2 ms). Hence the
    0.15 s bound."""
    cs = cluster
    a = use_cluster_client(proxy(redis_url=cs.seed_url(seeds=3)), cs)
    b = proxy("--wait", "5", redis_url=cs.seed_url(seeds=[cs.masters()[2]]))
    wait_for(lambda: readyz(a) == 200 and readyz(b) == 200, timeout=10, what="/readyz 200")
    woken = []
    for m in cs.masters():
        key = "{%s}-wait-%s" % (tag_on(cs, m, "w"), uuid.uuid4().hex)
        hits = upstream.hits("/hold")
        first = start_held(a, key)
        box = {}

        def dup():
            r = b.request(*held_req(key), timeout=30)
            box["at"] = time.monotonic()
            return r

        get = in_thread(dup)
        time.sleep(0.3)
        assert "at" not in box, "the duplicate was answered before the first ended"
        t_release = time.monotonic()
        upstream.release(key)
        st1, h1, body1 = first()
        st, h, body = get()
        elapsed = box["at"] - t_release
        woken.append(elapsed)
        assert st1 == 200 and hone(h1, REPLAY) == "false"
        assert st == 200 and hone(h, REPLAY) == "true" and body == body1, (st, h, body[:200])
        assert upstream.hits("/hold") == hits + 1
        assert [client_key(k) for k in stored_on(cs, m, "idem:*:" + key)] == [key]
        assert elapsed < 0.15, (m, elapsed)
    print("B's held duplicates answered %s s after the upstream released A's request"
          % ", ".join("%.3f" % e for e in woken))


# --------------------------------------------------------------------------- /keys


def admin_keys(p, method, key, query=""):
    path = "/keys/" + urllib.parse.quote(key, safe="") + query
    st, h, body = p.admin_request(method, path)
    # answers are JSON, errors problem+json (doc/operations.md, The admin listener)
    want = "application/json" if st < 400 else "application/problem+json"
    assert (hone(h, "Content-Type") or "").split(";")[0] == want, (st, h)
    return st, json.loads(body)


@redis_only
def test_cluster_admin_keys_finds_and_purges_on_any_master_redis(proxy, upstream, cluster):
    """Proves /keys scans every master: GET /keys/<key> finds a key on
    whichever master holds it, and lists in one answer the records of one
    key under many scopes spread over all three masters; DELETE purges a
    record from its master, after which the request executes again."""
    cs = cluster
    p = use_cluster_client(proxy(redis_url=cs.seed_url(seeds=1)), cs)
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    for m in cs.masters():
        key = "{%s}-keys-%s" % (tag_on(cs, m, "k"), uuid.uuid4().hex)
        st, _, body = execute(p, key)
        assert st == 201
        st, out = admin_keys(p, "GET", key)
        assert st == 200 and out["key"] == key and len(out["records"]) == 1, out
        r = out["records"][0]
        assert r["state"] == "completed" and r["status"] == 201
        sk = r["store_key"]
        assert sk == "idem:%s:%s" % (r["scope"], key)
        assert stored_on(cs, m, sk) == [sk]
        st, out = admin_keys(p, "DELETE", key, "?scope=" + r["scope"])
        assert st == 200 and out["deleted"] == sk, out
        assert stored_on(cs, m, sk) == []
        assert admin_keys(p, "GET", key)[1]["records"] == []
        assert admin_keys(p, "DELETE", key, "?scope=" + r["scope"])[0] == 404
        assert_free(p, key)  # executes again

    # one key, many scopes: no hash tag, so each scope's store key has a slot of its own
    key = new_key()
    masters_hit, users = set(), 0
    while len(masters_hit) < 3:
        users += 1
        assert users <= 40, "40 scopes never reached all three masters: %r" % masters_hit
        st, _, _ = p.request("POST", "/echo", [("Idempotency-Key", key),
                                               ("Authorization", "Bearer u%d" % users)], b"s")
        assert st == 201
        masters_hit = {m for m in cs.masters() if stored_on(cs, m, "idem:*:" + key)}
    st, out = admin_keys(p, "GET", key)
    assert st == 200 and len(out["records"]) == users, (users, out)
    assert len({r["scope"] for r in out["records"]}) == users
    assert all(r["state"] == "completed" for r in out["records"])
    print("/keys listed %d scopes of one key, stored on all three masters" % users)


# --------------------------------------------------------------------------- TLS


@redis_only
def test_cluster_over_tls_executes_and_replays_on_every_master_redis(proxy, upstream, tmp_path):
    """Proves rediss:// seeds work on a TLS cluster (tls-cluster yes, port
    0: the TLS port is the only one, and the one CLUSTER SLOTS names): the
    proxy verifies each node against --redis-tls-ca-file and executes,
    stores and replays keys on every master."""
    pki = make_pki(str(tmp_path / "pki"))
    cs = ClusterSet(str(tmp_path / "tls-cluster"), pki=pki)
    try:
        cs.start()
        url = cs.seed_url(seeds=1)
        assert url.startswith("rediss://")
        p = proxy("--redis-tls-ca-file", pki.ca_crt, redis_url=url)
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 over TLS")
        for m in cs.masters():
            key = "{%s}-tls-%s" % (tag_on(cs, m, "s"), uuid.uuid4().hex)
            before = upstream.hits()
            st, h, body = execute(p, key, b"tls")
            assert st == 201 and hone(h, REPLAY) == "false", (st, h, body[:200])
            st, h, body2 = execute(p, key, b"tls")
            assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
            assert upstream.hits() == before + 1
            assert [client_key(k) for k in stored_on(cs, m, "idem:*:" + key)] == [key]
        print("TLS cluster up in %.2f s; keys of all three masters served over TLS"
              % cs.startup_seconds)
    finally:
        cs.stop()


# --------------------------------------------------------------------------- no Redis


@redis_only
def test_cluster_seed_with_nothing_listening_is_503_fast_redis(proxy, upstream):
    """Proves a cluster seed list that reaches no node is a store error, not
    a hang: /readyz 503, and a keyed request gets 503 store_unavailable
    (Retry-After 1) within --store-timeout (1 s) and some slack, without
    reaching the upstream."""
    dead = [free_port(), free_port()]
    p = proxy(redis_url="redis://127.0.0.1:%d,127.0.0.1:%d" % tuple(dead))
    assert readyz(p) == 503
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        assert_problem(execute(p, new_key()), 503, "store_unavailable")
        times.append(time.monotonic() - t0)
    assert upstream.hits() == 0
    assert max(times) < 2.5, times
    assert readyz(p) == 503
    assert metrics_value(p.metrics(), "idemproxy_redis_connected") == 0
    assert "Connection refused" in p.stderr()  # the reason, in the log
    print("503 store_unavailable after %s s" % ", ".join("%.3f" % t for t in times))


# ------------------------------------------------ a demoted master never gets a script


@redis_only
@pytest.mark.concurrency
def test_cluster_frozen_master_resumed_demoted_never_gets_a_script_redis(proxy, upstream,
                                                                         own_cluster):
    """The Cluster form of the deposed master (doc/stores.md, A master that does
    not know it was deposed): two proxies run keys
    of one master's slots, their links to it are cut and it is frozen
    (SIGSTOP); the cluster promotes its replica and the proxies follow it; the
    old master is thawed, and until its peers tell it that it lost its slots
    it would still take writes. No script may run there after it resumed (its
    MONITOR, kept open through the freeze, says what it ran and when), and no
    key runs twice. Demoted, it answers MOVED for those slots, and a proxy
    given it alone as its seed follows to the new master."""
    cs = own_cluster()
    victim = cs.master_of_slot(0)
    (replica,) = cs.replicas(master=victim)
    vtag = tag_on(cs, victim, "v")
    p1, p2 = proxy(redis_url=cs.seed_url(seeds=3)), proxy(redis_url=cs.seed_url(seeds=3))
    for p in (p1, p2):
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    mon = Monitor(cs.node(victim))
    # new keys of the victim's slots, one after another, through each proxy
    loads = [Load([p], tag=vtag) for p in (p1, p2)]

    try:
        for load in loads:
            load.start()
        time.sleep(0.5)
        # no script of theirs in flight to it when it stops (one sent while it
        # was the master would run once it resumes: the check could not tell)
        for load in loads:
            load.pause()
        cut_links(cs.node(victim), keep={mon.id})
        cs.freeze(victim)
        for load in loads:
            load.resume()
        cs.wait_failover(victim, timeout=FAILOVER_BOUND_S)
        t_failover = time.monotonic()
        wait_for(lambda: all(any(a.sent > t_failover and a.status == 201
                                 for a in load.answers[-20:]) for load in loads),
                 timeout=FAILOVER_BOUND_S, what="both proxies serving the promoted replica")
        t_thaw = time.time()
        cs.thaw(victim)
        time.sleep(2.0)
        for load in loads:
            load.pause()
        after = mon.commands(t_thaw)
    finally:
        for load in loads:
            load.stop()
        mon.close()
    scripts = [c for c in after if c[2] in SCRIPTS]
    print("after it resumed the old master ran %d commands of clients (%s), %d scripts" % (
        len(after), ", ".join(sorted({c[2] for c in after})), len(scripts)))
    assert not scripts, scripts[:5]
    execs = upstream.executions()  # the fake upstream's own record of every request
    assert execs and max(execs.values()) == 1, execs.most_common(3)
    # demoted: MOVED to the new master for its old slots, which a proxy follows
    n = cs.node(victim)
    wait_for(lambda: n.role() == "slave", timeout=15, what="the old master demoted")
    c = cs.node_client(victim)
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="MOVED"):
            c.execute_command("GET", "{%s}-x" % vtag)
    finally:
        c.close()
    p3 = proxy(redis_url=cs.seed_url(seeds=[victim]))
    key = "{%s}-after-%s" % (vtag, uuid.uuid4().hex)
    wait_for(lambda: readyz(p3) == 200, timeout=10, what="/readyz 200")
    assert execute(p3, key)[0] == 201
    assert [client_key(k) for k in stored_on(cs, replica, "idem:*:" + key)] == [key]
