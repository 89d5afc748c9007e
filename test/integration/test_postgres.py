"""The PostgreSQL store's own behaviour (doc/stores.md, PostgreSQL), on servers
of these tests' own (fixtures/postgres.py): the table created at start and what
a role that may not create it is told, a role without rights, a wrong password
(never logged), TLS with sslmode=verify-full and a throwaway CA, a server down
at start, the server killed (SIGKILL) and started again under load with nothing
completed lost, a failover to a promoted streaming replica without a restart of
the proxy, and the background job that deletes expired rows.

The semantics every store shares run on PostgreSQL in the suite's PostgreSQL
pass (IDEMPROXY_TEST_STORE=postgresql: conftest.py)."""
import os
import socket
import time

import pytest

from fixtures.client import REPLAY, hone, metrics_value, new_key
from fixtures.load import Load
from fixtures.marks import store_independent
from fixtures.pki import make_pki
from fixtures.postgres import PgServer
from fixtures.probes import executes_then_replays, readyz, refused_503
from fixtures.proxy import REPO, run_binary
from fixtures.waiting import in_thread, wait_for

SCHEMA = os.path.join(REPO, "contrib", "postgresql", "schema.sql")
RIGHTS = "GRANT SELECT, INSERT, UPDATE, DELETE ON idemproxy_keys TO app"


@pytest.fixture
def pg():
    with PgServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))








def run_schema(pg):
    with open(SCHEMA) as f:
        pg.sql(f.read())


@store_independent
def test_postgres_creates_its_table_logs_it_and_keeps_keys_across_restarts(proxy, upstream, pg):
    p = proxy("--store", pg.url)
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200")
    assert "created the table idemproxy_keys (contrib/postgresql/schema.sql)" in p.stderr()
    key = executes_then_replays(p, upstream)
    rows = pg.sql("SELECT key, state, length(fp), token ~ '^[0-9a-f]{32}$' FROM idemproxy_keys")
    assert len(rows) == 1 and rows[0][0].endswith(":" + key) and rows[0][1:] == ("C", 32, True)
    # The proxy restarts: the table is there, the key still replays.
    p.restart()
    assert p.stderr().count("created the table") == 1
    before = upstream.hits()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", key)], b"x")
    assert st == 201 and hone(h, REPLAY) == "true" and upstream.hits() == before


@store_independent
def test_postgres_role_that_may_not_create_the_table_is_told_the_schema_file(proxy, upstream, pg):
    url = pg.add_role("app", "s3cret").replace("app@", "app:s3cret@")
    r = run_binary(["--upstream", upstream.url, "--store", url], timeout=20)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = [ln for ln in err.splitlines() if " error " in ln]
    assert len(lines) == 1, err
    assert "may not create it" in lines[0] and "contrib/postgresql/schema.sql" in lines[0]
    assert "s3cret" not in err
    # A team that manages its DDL: the file, run once by a role that may, and the rights.
    run_schema(pg)
    pg.sql(RIGHTS)
    p = proxy("--store", url)
    executes_then_replays(p, upstream)
    assert "created the table" not in p.stderr()


OLD_TABLE = """CREATE TABLE idemproxy_keys (
    key text COLLATE "C" PRIMARY KEY, id bigint GENERATED ALWAYS AS IDENTITY,
    state "char" NOT NULL CHECK (state IN ('L', 'C', 'U')), fp bytea NOT NULL,
    token text NOT NULL, changed_at timestamptz NOT NULL, lease_until timestamptz,
    keep_ms bigint NOT NULL, expires_at timestamptz NOT NULL, cause text, about text,
    head bytea, body bytea)"""


@store_independent
def test_postgres_table_of_an_older_version_gets_the_resource_column(proxy, upstream, pg):
    """A table made before resource links (doc/configuration.md, Resource
    links): the proxy adds the column when it may; a role that may not is
    told what to run."""
    pg.sql(OLD_TABLE)
    url = pg.add_role("app", "s3cret", RIGHTS).replace("app@", "app:s3cret@")
    r = run_binary(["--upstream", upstream.url, "--store", url], timeout=20)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "lacks a column of this version (resource, answer_until, probes..., trace) and this role may not add it" in err
    assert "brought up to date with contrib/postgresql/schema.sql" in err
    p = proxy("--store", pg.url)  # the owner
    assert "added the columns of this version (resource, answer_until, probes..., trace) to the table idemproxy_keys" in p.stderr()
    executes_then_replays(p, upstream)
    assert pg.sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'idemproxy_keys_resource'") \
        == [(1,)]
    run_schema(pg)  # the file runs again, harmlessly


