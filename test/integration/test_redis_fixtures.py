"""Tests of fixtures.redis and fixtures.pki themselves (redis-py only, no
idemproxy): the PKI, the TLS servers, ACL users, the Sentinel set and the
Redis Cluster (with its command-line entry) behave as the tests that use
them assume. Run:

    /usr/bin/python3 -m pytest -q -p no:cacheprovider test/integration/test_redis_fixtures.py
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import redis

from fixtures import redis as rf
from fixtures.pki import OPENSSL, Pki, make_pki

pytestmark = pytest.mark.skipif(
    not os.access(rf.REDIS_SERVER, os.X_OK) or shutil.which(OPENSSL) is None,
    reason="needs %s and the openssl CLI" % rf.REDIS_SERVER)

# Bounds asserted on the Sentinel set, generous against the measured times
# (start-up about 1.4 s, a kill-master failover about 2.3 s on an idle machine).
STARTUP_BOUND = 10.0
FAILOVER_BOUND = 15.0
HERE = os.path.dirname(os.path.abspath(__file__))  # where `python3 -m fixtures.redis` runs


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki, tmp_path_factory):
    srv = rf.TlsRedisServer(tmp_path_factory.mktemp("tls"), pki)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def mtls_server(pki, tmp_path_factory):
    srv = rf.TlsRedisServer(tmp_path_factory.mktemp("mtls"), pki, tls_auth_clients="yes")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


ACL = ["user app on >secret ~idem:* &idemproxy:* +@all", "user default off"]


@pytest.fixture(scope="module", params=["plain", "tls"])
def acl_server(request, pki, tmp_path_factory):
    srv = rf.RedisServer(tmp_path_factory.mktemp("acl"), acl=ACL,
                           pki=pki if request.param == "tls" else None)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory):
    """A plain set shared by the tests that do not fail it over."""
    ss = rf.SentinelSet(tmp_path_factory.mktemp("sentinel"))
    try:
        ss.start()
        yield ss
    finally:
        ss.stop()


@pytest.fixture
def fresh_sentinel_set(tmp_path):
    """factory(**SentinelSet kwargs): a started set of the test's own, stopped
    at teardown."""
    started = []

    def factory(**kw):
        ss = rf.SentinelSet(tmp_path / ("set%d" % len(started)), **kw)
        started.append(ss)
        return ss.start()

    yield factory
    for ss in started:
        ss.stop()


def wait_replicated(client, timeout=5.0):
    """Waits until every replica of the master that <client> talks to has
    acknowledged the master's writes up to now, whichever connection made
    them (WAIT counts only its own connection's writes: on a connection that
    wrote nothing it returns at once). Returns how many replicas there are."""
    target = client.info("replication")["master_repl_offset"]
    deadline = time.monotonic() + timeout
    while True:
        info = client.info("replication")
        offsets = [v["offset"] for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict)]
        if offsets and min(offsets) >= target:
            return len(offsets)
        assert time.monotonic() < deadline, "replicas behind after %.0f s: %r" % (timeout, info)
        time.sleep(0.02)


def assert_all_stopped(procs):
    for p in procs:
        assert p.proc is None, p.describe()


# --------------------------------------------------------------------------- PKI

def openssl_verify(pki, cafile, cert, *extra):
    r = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", cafile] + list(extra)
                       + [cert], capture_output=True, text=True, timeout=30, cwd=pki.dir)
    return r.returncode == 0, r.stdout + r.stderr


def test_pki_certificates(pki):
    for name in Pki.FILES:
        assert os.path.getsize(pki[name]) > 0, name
    ok, out = openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslserver",
                             "-verify_hostname", "localhost")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslserver",
                             "-verify_ip", "127.0.0.1")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.client_crt, "-purpose", "sslclient")
    assert ok, out
    # the server certificate is for servers only, the client one for clients only
    assert not openssl_verify(pki, pki.ca_crt, pki.server_crt, "-purpose", "sslclient")[0]
    assert not openssl_verify(pki, pki.ca_crt, pki.client_crt, "-purpose", "sslserver")[0]
    # wrong.crt: the good CA, another name only
    ok, out = openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-purpose", "sslserver",
                             "-verify_hostname", "wrong.example")
    assert ok, out
    ok, out = openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-verify_hostname", "localhost")
    assert not ok and "mismatch" in out, out
    assert not openssl_verify(pki, pki.ca_crt, pki.wrong_crt, "-verify_ip", "127.0.0.1")[0]
    # the other CA vouches for none of them
    assert not openssl_verify(pki, pki.other_ca_crt, pki.server_crt)[0]
    text = subprocess.run(["openssl", "x509", "-in", pki.ca_crt, "-noout", "-text"],
                          capture_output=True, text=True, timeout=30).stdout
    assert re.search(r"Basic Constraints: critical\s+CA:TRUE", text), text


# --------------------------------------------------------------------------- TLS

def test_tls_server_answers_with_the_right_ca(tls_server):
    assert tls_server.url == "rediss://127.0.0.1:%d" % tls_server.port
    c = tls_server.client(check_hostname=True)  # the name checked is 127.0.0.1 (IP SAN)
    assert c.set("idem:tls", "v") is True
    assert c.get("idem:tls") == b"v"
    assert c.config_get("port") == {"port": "0"}  # no plain TCP port at all
    assert c.config_get("tls-port") == {"tls-port": str(tls_server.port)}
    c.close()


def test_tls_server_is_not_plain_redis(tls_server):
    c = redis.Redis(host="127.0.0.1", port=tls_server.port, socket_timeout=2,
                    socket_connect_timeout=2)
    with pytest.raises(redis.exceptions.ConnectionError):
        c.ping()


def test_tls_other_ca_fails_verification(tls_server, pki):
    c = tls_server.client(ca=pki.other_ca_crt)
    with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        c.ping()


def test_tls_wrong_name_fails_hostname_check_only(pki, tmp_path):
    with rf.TlsRedisServer(tmp_path, pki, cert=pki.wrong_crt, key=pki.wrong_key).start() as srv:
        assert srv.client().ping()  # the chain is good
        with pytest.raises(redis.exceptions.ConnectionError, match="mismatch"):
            srv.client(check_hostname=True).ping()
    assert srv.proc is None


def test_mutual_tls_needs_a_client_certificate(mtls_server, pki):
    c = mtls_server.client()  # sends the PKI's client certificate
    assert c.ping()
    assert c.config_get("tls-auth-clients") == {"tls-auth-clients": "yes"}
    with pytest.raises(redis.exceptions.ConnectionError):
        mtls_server.client(client_cert=False).ping()
    # a certificate that is not for clients (EKU serverAuth) is refused too
    with pytest.raises(redis.exceptions.ConnectionError):
        mtls_server.client(client_cert=(pki.server_crt, pki.server_key)).ping()


# --------------------------------------------------------------------------- ACL

def test_acl_user_permissions(acl_server):
    app = acl_server.client(username="app", password="secret")
    assert app.set("idem:x", "1") is True
    assert app.get("idem:x") == b"1"
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.set("other:x", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.publish("other:done", "x")
    # PUBLISH on idemproxy:* is allowed, and delivered
    sub = acl_server.client(username="app", password="secret").pubsub()
    sub.subscribe("idemproxy:done")
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    assert app.publish("idemproxy:done", "k1") == 1
    msg = sub.get_message(timeout=2)
    assert msg is not None and msg["data"] == b"k1", msg
    sub.close()
    app.close()


def test_acl_wrong_password_and_default_user_refused(acl_server):
    with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|Invalid"):
        acl_server.client(username="app", password="wrong").ping()
    with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|Invalid"):
        acl_server.client(username="nobody", password="secret").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):  # NOAUTH: default is off
        acl_server.client().ping()
    scheme = "rediss" if acl_server.tls else "redis"
    assert acl_server.url_for("app", "se cret") == "%s://app:se%%20cret@127.0.0.1:%d" % (
        scheme, acl_server.port)


def test_requirepass_server(tmp_path):
    with rf.RedisServer(tmp_path, password="p w").start() as srv:
        assert srv.client().ping()  # the fixture's own client uses the password
        with pytest.raises(redis.exceptions.AuthenticationError):
            srv.client(password="").ping()
        with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|invalid"):
            srv.client(password="nope").ping()


# --------------------------------------------------------------------------- Sentinel

def test_sentinel_set_reports_its_master(sentinel_set):
    ss = sentinel_set
    assert ss.startup_seconds < STARTUP_BOUND, ss.startup_seconds
    assert ss.master_addr() == ss.initial_master.addr
    assert set(ss.sentinel_reports().values()) == {ss.initial_master.addr}
    assert ss.master().role() == "master"
    assert [r.role() for r in ss.replicas()] == ["slave"]
    ports = [s.port for s in ss.sentinels]
    assert len(set(ports + [n.port for n in ss.data_nodes])) == 5
    assert ss.sentinel_url() == (
        "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?master=mymaster" % tuple(ports))
    assert ss.sentinel_url(master="other", tls=True).startswith("rediss-sentinel://")
    assert ss.sentinel_url(master="other").endswith("?master=other")
    for s in ss.sentinels:  # sentinels answer as sentinels, each seeing the other two
        sens = s.command("SENTINEL", "SENTINELS", "mymaster")
        assert len(sens) == 2


def test_sentinel_set_replicates(sentinel_set):
    m = sentinel_set.master_client()
    assert m.set("idem:repl", "v1") is True
    assert m.wait(1, 5000) == 1
    (replica,) = sentinel_set.replicas()
    r = replica.client()
    assert r.get("idem:repl") == b"v1"
    with pytest.raises(redis.exceptions.ReadOnlyError):
        r.set("idem:repl", "v2")


def test_sentinel_kill_master_fails_over(fresh_sentinel_set):
    ss = fresh_sentinel_set()
    m = ss.master_client()
    m.set("idem:survives", "yes")
    assert m.wait(1, 5000) == 1
    m.close()
    (replica,) = ss.replicas()
    old_proc = ss.master().proc
    t0 = time.monotonic()
    old = ss.kill_master()
    assert old_proc.poll() is not None  # really gone
    new = ss.wait_failover(old, timeout=FAILOVER_BOUND + 5)
    took = time.monotonic() - t0
    print("sentinel start-up %.2f s, kill-master failover %.2f s" % (ss.startup_seconds, took))
    assert took < FAILOVER_BOUND, took
    assert new == replica.addr != old
    assert set(ss.sentinel_reports().values()) == {new}
    c = ss.master_client()
    assert c.execute_command("ROLE")[0] == b"master"
    assert c.get("idem:survives") == b"yes"
    assert c.set("idem:after", "1") is True  # writable
    procs = ss.data_nodes + ss.sentinels
    ss.stop()
    assert_all_stopped(procs)


def test_sentinel_tls_acl_passwords_freeze_fails_over(fresh_sentinel_set, pki):
    ss = fresh_sentinel_set(pki=pki, tls_auth_clients="yes", username="adm", password="p@ss w",
                            acl_users=["user app on >secret ~idem:* &idemproxy:* +@all"],
                            sentinel_password="sen pw")
    assert ss.startup_seconds < STARTUP_BOUND, ss.startup_seconds
    assert ss.sentinel_url() == (
        "rediss-sentinel://adm:p%%40ss%%20w@127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d"
        "?master=mymaster&sentinel_password=sen%%20pw" % tuple(s.port for s in ss.sentinels))
    # the sentinels and the data nodes want their passwords
    with pytest.raises(redis.exceptions.AuthenticationError):
        ss.sentinels[0].client(password="").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        ss.master().client(password="").ping()
    app = ss.master().client(username="app", password="secret")
    assert app.set("idem:tls", "1") is True
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.set("other:x", "1")
    assert wait_replicated(ss.master_client()) == 1
    app.close()

    t0 = time.monotonic()
    old = ss.freeze_master()
    assert ss.node(old).frozen
    new = ss.wait_failover(old, timeout=FAILOVER_BOUND + 5)
    took = time.monotonic() - t0
    print("TLS/ACL set: start-up %.2f s, freeze-master failover %.2f s"
          % (ss.startup_seconds, took))
    assert took < FAILOVER_BOUND, took
    assert new != old
    assert ss.node(new).client(username="app", password="secret").get("idem:tls") == b"1"
    ss.thaw()
    assert not ss.node(old).frozen
    assert ss.node(old).client().ping()  # answers again once thawed


# --------------------------------------------------------------------------- Cluster

# Bounds asserted on the cluster, generous against the measured times (start-up
# about 2.1 s, 2.5 s over TLS; a kill-master or freeze-master failover about
# 4 s with cluster-node-timeout 2000, on an idle machine).
CLUSTER_STARTUP_BOUND = 10.0
CLUSTER_FAILOVER_BOUND = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A plain cluster (3 masters, 1 replica each) shared by the tests that
    leave it as they found it (a moved slot is moved back)."""
    cs = rf.ClusterSet(tmp_path_factory.mktemp("cluster"))
    try:
        cs.start()
        yield cs
    finally:
        cs.stop()


