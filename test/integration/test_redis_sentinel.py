"""Redis under Sentinel (doc/stores.md, Pointing idemproxy at Redis): the
proxy finds the master through the sentinels, confirms it, and follows a
failover without a restart. Real servers: a master, a replica and three
sentinels (fixtures/redis.py)."""
import collections
import threading
import time

import pytest
import redis

from fixtures.client import REPLAY, assert_problem, hone, metrics_value, new_key
from fixtures.load import Load
from fixtures.marks import redis_only
from fixtures.pki import make_pki
from fixtures.redis import SCRIPTS, Monitor, SentinelSet, cut_links
from fixtures.waiting import in_thread, wait_for

pytestmark = pytest.mark.concurrency  # also run under ThreadSanitizer (scripts/test)

# How long service may stop when the master dies: the sentinels need
# down-after-milliseconds (1 s) and an election (measured ~2.3 s in all for
# the set to promote the replica); the proxy then needs one question to a
# sentinel, or the +switch-master message.
FAILOVER_BOUND_S = 15.0


def readyz(p):
    return p.admin_request("GET", "/readyz")[0]


def execute(p, key, body=b"s"):
    return p.request("POST", "/echo", [("Idempotency-Key", key)], body, timeout=10)


@pytest.fixture
def sentinels(tmp_path):
    ss = SentinelSet(str(tmp_path / "sentinel")).start()
    yield ss
    ss.stop()


@redis_only
def test_sentinel_finds_the_master_and_serves_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 through the sentinels")
    key = new_key()
    st, h, body = execute(p, key)
    assert st == 201 and hone(h, REPLAY) == "false"
    st, h, body2 = execute(p, key)
    assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
    assert upstream.hits() == 1
    m = sentinels.master_client()
    assert any(k.decode().endswith(":" + key) for k in m.scan_iter(match="idem:*"))
    assert "master 'mymaster' is 127.0.0.1:%d" % sentinels.master_addr()[1] in p.stderr()


@redis_only
def test_sentinel_unknown_outcome_on_the_master_redis(proxy, upstream, sentinels):
    """Through the sentinels as on one Redis (doc/guarantees.md, Unknown
    outcomes): a reset after the upstream read the request makes the key
    unknown on the master; a duplicate gets 502 idempotency_outcome_unknown,
    never forwarded."""
    p = proxy(redis_url=sentinels.sentinel_url())
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 through the sentinels")
    key = new_key()
    req = ("POST", "/reset", [("Idempotency-Key", key)], b"pay")
    assert_problem(p.request(*req, timeout=10), 502, "upstream_unavailable")
    m = sentinels.master_client()
    skeys = [k for k in m.scan_iter(match="idem:*:" + key)]
    assert len(skeys) == 1 and m.hget(skeys[0], "state") == b"U", skeys
    assert_problem(p.request(*req, timeout=10), 502, "idempotency_outcome_unknown")
    assert upstream.hits("/reset") == 1


@redis_only
def test_sentinel_unknown_master_name_is_503_with_the_reason_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url(master="nosuchmaster"))
    assert_problem(execute(p, new_key()), 503, "store_unavailable")
    assert readyz(p) == 503
    assert upstream.hits() == 0
    wait_for(lambda: "none of the 3 knows the master 'nosuchmaster'" in p.stderr(), timeout=5,
             what="the reason in the log")


