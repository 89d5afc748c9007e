"""Real PostgreSQL 15 servers for the tests (SPEC §10): each one its own
`initdb` into a temporary folder, started with `pg_ctl` on a free loopback
port as the unprivileged `postgres` user (`nobody` where there is none),
never the system service, and stopped by the test that started it.

  with PgServer() as pg:          # initdb, start; stop and remove at the end
      pg.url                      # postgresql://postgres@127.0.0.1:PORT/postgres
      pg.connect()                # a psycopg2 connection as the superuser
      pg.add_role("app", "pw")    # a login role with a password (scram-sha-256)
      pg.kill()                   # SIGKILL the postmaster (a crash), then pg.start()
      replica = pg.replica()      # a streaming replica (pg_basebackup -R), started
      replica.promote()           # pg_ctl promote

The superuser connects over loopback without a password (trust); every other
role needs its password. fsync stays on: a test that kills the server and
checks what survived relies on it.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psycopg2

try:
    from waiting import free_port, wait_for
except ImportError:  # run as a script: test/waiting.py is one folder up
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from waiting import free_port, wait_for

BIN = "/usr/lib/postgresql/15/bin"


def _owner():
    """The unprivileged user the servers run as, and its uid and gid."""
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return name, pw.pw_uid, pw.pw_gid
        except KeyError:
            continue
    raise RuntimeError("no postgres or nobody user to run PostgreSQL as")


def _reachable_root():
    """PostgreSQL will not run as root, and its user must reach its binaries:
    a root directory of mode 0700 (a chroot made in a folder from mktemp)
    lets no unprivileged user reach anything, so it is opened as every real
    system's is (0755), and said so. Nothing changes on a machine whose /
    others may enter."""
    mode = os.stat("/").st_mode & 0o777
    if os.getuid() == 0 and mode & 0o005 != 0o005:
        os.chmod("/", mode | 0o055)
        print("pg_fixtures: / was mode %04o, so no unprivileged user could reach anything: "
              "made it %04o, as on any installed system" % (mode, mode | 0o055), file=sys.stderr)


def _as_owner(cmd, **kw):
    """Runs <cmd> as the servers' user (when this process is root)."""
    _reachable_root()
    name, uid, gid = _owner()
    if os.getuid() == 0:
        cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups"] + cmd
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, **kw)