@pytest.fixture
def fresh_cluster(tmp_path):
    """factory(**ClusterSet kwargs): a started cluster of the test's own,
    stopped at teardown."""
    started = []

    def factory(**kw):
        cs = rf.ClusterSet(tmp_path / ("cluster%d" % len(started)), **kw)
        started.append(cs)
        return cs.start()

    yield factory
    for cs in started:
        cs.stop()


def assert_cluster_shape(cs, masters=3, replicas=1):
    """masters() and replicas() as expected, every replica of a master a
    replica by ROLE and with its link up, the slot map whole."""
    ms = cs.masters()
    assert len(ms) == masters, ms
    for m in ms:
        assert cs.node(m).role() == "master"
        reps = cs.replicas(master=m)
        assert len(reps) == replicas, (m, reps)
        for r in reps:
            info = cs.node_client(r).info("replication")
            assert info["role"] == "slave" and info["master_link_status"] == "up", info
            assert (info["master_host"], info["master_port"]) == m
    ranges = [(a, b) for a, b, _, _ in cs.slot_map()]
    assert ranges[0][0] == 0 and ranges[-1][1] == rf.CLUSTER_SLOTS - 1, ranges
    assert all(ranges[i][1] + 1 == ranges[i + 1][0] for i in range(len(ranges) - 1)), ranges
    assert cs.problem() is None