def failover_under_load(p, sentinels, upstream, how):
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
    done_key = new_key()
    st, _, body = execute(p, done_key, b"before")
    assert st == 201
    # replicated before the failover: Redis promises no more than that
    assert sentinels.master_client().wait(1, 2000) >= 1
    hits_before = upstream.hits("/echo")
    load = Load([p]).start()  # new keys, one after another
    time.sleep(0.5)
    old = how()
    t_fail = time.monotonic()  # the master is gone (killed or stopped) by now
    new = sentinels.wait_failover(old, timeout=FAILOVER_BOUND_S)
    assert new != old
    # service resumes without a restart of the proxy
    wait_for(lambda: any(a.sent > t_fail and a.status == 201 for a in load.answers[-20:]),
             timeout=FAILOVER_BOUND_S, what="a 201 after the failover")
    time.sleep(0.5)
    results = load.stop().answers
    # the first request sent after the master went that executed
    resumed = min(a.done for a in results if a.sent > t_fail and a.status == 201) - t_fail
    statuses = {a.status for a in results}
    assert statuses <= {201, 503}, statuses  # refused while there was no master, never worse
    assert resumed < FAILOVER_BOUND_S
    # the answer completed and replicated before the failover still replays
    st, h, body2 = execute(p, done_key, b"before")
    assert st == 201 and hone(h, REPLAY) == "true" and body2 == body
    assert p.alive()
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200 on the new master")
    assert metrics_value(p.metrics(), "idemproxy_redis_failovers_total") >= 1
    print("service resumed %.2f s after the master went (%s); %d requests, %d refused"
          % (resumed, how.__name__, len(results), sum(1 for a in results if a.status == 503)))
    return resumed, hits_before


@redis_only
def test_sentinel_master_killed_under_load_service_resumes_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    failover_under_load(p, sentinels, upstream, sentinels.kill_master)


@redis_only
def test_sentinel_master_frozen_under_load_service_resumes_redis(proxy, upstream, sentinels):
    p = proxy(redis_url=sentinels.sentinel_url())
    failover_under_load(p, sentinels, upstream, sentinels.freeze_master)
    # the old master comes back as a replica: the proxy stays on the new one
    sentinels.thaw()
    time.sleep(1.0)
    for _ in range(5):
        st, _, _ = execute(p, new_key())
        assert st == 201


@redis_only
def test_rediss_sentinel_with_passwords_everywhere_redis(proxy, upstream, tmp_path):
    """rediss-sentinel://: TLS to the sentinels and to the master, the
    master's ACL user in the URL, the sentinels' own password in the query
    (doc/stores.md, Pointing idemproxy at Redis), and a failover followed
    over TLS."""
    pki = make_pki(str(tmp_path / "pki"))
    ss = SentinelSet(str(tmp_path / "tls-sentinel"), pki=pki, username="app",
                     password="m4ster", sentinel_password="s3ntinel").start()
    try:
        url = ss.sentinel_url()
        assert url.startswith("rediss-sentinel://") and "sentinel_password=" in url
        p = proxy("--redis-tls-ca-file", pki.ca_crt, redis_url=url)
        failover_under_load(p, ss, upstream, ss.kill_master)
        with open(p.stderr_path, encoding="utf-8", errors="replace") as f:
            err = f.read()  # whole: p.stderr() keeps the end only
        assert "m4ster" not in err and "s3ntinel" not in err
        assert "sentinel_password=***" in err
    finally:
        ss.stop()


@redis_only
def test_sentinel_first_sentinel_dead_the_others_are_asked_redis(proxy, upstream, sentinels):
    """The sentinels are asked in turn: with the first of the URL dead before
    the proxy starts and the master killed later, the other two (still a
    quorum) elect the replica and the proxy follows them."""
    sentinels.sentinels[0].kill()
    p = proxy(redis_url=sentinels.sentinel_url())
    failover_under_load(p, sentinels, upstream, sentinels.kill_master)