class PgServer:
    """One PostgreSQL server in a folder of its own."""

    def __init__(self, workdir=None, primary=None, tls=None):
        """<tls>: (certificate, key) files the server presents (ssl = on);
        plain TCP is still accepted."""
        self.tls = tls
        self._started = False
        self.port = free_port()
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="idemproxy-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self.primary = primary
        _, uid, gid = _owner()
        os.chmod(self.dir, 0o755)
        if os.getuid() == 0:
            os.chown(self.dir, uid, gid)

    @property
    def url(self):
        return "postgresql://postgres@127.0.0.1:%d/postgres" % self.port

    def _ctl(self, *args, check=True):
        r = _as_owner([BIN + "/pg_ctl", "-D", self.data, "-l", self.log] + list(args))
        if check and r.returncode != 0:
            raise RuntimeError("pg_ctl %s: %s%s\n%s" % (" ".join(args), r.stdout, r.stderr,
                                                         self.log_text()))
        return r

    def log_text(self):
        try:
            with open(self.log) as f:
                return f.read()[-20000:]
        except OSError:
            return ""

    def init(self):
        """initdb: a superuser postgres, trust on loopback for it, passwords
        (scram-sha-256) for every other role."""
        if self.primary is None:
            r = _as_owner([BIN + "/initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                           "--no-instructions", "-E", "UTF8", "--locale=C.UTF-8"])
            if r.returncode != 0:
                raise RuntimeError("initdb: %s%s" % (r.stdout, r.stderr))
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write("local all postgres trust\n"
                    "host all postgres 127.0.0.1/32 trust\n"
                    "host replication postgres 127.0.0.1/32 trust\n"
                    "host all all 127.0.0.1/32 scram-sha-256\n")
        with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
            f.write("listen_addresses = '127.0.0.1'\nport = %d\n"
                    "unix_socket_directories = '%s'\n" % (self.port, self.dir))
            if self.tls:
                f.write("ssl = on\nssl_cert_file = 'tls.crt'\nssl_key_file = 'tls.key'\n")
        if self.tls:  # the server reads them as its user; the key only it may read
            _, uid, gid = _owner()
            for src, name in zip(self.tls, ("tls.crt", "tls.key")):
                dst = os.path.join(self.data, name)
                shutil.copyfile(src, dst)
                os.chmod(dst, 0o600)
                if os.getuid() == 0:
                    os.chown(dst, uid, gid)
        return self

    def start(self):
        """pg_ctl start. Its first start takes another free port when the one
        picked was taken meanwhile (free_port() can only say what was free);
        a restart keeps its port, which clients name."""
        for tries_left in (2, 1, 0):
            logged = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            r = self._ctl("-w", "-t", "30", "start", check=False)
            if r.returncode == 0:
                break
            with open(self.log, errors="replace") as f:
                f.seek(logged)
                taken = "could not bind" in f.read()
            if not (taken and not self._started and tries_left):
                raise RuntimeError("pg_ctl start: %s%s\n%s" % (r.stdout, r.stderr,
                                                                 self.log_text()))
            self.port = free_port()
            with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
                f.write("port = %d\n" % self.port)  # the last setting wins
        self._started = True
        wait_for(self.ready, timeout=30, what="PostgreSQL on port %d to accept" % self.port)
        return self

    def ready(self):
        try:
            self.connect().close()
            return True
        except psycopg2.OperationalError:
            return False

    def connect(self, user="postgres", password=None, dbname="postgres"):
        return psycopg2.connect(host="127.0.0.1", port=self.port, user=user, password=password,
                                dbname=dbname, connect_timeout=5)

    def sql(self, statement, args=None):
        """Runs one statement as the superuser (autocommit); returns the rows, if any."""
        c = self.connect()
        try:
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute(statement, args)
                return cur.fetchall() if cur.description else None
        finally:
            c.close()

    def add_role(self, name, password, *grants):
        self.sql("CREATE ROLE %s LOGIN PASSWORD %%s" % name, (password,))
        for g in grants:
            self.sql(g)
        return "postgresql://%s@127.0.0.1:%d/postgres" % (name, self.port)

    def pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def running(self):
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self):
        if self.running():
            self._ctl("-w", "-t", "30", "-m", "fast", "stop", check=False)
        return self

    def kill(self):
        """SIGKILL the postmaster, as a crash; its children exit on their own."""
        pid = self.pid()
        assert pid is not None, "not running"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.running(), timeout=10, what="the postmaster to die")
        # Its backends notice the postmaster is gone and exit; wait for the port.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._port_busy():
            time.sleep(0.1)
        return self

    def _port_busy(self):
        s = socket.socket()
        try:
            return s.connect_ex(("127.0.0.1", self.port)) == 0
        finally:
            s.close()

    def replica(self):
        """A streaming replica of this server (pg_basebackup -R), started."""
        rep = PgServer(primary=self)
        r = _as_owner([BIN + "/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                       "postgres", "-D", rep.data, "-R", "-X", "stream"])
        if r.returncode != 0:
            rep.remove()
            raise RuntimeError("pg_basebackup: %s%s" % (r.stdout, r.stderr))
        rep.init()  # its own port and socket folder over the copied settings
        return rep.start()

    def promote(self):
        self._ctl("-w", "promote")
        wait_for(lambda: not self.sql("SELECT pg_is_in_recovery()")[0][0], timeout=30,
                 what="the replica to be promoted")
        return self

    def remove(self):
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.init().start()

    def __exit__(self, *exc):
        self.remove()


def main():
    """`pg_fixtures.py server`: starts one server, prints its URL and its
    postmaster's PID on one line, and stops and removes it on SIGTERM
    (scripts/test's server for the store suite, scripts/bench's)."""
    if sys.argv[1:] != ["server"]:
        print("usage: pg_fixtures.py server", file=sys.stderr)
        return 2
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    with PgServer() as pg:
        print(pg.url, pg.pid(), flush=True)
        while not stop:
            signal.pause() if hasattr(signal, "pause") else time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