def test_cluster_is_up(cluster):
    cs = cluster
    assert cs.startup_seconds < CLUSTER_STARTUP_BOUND, cs.startup_seconds
    assert_cluster_shape(cs)
    assert len(cs.replicas()) == 3
    assert cs.masters() == [n.addr for n in cs.nodes[:3]]  # redis-cli's choice, on one host
    # six distinct client ports and six distinct bus ports, none shared
    ports = [n.port for n in cs.nodes] + [n.bus_port for n in cs.nodes]
    assert len(set(ports)) == 12, ports
    assert set(cs.masters() + cs.replicas()) == {n.addr for n in cs.nodes}
    for n in cs.nodes:
        info = n.cluster_info()
        assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "6", info
        c = n.client()
        conf = {k: v for d in [c.config_get(p) for p in (
            "cluster-enabled", "cluster-node-timeout", "cluster-port", "cluster-config-file",
            "save", "appendonly", "repl-diskless-sync-delay", "bind")] for k, v in d.items()}
        c.close()
        assert conf == {"cluster-enabled": "yes", "cluster-node-timeout": "2000",
                        "cluster-port": str(n.bus_port),
                        "cluster-config-file": n.nodes_conf_path, "save": "",
                        "appendonly": "no", "repl-diskless-sync-delay": "0",
                        "bind": "127.0.0.1"}, conf
        assert os.path.getsize(n.nodes_conf_path) > 0
    # each master's first slot says where the map starts: an equal share each
    assert [a for a, _, _, _ in cs.slot_map()] == [0, 5461, 10923]
    assert cs.master_of_slot(0) == cs.masters()[0]
    assert cs.master_of_slot(16383) == cs.masters()[2]
    assert cs.slots_of(cs.masters()[1]) == [(5461, 10922)]
    # the slot of a key as the server computes it (hash tags honoured)
    assert cs.slot_of("123456789") == 0x31C3 % rf.CLUSTER_SLOTS == 12739
    assert cs.slot_of("{user1000}.following") == cs.slot_of("user1000")
    # seed URLs
    m = cs.masters()
    assert cs.seed_url() == "redis://127.0.0.1:%d" % m[0][1]
    assert cs.seed_url(seeds=3) == "redis://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d" % tuple(
        p for _, p in m)
    assert cs.seed_url(seeds=4).endswith(",127.0.0.1:%d" % cs.replicas()[0][1])
    assert cs.seed_url(tls=True, seeds=[m[1]]) == "rediss://127.0.0.1:%d" % m[1][1]
    with pytest.raises(ValueError):
        cs.seed_url(seeds=7)