@redis_only
def test_sentinel_role_forbidden_and_a_graceful_failover_redis(proxy, upstream, tmp_path):
    """An ACL user that may not run ROLE (-role): the proxy trusts what the
    sentinels said and relies on READONLY replies instead (doc/stores.md, A
    master that does not know it was deposed). A graceful failover (SENTINEL
    FAILOVER) leaves the old master running as a replica: writes sent there
    get READONLY, and the proxy moves to the new master, through the reply
    or +switch-master, whichever comes first."""
    ss = SentinelSet(str(tmp_path / "ro"), username="admin", password="adminpw",
                     acl_users=["user app on >apppw ~* &* +@all -role"]).start()
    try:
        url = ss.sentinel_url(credentials=False).replace("://", "://app:apppw@", 1)
        p = proxy(redis_url=url)

        def graceful():
            old = ss.master_addr()
            s0 = ss.sentinels[0]
            redis.Redis(host="127.0.0.1", port=s0.port, socket_timeout=5).execute_command(
                "SENTINEL", "FAILOVER", ss.name)
            return old

        graceful.__name__ = "SENTINEL FAILOVER"
        failover_under_load(p, ss, upstream, graceful)
        # what executes now is stored on the new master
        key = new_key()
        st, _, _ = execute(p, key)
        assert st == 201
        m = ss.master_client()
        assert m.execute_command("ROLE")[0] in (b"master", "master")
        assert any(k.decode().endswith(":" + key) for k in m.scan_iter(match="idem:*"))
        err = p.stderr()
        assert "+switch-master" in err or "READONLY" in err, err
    finally:
        ss.stop()


# ------------------------------------------------- a deposed master never gets a script
def cut_subscriptions(ss, stop):
    """Until <stop>: closes every pub/sub connection on every sentinel (the
    proxies' +switch-master subscriptions) every 20 ms, so that none hears
    the failover."""
    while not stop.is_set():
        for s in ss.sentinels:
            if s.running() and not s.frozen:
                try:
                    s.command("CLIENT", "KILL", "TYPE", "pubsub")
                except redis.exceptions.RedisError:
                    pass
        time.sleep(0.02)


def wait_promotable(ss, timeout=30.0):
    """Until every sentinel sees a replica with its link up (one they can
    promote), other than a frozen node."""
    def ok():
        for s in ss.sentinels:
            reps = s.command("SENTINEL", "REPLICAS", ss.name)
            good = [r for r in reps if _pairs(r).get("flags") == "slave"
                    and _pairs(r).get("master-link-status") == "ok"]
            if not good:
                return False
        return True
    wait_for(ok, timeout=timeout, interval=0.1, what="a replica the sentinels can promote")


def _pairs(flat):
    it = iter(x.decode() if isinstance(x, bytes) else x for x in flat)
    return dict(zip(it, it))