@store_independent
def test_postgres_role_without_rights_is_not_ready_and_says_what_to_grant(proxy, upstream, pg):
    run_schema(pg)
    url = pg.add_role("app", "s3cret").replace("app@", "app:s3cret@")
    p = proxy("--store", url)
    refused_503(p, upstream, "permission denied for table idemproxy_keys",
                "GRANT SELECT, INSERT, UPDATE, DELETE ON idemproxy_keys")
    pg.sql(RIGHTS)  # granted while it runs: no restart
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200 once granted")
    executes_then_replays(p, upstream)


@store_independent
def test_postgres_wrong_password_is_refused_and_never_logged(proxy, upstream, pg, tmp_path):
    run_schema(pg)
    base = pg.add_role("app", "s3cret", RIGHTS)
    p = proxy("--store", base.replace("app@", "app:Wr0ngPass@"))
    refused_503(p, upstream, "password authentication failed")
    assert "Wr0ngPass" not in p.stderr() and "app:***@" in p.stderr()
    # The password file beats the URL's (and libpq's password parameter is masked too).
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    p2 = proxy("--store", base + "?password=Wr0ngInUrl", "--store-password-file", str(pw))
    executes_then_replays(p2, upstream)
    assert "Wr0ngInUrl" not in p2.stderr() and "password=***" in p2.stderr()
    assert "s3cret" not in p.stderr() + p2.stderr()


@store_independent
def test_postgres_tls_verify_full_with_a_throwaway_ca(proxy, upstream, pki):
    with PgServer(tls=(pki.server_crt, pki.server_key)) as pg, \
            PgServer(tls=(pki.wrong_crt, pki.wrong_key)) as wrong:
        url = "postgresql://postgres@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s"
        p = proxy("--store", url % (pg.port, pki.ca_crt))
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 over TLS")
        executes_then_replays(p, upstream)
        tls = pg.sql("SELECT bool_and(s.ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a "
                     "USING (pid) WHERE a.application_name = 'idemproxy'")
        assert tls[0][0] is True and tls[0][1] >= 2, tls  # a loop's and the service connection
        # Another CA, and a certificate for another name: refused, with the reason.
        p2 = proxy("--store", url % (pg.port, pki.other_ca_crt))
        refused_503(p2, upstream, "certificate verify failed")
        p3 = proxy("--store", url % (wrong.port, pki.ca_crt))
        refused_503(p3, upstream, "does not match host name")


@store_independent
def test_postgres_host_names_are_looked_up_off_the_loops(proxy, upstream, pg):
    """A name is looked up on the pool, and the connect is given its address;
    a name that does not resolve is said so, and left out of a multi-host
    URL's connects while another host serves."""
    p = proxy("--store", "postgresql://postgres@nosuch.invalid:%d,localhost:%d/postgres"
              % (pg.port, pg.port))
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 through localhost")
    executes_then_replays(p, upstream)
    p2 = proxy("--store", "postgresql://postgres@nosuch.invalid:%d/postgres" % pg.port)
    refused_503(p2, upstream, "the host name nosuch.invalid does not resolve")


@store_independent
def test_postgres_down_at_start_then_up_serves_without_a_restart(proxy, upstream):
    pg = PgServer()  # its port and folder, no server yet
    try:
        p = proxy("--store", pg.url, "--store-timeout", "0.5")
        assert "not answering yet" in p.stderr()
        t0 = time.monotonic()
        refused_503(p, upstream)
        assert time.monotonic() - t0 < 5
        pg.init().start()
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 once it is up")
        executes_then_replays(p, upstream)
        assert "created the table" in p.stderr()
    finally:
        pg.remove()