def test_cluster_keys_spread_over_every_master(cluster):
    cs = cluster
    c = cs.client()
    keys = ["idem:spread:%d" % i for i in range(200)]
    for k in keys:
        assert c.set(k, k) is True
    slot_map = cs.slot_map()
    per_master = {m: [] for m in cs.masters()}
    for k in keys:
        slot = cs.slot_of(k)
        assert slot == c.keyslot(k)  # the server and redis-py agree (CRC16, no tag)
        owner = cs.master_of_slot(slot)
        assert owner == [m for a, b, m, _ in slot_map if a <= slot <= b][0]
        per_master[owner].append(k)
    counts = {"%s:%d" % m: len(ks) for m, ks in per_master.items()}
    print("200 keys over the masters: %s" % counts)
    assert all(n > 0 for n in counts.values()), counts
    for m, ks in per_master.items():
        mc = cs.node_client(m)
        # the owner holds each of its keys, and answers for them directly
        assert sum(mc.exists(k) for k in ks) == len(ks)
        assert mc.get(ks[0]) == ks[0].encode()
        # ... and MOVED for a key of another master
        other = next(k for k in keys if k not in ks)
        with pytest.raises(redis.exceptions.ResponseError, match=r"^MOVED %d 127\.0\.0\.1:%d$"
                           % (cs.slot_of(other), cs.master_of_slot(cs.slot_of(other))[1])):
            mc.get(other)
        # its replica has the same keys once WAIT says so
        assert wait_replicated(mc) == 1
        (r,) = cs.replicas(master=m)
        assert cs.node_client(r).dbsize() == mc.dbsize()
        mc.close()
    c.close()