@redis_only
def test_sentinel_deposed_master_resumed_never_gets_a_script_redis(proxy, upstream, tmp_path):
    """The path that ran keys twice (doc/stores.md, A master that does not
    know it was deposed), twice over: two proxies under a load of keys sent
    to both at once; their links to the master are cut and the master frozen
    (SIGSTOP: a VM pause), while their +switch-master subscriptions are cut
    every 20 ms, so that they never hear the failover; the sentinels promote
    a replica; the old master is thawed at once, still believing it is the
    master. A set-up that waited on it all that time completes then, and
    ROLE says master; yet no script may run there after it resumed (its
    MONITOR, kept open through the freeze, says what it ran and when),
    service goes on on the new master through both proxies, and no key runs
    twice."""
    ss = SentinelSet(str(tmp_path / "deposed"), replicas=2).start()
    p1, p2 = proxy(redis_url=ss.sentinel_url()), proxy(redis_url=ss.sentinel_url())
    load = None
    try:
        for p in (p1, p2):
            wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
        # new keys, each sent to both proxies at once and then once more to either
        load = Load([p1, p2], workers=4, race=True).start()
        last_failover = None
        for cycle in range(2):
            old = ss.master()
            mon = Monitor(old)
            try:
                time.sleep(1.0)
                # No script of the proxies may be in flight to it when it stops:
                # one sent while it was still the master would run after it
                # resumes, and the check below could not tell them apart.
                load.pause()
                time.sleep(0.3)
                if last_failover is not None:
                    # the sentinels fail the same master name over again only
                    # 2 x failover-timeout (3 s) after the last one began
                    time.sleep(max(0.0, last_failover + 6.5 - time.monotonic()))
                stop_cut = threading.Event()
                cutter = in_thread(cut_subscriptions, ss, stop_cut)
                time.sleep(0.1)
                cut_links(old, keep={mon.id})
                old.freeze()
                load.resume()
                new = ss.wait_failover(old.addr, timeout=FAILOVER_BOUND_S)
                last_failover = time.monotonic()
                t_thaw = time.time()
                old.thaw()
                time.sleep(1.5)  # set-ups held by the frozen master complete meanwhile
                stop_cut.set()
                cutter(10)
                t_back = time.monotonic()
                wait_for(lambda: load.served_since(t_back, 0) and load.served_since(t_back, 1),
                         timeout=FAILOVER_BOUND_S, what="both proxies serving the new master")
                time.sleep(0.5)
                after = mon.commands(t_thaw)
            finally:
                mon.close()
            scripts = [c for c in after if c[2] in SCRIPTS]
            print("cycle %d: %s:%d deposed, %s:%d promoted; after it resumed the old master "
                  "ran %d commands of clients (%s), %d scripts" % (
                      cycle, old.addr[0], old.addr[1], new[0], new[1], len(after),
                      ", ".join(sorted({c[2] for c in after})), len(scripts)))
            assert not scripts, scripts[:5]
            wait_promotable(ss)
        load.stop()
        for p in (p1, p2):
            assert p.alive(), p.stderr()
    finally:
        if load:
            load.stop()
        ss.stop()
    keys = set(load.keys)
    execs = upstream.executions(keys)  # the fake upstream's own record of every request
    twice = [k for k, n in execs.items() if n > 1]
    statuses = collections.Counter(a.status for a in load.answers)
    print("%d keys, %d requests %s, %d executed twice" % (len(keys), len(load.answers),
                                                          dict(statuses), len(twice)))
    assert not twice, twice[:5]
    assert set(statuses) <= {201, 409, 503}, statuses


@redis_only
def test_sentinel_switch_master_unheard_is_found_by_asking_redis(proxy, upstream, tmp_path):
    """A +switch-master the proxy never hears (doc/stores.md, Pointing
    idemproxy at Redis: Sentinel): its subscriptions are cut every 20 ms on
    every sentinel while a graceful failover (SENTINEL FAILOVER) moves the
    master, and no request is sent, so no connection fails and no READONLY
    reply tells (the old master, now a replica, still answers the readiness
    PING). The proxy must find the new master by asking: every second while
    it has no subscription, and once when one comes back. Then a new key is
    stored on the new master."""
    ss = SentinelSet(str(tmp_path / "unheard")).start()
    try:
        p = proxy(redis_url=ss.sentinel_url())
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
        key = new_key()
        assert execute(p, key)[0] == 201
        assert metrics_value(p.metrics(), "idemproxy_redis_failovers_total") == 0
        stop = threading.Event()
        cutter = in_thread(cut_subscriptions, ss, stop)
        try:
            time.sleep(0.3)
            old = ss.master_addr()
            ss.sentinels[0].command("SENTINEL", "FAILOVER", ss.name, timeout=5)
            new = ss.wait_failover(old, timeout=FAILOVER_BOUND_S)
            t_new = time.monotonic()
            # no request meanwhile: only a question to the sentinels can tell
            wait_for(lambda: metrics_value(p.metrics(),
                                           "idemproxy_redis_failovers_total") >= 1,
                     timeout=3, interval=0.05, what="the proxy to find the new master")
            found = time.monotonic() - t_new
        finally:
            stop.set()
            cutter(10)
        assert "master 'mymaster' is 127.0.0.1:%d" % new[1] in p.stderr()
        key2 = new_key()
        st, h, _ = execute(p, key2)
        assert st == 201 and hone(h, REPLAY) == "false"
        m = ss.master_client()
        assert any(k.decode().endswith(":" + key2) for k in m.scan_iter(match="idem:*"))
        print("the new master found %.2f s after the sentinels named it, unheard" % found)
    finally:
        ss.stop()