@store_independent
def test_postgres_killed_and_restarted_under_load_loses_nothing(proxy, upstream, pg):
    """Clients send new keys while the server is killed (SIGKILL) and started
    again: every key answered as executed before, during or after replays
    afterwards (fsync on: a commit it acknowledged survives), and no key runs
    twice; the proxy serves again without a restart."""
    p = proxy("--store", pg.url, "--store-timeout", "1")
    wait_for(lambda: readyz(p) == 200, timeout=5, what="/readyz 200")
    # six clients sending new keys, one after another
    load = Load([p], workers=6, body=b"x", timeout=5, pace_s=0).start()
    time.sleep(1.0)
    pg.kill()
    time.sleep(0.5)
    pg.start()
    time.sleep(1.5)
    load.stop()
    executed = [a.key for a in load.answers if a.status == 201 and a.replayed == "false"]
    refused = [a.key for a in load.answers if a.status == 503]
    print("kill -9 under load: %d keys, %d executed, %d refused (503)"
          % (len(load.keys), len(executed), len(refused)))
    assert len(executed) > 50 and refused, "the load or the crash did not bite"
    wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200 after the restart")
    before = upstream.hits()
    for k in executed:
        st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", k)], b"x")
        assert st == 201 and hone(h, REPLAY) == "true", (k, st)
    assert upstream.hits() == before, "a completed key ran again after the crash"
    counts = upstream.executions()
    assert max(counts.values()) == 1


@store_independent
def test_postgres_failover_to_a_promoted_replica_without_a_restart(proxy, upstream, pg):
    """A multi-host URL with target_session_attrs=read-write: the primary
    stopped, the streaming replica promoted, the proxy finds it by itself;
    completed keys it had replicated still replay; /readyz is 503 meanwhile."""
    replica = pg.replica()
    try:
        url = ("postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres"
               "?target_session_attrs=read-write" % (pg.port, replica.port))
        p = proxy("--store", url, "--store-timeout", "1")
        wait_for(lambda: readyz(p) == 200, timeout=10, what="/readyz 200")
        keys = [executes_then_replays(p, upstream) for _ in range(5)]
        lsn = pg.sql("SELECT pg_current_wal_lsn()::text")[0][0]
        wait_for(lambda: replica.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                     (lsn,))[0][0], timeout=10, what="the replica to catch up")
        pg.stop()
        refused_503(p, upstream)
        replica.promote()
        wait_for(lambda: readyz(p) == 200, timeout=15, what="/readyz 200 on the new primary")
        before = upstream.hits()
        for k in keys:
            st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", k)], b"x")
            assert st == 201 and hone(h, REPLAY) == "true", (k, st)
        assert upstream.hits() == before
        executes_then_replays(p, upstream)
    finally:
        replica.remove()