def test_cluster_move_slot_moved_and_ask(cluster):
    """Moves a slot away (MOVED afterwards, ASK while it moves) and back."""
    cs = cluster
    keys = ["{idem:mv}:%d" % i for i in range(6)]
    slot = cs.slot_of(keys[0])
    assert {cs.slot_of(k) for k in keys} == {slot}
    c = cs.client()
    for k in keys:
        c.set(k, "v-" + k)
    src = cs.master_of_slot(slot)
    dst = next(m for m in cs.masters() if m != src)
    sc, dc = cs.node_client(src), cs.node_client(dst)

    assert cs.begin_migration(slot, dst) == src
    moved = cs.migrate_keys(slot, count=2)
    assert len(moved) == 2 and set(moved) <= set(keys)
    staying = [k for k in keys if k not in moved]
    # the source answers ASK for a key it no longer holds, and still serves the others
    with pytest.raises(redis.exceptions.ResponseError,
                       match=r"^ASK %d 127\.0\.0\.1:%d$" % (slot, dst[1])):
        sc.get(moved[0])
    assert sc.get(staying[0]) == ("v-" + staying[0]).encode()
    # the destination: MOVED back to the source without ASKING, the value with it
    with pytest.raises(redis.exceptions.ResponseError,
                       match=r"^MOVED %d 127\.0\.0\.1:%d$" % (slot, src[1])):
        dc.get(moved[0])
    p = dc.pipeline(transaction=False)  # one connection: ASKING applies to the next command
    p.execute_command("ASKING")
    p.get(moved[0])
    assert p.execute() == [True, ("v-" + moved[0]).encode()]
    assert c.get(moved[0]) == ("v-" + moved[0]).encode()  # redis-py follows ASK
    assert c.get(staying[0]) == ("v-" + staying[0]).encode()

    rest = cs.migrate_keys(slot)
    assert sorted(moved + rest) == sorted(keys)
    assert cs.migrate_keys(slot) == []
    cs.finish_migration(slot, dst)
    for n in cs.nodes:  # every node agrees (finish_migration waited for it)
        assert cs.master_of_slot(slot, via=n) == dst
    with pytest.raises(redis.exceptions.ResponseError,
                       match=r"^MOVED %d 127\.0\.0\.1:%d$" % (slot, dst[1])):
        sc.get(keys[0])
    assert dc.get(keys[0]) == ("v-" + keys[0]).encode()
    assert [c.get(k) for k in keys] == [("v-" + k).encode() for k in keys]  # follows MOVED

    # and back, in one call: the cluster is left as it was
    assert cs.move_slot(slot, src) == dst
    assert cs.master_of_slot(slot) == src
    assert sc.exists(*keys) == len(keys)
    assert cs.problem() is None
    for x in (c, sc, dc):
        x.close()


