"""The PostgreSQL fixtures themselves (fixtures/postgres.py): a server made by
initdb and pg_ctl as an unprivileged user, roles with passwords, a crash and
a restart that keeps what was committed, a streaming replica promoted."""
import os

import psycopg2
import pytest

from fixtures.postgres import PgServer, _owner
from fixtures.waiting import wait_for


def test_pg_server_starts_as_an_unprivileged_user_and_stops():
    with PgServer() as pg:
        assert pg.sql("SELECT current_setting('server_version_num')::int / 10000") == [(15,)]
        assert pg.sql("SHOW fsync") == [("on",)]
        with open("/proc/%d/status" % pg.pid()) as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        assert uid == _owner()[1] and uid != 0
        folder = pg.dir
    assert not os.path.exists(folder)
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", connect_timeout=2)


def test_pg_roles_need_their_password():
    with PgServer() as pg:
        url = pg.add_role("app", "s3cret")
        assert url == "postgresql://app@127.0.0.1:%d/postgres" % pg.port
        c = pg.connect("app", "s3cret")
        with c.cursor() as cur:
            cur.execute("SELECT current_user")
            assert cur.fetchone() == ("app",)
        c.close()
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            pg.connect("app", "wrong")


def test_pg_killed_server_keeps_what_was_committed():
    with PgServer() as pg:
        pg.sql("CREATE TABLE t (v int)")
        pg.sql("INSERT INTO t VALUES (1), (2)")
        pg.kill()
        assert not pg.running()
        pg.start()
        assert pg.sql("SELECT count(*) FROM t") == [(2,)]


def test_pg_replica_streams_and_is_promoted():
    with PgServer() as pg:
        pg.sql("CREATE TABLE t (v int)")
        rep = pg.replica()
        try:
            pg.sql("INSERT INTO t VALUES (7)")
            wait_for(lambda: rep.sql("SELECT v FROM t") == [(7,)], timeout=20,
                     what="the row on the replica")
            assert rep.sql("SELECT pg_is_in_recovery()") == [(True,)]
            pg.stop()
            rep.promote()
            rep.sql("INSERT INTO t VALUES (8)")
            assert rep.sql("SELECT v FROM t ORDER BY v") == [(7,), (8,)]
        finally:
            rep.remove()