@store_independent
def test_postgres_host_that_never_answers_is_passed_over(proxy, upstream, pg):
    """The first host of a multi-host URL accepts connections and never says
    a word (a machine gone, a black hole): libpq would wait on it for good;
    the proxy gives up on it after a while and starts from the next host."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        url = ("postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres"
               "?target_session_attrs=read-write" % (silent.getsockname()[1], pg.port))
        p = proxy("--store", url, "--store-timeout", "1")
        wait_for(lambda: readyz(p) == 200, timeout=20, what="/readyz 200 on the second host")
        executes_then_replays(p, upstream)
        assert "no connection set up in time (127.0.0.1 did not answer)" in p.stderr()
    finally:
        silent.close()


@store_independent
def test_postgres_expired_rows_are_deleted_in_batches_and_count_for_nothing(proxy, upstream, pg):
    run_schema(pg)
    pg.sql("INSERT INTO idemproxy_keys (key, state, fp, token, changed_at, keep_ms, expires_at) "
           "SELECT 'idem:' || md5(i::text) || ':old-' || i, 'C', '\\x00', 't', now(), 1000, "
           "now() - interval '1 minute' FROM generate_series(1, 2500) i")
    p = proxy("--store", pg.url)
    executes_then_replays(p, upstream)
    # An expired record of another payload is no record: the key executes.
    stale = new_key()
    pg.sql("INSERT INTO idemproxy_keys (key, state, fp, token, changed_at, keep_ms, expires_at) "
           "SELECT 'idem:' || repeat('0', 32) || ':' || %s, 'C', '\\x01', 't', now(), 1000, "
           "now() - interval '1 second'", (stale,))
    before = upstream.hits()
    st, h, _ = p.request("POST", "/echo", [("Idempotency-Key", stale)], b"new")
    assert st == 201 and hone(h, REPLAY) == "false" and upstream.hits() == before + 1
    wait_for(lambda: pg.sql("SELECT count(*) FROM idemproxy_keys WHERE expires_at <= now()")
             [0][0] == 0, timeout=10, what="the expired rows to be deleted")
    assert pg.sql("SELECT count(*) FROM idemproxy_keys")[0][0] == 2  # the two live keys
    assert metrics_value(p.metrics(), "idemproxy_postgres_expired_deleted_total") >= 2500


def test_postgres_url_is_checked_at_start_and_redis_options_refused(upstream):
    def start(*args):
        return run_binary(["--upstream", upstream.url, "--check-config"] + list(args))

    r = start("--store", "postgresql://u:pw@h/db?nosuch=1")
    assert r.returncode == 2 and b"--store" in r.stderr and b"nosuch" in r.stderr
    assert b"u:***@" in r.stderr and b":pw@" not in r.stderr
    r = start("--redis", "postgresql://h/db")
    assert r.returncode == 2 and b"a PostgreSQL URL goes in --store" in r.stderr
    r = start("--store", "postgresql://h/db", "--redis", "redis://127.0.0.1:6379")
    assert r.returncode == 2 and b"--store and --redis both" in r.stderr
    r = start("--store", "postgresql://h/db", "--redis-wait-replicas", "1")
    assert r.returncode == 2 and b"needs a Redis URL" in r.stderr
    r = start("--store", "postgres://h:5433/db?sslmode=verify-full&target_session_attrs=read-write")
    assert r.returncode == 0, r.stderr
    # A value libpq refuses (it reads them when it connects): at start, exit status 2.
    r = run_binary(["--upstream", upstream.url, "--store",
                    "postgresql://127.0.0.1:1/db?sslmode=sometimes"], timeout=20)
    assert r.returncode == 2 and b"invalid sslmode value" in r.stderr, r.stderr


def sf_string(key):
    """<key> as an RFC 8941 sf-string: quoted, its \\ and " escaped."""
    return '"%s"' % key.replace("\\", "\\\\").replace('"', '\\"')


@store_independent
def test_postgres_hostile_keys_and_targets_are_parameters(proxy, upstream, pg):
    """What a client sends reaches PostgreSQL as bound parameters: a key made
    of SQL, and a target with bytes that are no UTF-8, change nothing but
    their own row, and read back as they went in."""
    p = proxy("--store", pg.url)
    key = "a';DROP-TABLE-idemproxy_keys;--\\\"$1"
    req = ("POST", "/echo", [("Idempotency-Key", sf_string(key))], b"sql")
    st, h, body = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "false", (st, body)
    st, h, _ = p.request(*req)
    assert st == 201 and hone(h, REPLAY) == "true"
    assert [r[0].split(":", 2)[2] for r in pg.sql("SELECT key FROM idemproxy_keys")] == [key]
    # A target with bytes that are no UTF-8: its key becomes unknown, kept as %XX.
    k2 = new_key()
    raw = (b"POST /reset?x=\xff\xfe%41 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + k2.encode()
           + b"\r\nContent-Length: 3\r\nConnection: close\r\n\r\npay")
    assert p.raw(raw)[0] == 502
    about = pg.sql("SELECT about FROM idemproxy_keys WHERE state = 'U'")
    assert about == [("default POST /reset?x=%FF%FE%41",)], about
    st, _, b = p.raw(raw)  # its duplicate: refused, the upstream not called again
    assert st == 502 and b"idempotency_outcome_unknown" in b, b
    assert upstream.hits("/reset") == 1