def test_cluster_kill_master_fails_over_and_revives(fresh_cluster):
    cs = fresh_cluster()
    victim = cs.master_of_slot(0)
    (replica,) = cs.replicas(master=victim)
    c = cs.client()
    keys = ["idem:fo:%d" % i for i in range(100)]
    for k in keys:
        c.set(k, k)
    for m in cs.masters():
        assert wait_replicated(cs.node_client(m)) == 1
    c.close()
    old_proc = cs.node(victim).proc

    old = cs.kill_master()
    assert old == victim
    assert old_proc.poll() is not None  # really gone
    took = cs.wait_failover(old, timeout=CLUSTER_FAILOVER_BOUND + 5)
    print("cluster start-up %.2f s, kill-master failover %.2f s" % (cs.startup_seconds, took))
    assert took < CLUSTER_FAILOVER_BOUND, took
    new = cs.promoted[old]
    assert new == replica
    assert cs.master_of_slot(0) == new
    assert cs.node(new).role() == "master"
    assert old not in cs.masters() and len(cs.masters()) == 3
    c = cs.client()  # a new client: the new slot map
    assert [c.get(k) for k in keys] == [k.encode() for k in keys]
    assert c.set("idem:fo:after", "1") is True
    c.close()

    t0 = time.monotonic()
    n = cs.revive(old)
    print("revived as a replica in %.2f s" % (time.monotonic() - t0))
    assert n.role() == "slave"
    assert cs.replicas(master=new) == [old]
    assert_cluster_shape(cs)
    nc = cs.node_client(new)
    assert wait_replicated(nc) == 1
    assert n.client().dbsize() == nc.dbsize()
    nc.close()

    procs = list(cs.nodes)
    cs.stop()
    assert_all_stopped(procs)


def test_cluster_tls_freeze_fails_over(fresh_cluster, pki):
    cs = fresh_cluster(pki=pki, tls_auth_clients="yes")
    assert cs.startup_seconds < CLUSTER_STARTUP_BOUND, cs.startup_seconds
    assert_cluster_shape(cs)
    m = cs.masters()
    assert cs.seed_url(seeds=2) == "rediss://127.0.0.1:%d,127.0.0.1:%d" % (m[0][1], m[1][1])
    assert cs.seed_url(tls=False).startswith("redis://")
    tls_ports = {n.port for n in cs.nodes}
    for n in cs.nodes:
        c = n.client()
        assert c.config_get("port") == {"port": "0"}  # TLS only
        assert c.config_get("tls-port") == {"tls-port": str(n.port)}
        assert c.config_get("tls-cluster") == {"tls-cluster": "yes"}
        assert c.config_get("tls-replication") == {"tls-replication": "yes"}
        # CLUSTER SLOTS, asked over TLS, names the nodes' tls-ports
        for r in c.execute_command("CLUSTER", "SLOTS"):
            assert {x[1] for x in r[2:]} <= tls_ports, r
        c.close()
    # nothing over plain TCP, nothing without a client certificate
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(host="127.0.0.1", port=m[0][1], socket_timeout=2,
                    socket_connect_timeout=2).ping()
    with pytest.raises(redis.exceptions.ConnectionError):
        cs.node_client(m[0], client_cert=False).ping()
    c = cs.client()  # RedisCluster over TLS
    keys = ["idem:tls:%d" % i for i in range(60)]
    for k in keys:
        c.set(k, k)
    assert [c.get(k) for k in keys] == [k.encode() for k in keys]
    c.close()
    # a MOVED names the tls-port too
    k = next(k for k in keys if cs.master_of_slot(cs.slot_of(k)) != m[0])
    with pytest.raises(redis.exceptions.ResponseError,
                       match=r"^MOVED %d 127\.0\.0\.1:%d$" % (
                           cs.slot_of(k), cs.master_of_slot(cs.slot_of(k))[1])):
        cs.node_client(m[0]).get(k)

    for a in m:
        assert wait_replicated(cs.node_client(a)) == 1
    frozen = cs.freeze_master()
    assert cs.node(frozen).frozen
    took = cs.wait_failover(frozen, timeout=CLUSTER_FAILOVER_BOUND + 5)
    print("TLS cluster: start-up %.2f s, freeze-master failover %.2f s"
          % (cs.startup_seconds, took))
    assert took < CLUSTER_FAILOVER_BOUND, took
    new = cs.promoted[frozen]
    assert new != frozen and cs.master_of_slot(0) == new
    cs.thaw()
    assert not cs.node(frozen).frozen
    cs.wait_ok()  # the thawed master learns it was replaced: a replica of the new one
    assert cs.node(frozen).role() == "slave"
    assert cs.replicas(master=new) == [frozen]
    c = cs.client()
    assert [c.get(k) for k in keys] == [k.encode() for k in keys]
    c.close()