@store_independent
def test_postgres_row_lives_its_ttl_and_x_ttl(proxy, upstream, pg):
    """A completed key's row expires --ttl after its answer, or what X-TTL
    asks (capped by --max-ttl); a lock's row lives its lease and then --ttl."""
    p = proxy("--store", pg.url, "--ttl", "600", "--max-ttl", "3600", "--lock-ttl", "30",
              "--tombstone-ttl", "0")  # a tombstone would keep the row longer

    def ttl_s(key):
        return pg.sql("SELECT extract(epoch FROM expires_at - now()) FROM idemproxy_keys "
                      "WHERE right(key, %s) = %s", (len(key) + 1, ":" + key))[0][0]

    k1, k2, k3 = new_key(), new_key(), new_key()
    assert p.request("POST", "/echo", [("Idempotency-Key", k1)], b"x")[0] == 201
    assert 590 < ttl_s(k1) <= 600
    assert p.request("POST", "/echo", [("Idempotency-Key", k2), ("X-TTL", "120")], b"x")[0] == 201
    assert 110 < ttl_s(k2) <= 120
    assert p.request("POST", "/echo", [("Idempotency-Key", k3), ("X-TTL", "999999")],
                     b"x")[0] == 201
    assert 3590 < ttl_s(k3) <= 3600
    # a lock: its lease (30 s) and then the record's keep (600 s)
    k4 = new_key()
    get = in_thread(p.request, "POST", "/hold?id=%s" % k4, [("Idempotency-Key", k4)], b"x")
    wait_for(lambda: upstream.received("Idempotency-Key", k4) == 1, timeout=5,
             what="the upstream to hold the request")
    assert 620 < ttl_s(k4) <= 630
    upstream.release(k4)
    assert get()[0] == 200


def test_postgres_probe_steps_of_one_key_run_one_after_the_other(pg):
    """Two proxies' probe steps on one key (sql/probe.sql, on two sessions):
    the second waits for the first's row lock and decides on what it wrote.
    An absent a second after one still uncommitted releases the key (not
    known, while it is still unknown); a claim behind another is told the
    wait that claim set, and spent when it took the last attempt."""
    run_schema(pg)
    with open(os.path.join(REPO, "sql", "probe.sql")) as f:
        probe = f.read()
    a, b = pg.connect(), pg.connect()
    for c in (a, b):
        c.autocommit = True
        c.cursor().execute("PREPARE p(text, text, bigint, bigint, bigint, bigint, bytea, bytea) "
                           "AS " + probe)

    def step(c, key, what, sent=0, every=0, attempts=10):
        with c.cursor() as cur:
            cur.execute("EXECUTE p(%s, %s, 0, %s, %s, %s, '', '')",
                        (key, what, every, attempts, sent))
            return cur.fetchall()

    def unknown(key):
        pg.sql("INSERT INTO idemproxy_keys (key, state, fp, token, changed_at, keep_ms, expires_at)"
               " VALUES (%s, 'U', '\\x00', 't', now() - interval '10 s', 60000,"
               " now() + interval '60 s')", (key,))

    def behind(first, second):
        """Runs <first> in an open transaction of a, then <second> on b,
        which waits for a's lock until a commits."""
        a.autocommit = False
        got_a = first()
        got_b = in_thread(second)
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_activity "
                                "WHERE wait_event_type = 'Lock'")[0][0] == 1,
                 timeout=5, what="the second step to wait for the row's lock")
        a.commit()
        a.autocommit = True
        return got_a, got_b()

    unknown("k:absent")
    sent = step(b, "k:absent", "claim")[0][1]
    got = behind(lambda: step(a, "k:absent", "absent", sent),
                 lambda: step(b, "k:absent", "absent", sent + 1500))
    assert got == ([("noted", 0, 0)], [("released", 0, 0)])
    assert pg.sql("SELECT count(*) FROM idemproxy_keys WHERE key = 'k:absent'")[0][0] == 0

    unknown("k:claim")
    got = behind(lambda: step(a, "k:claim", "claim", every=60000),
                 lambda: step(b, "k:claim", "claim", every=60000))
    assert got[0][0][0] == "claimed" and got[1][0][0] == "later" and got[1][0][2] == 1
    assert 59000 < got[1][0][1] <= 60000
    unknown("k:spent")
    got = behind(lambda: step(a, "k:spent", "claim", attempts=1),
                 lambda: step(b, "k:spent", "claim", attempts=1))
    assert got[0][0][0] == "claimed" and got[1] == [("spent", 0, 1)]
    a.close()
    b.close()