@pytest.mark.parametrize("mode", ["requirepass", "acl"])
def test_cluster_auth(fresh_cluster, mode):
    if mode == "acl":
        cs = fresh_cluster(username="adm", password="p@ss w",
                           acl_users=["user app on >secret ~idem:* &idemproxy:* +@all"])
    else:
        cs = fresh_cluster(password="p@ss w")
    assert_cluster_shape(cs)  # the replicas got in: masterauth (and masteruser)
    m = cs.masters()
    user = "adm" if mode == "acl" else ""
    assert cs.seed_url(seeds=2) == "redis://%s:p%%40ss%%20w@127.0.0.1:%d,127.0.0.1:%d" % (
        user, m[0][1], m[1][1])
    assert cs.seed_url(credentials=False) == "redis://127.0.0.1:%d" % m[0][1]
    for a in m:
        with pytest.raises(redis.exceptions.AuthenticationError):
            cs.node_client(a, password="").ping()
        with pytest.raises(redis.exceptions.RedisError, match="WRONGPASS|invalid"):
            cs.node_client(a, username=user or None, password="nope").ping()
    with pytest.raises((redis.exceptions.RedisError, redis.exceptions.RedisClusterException)):
        cs.client(password="")
    c = cs.client()
    keys = ["{idem:auth}:%d" % i for i in range(5)] + ["idem:auth:%d" % i for i in range(30)]
    for k in keys:
        c.set(k, k)
    if mode == "acl":
        app = cs.client(username="app", password="secret")
        assert app.set("idem:app", "1") is True and app.get("idem:app") == b"1"
        with pytest.raises(redis.exceptions.NoPermissionError):
            app.set("other:x", "1")
        app.close()
    # MIGRATE carries the password (AUTH, or AUTH2 with the user)
    slot = cs.slot_of(keys[0])
    src = cs.master_of_slot(slot)
    dst = next(a for a in m if a != src)
    assert cs.move_slot(slot, dst) == src
    assert cs.node_client(dst).exists(*keys[:5]) == 5
    assert [c.get(k) for k in keys] == [k.encode() for k in keys]
    c.close()


def _read_line(proc, timeout):
    """The first line <proc> writes on stdout, within <timeout> (None at EOF)."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return None
        return proc.stdout.readline().decode()
    finally:
        sel.close()


def test_cluster_command_line(tmp_path):
    workdir = tmp_path / "cli"
    err_path = tmp_path / "cli.err"
    t0 = time.monotonic()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fixtures.redis", "cluster", "--dir",
                                 str(workdir)], cwd=HERE, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)
    pids = []
    try:
        line = _read_line(proc, 30)
        took = time.monotonic() - t0
        assert line, "no URL line within 30 s:\n%s" % err_path.read_text()
        m = re.fullmatch(r"redis://127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+)\n",
                         line)
        assert m, line
        print("command-line cluster up (URL printed) in %.2f s" % took)
        seeds = [int(p) for p in m.groups()]
        c = redis.Redis(host="127.0.0.1", port=seeds[0], socket_timeout=2)
        nodes = [x.split()[1].split("@")[0] for x in
                 c.execute_command("CLUSTER", "NODES").decode().splitlines()]
        c.close()
        assert len(nodes) == 6
        ports = sorted(int(x.rpartition(":")[2]) for x in nodes)
        assert set(seeds) <= set(ports)
        for port in ports:
            n = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
            assert n.ping()
            info = n.info()
            n.close()
            if port in seeds:
                assert info["role"] == "master"
            pids.append(info["process_id"])
            with open("/proc/%d/stat" % info["process_id"]) as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            assert ppid == proc.pid  # started by the command-line entry itself
        rc = redis.cluster.RedisCluster(host="127.0.0.1", port=seeds[1], socket_timeout=2)
        assert rc.set("idem:cli", "1") is True and rc.get("idem:cli") == b"1"
        rc.close()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, err_path.read_text()
        assert proc.stdout.read() == b""  # the URL line was all
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        for port in ports:
            with pytest.raises(redis.exceptions.ConnectionError):
                redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1).ping()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:  # only if the entry left any: the servers it started, in workdir
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    ours = str(workdir).encode() in f.read()
            except OSError:
                continue
            if ours:
                os.kill(pid, signal.SIGKILL)
        proc.stdout.close()


def test_cluster_command_line_start_failure(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fixtures.redis", "cluster", "--dir",
                        str(tmp_path / "x"), "--masters", "2"], cwd=HERE, capture_output=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert r.stdout == b""
    assert b"at least 3 masters" in r.stderr, r.stderr
