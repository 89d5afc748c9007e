"""Real Redis servers in the shapes of SPEC §2.1, for the integration suite:
TLS (one-way and mutual), ACL users, a Sentinel set (master, replica,
three sentinels) that can be failed over, and a Redis Cluster (masters with
replicas) that can be failed over and have its slots moved.

A plain module: no pytest fixtures here (tests and conftest.py wrap these
classes in fixtures of the scope they need). Every server listens on
127.0.0.1 only, on a free port; every process is ended by its own PID; every
wait is bounded and fails with a FixtureError naming the server and its log.

    pki = make_pki(tmpdir)                      # throwaway CA, certificates
    srv = TlsRedisServer(tmpdir, pki).start()   # rediss://127.0.0.1:PORT
    srv = TlsRedisServer(tmpdir, pki, tls_auth_clients="yes").start()  # mutual
    srv = RedisInstance(tmpdir, acl=["user app on >secret ~idem:* &idemproxy:* +@all",
                                     "user default off"]).start()
    srv.client(username="app", password="secret")
    ss = SentinelSet(tmpdir).start()            # master, replica, 3 sentinels
    ss.sentinel_url()  # redis-sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3?master=mymaster
    old = ss.kill_master(); new = ss.wait_failover(old)
    cs = ClusterSet(tmpdir).start()             # 3 masters, 1 replica each
    cs.seed_url(seeds=3)  # redis://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
    old = cs.kill_master(); seconds = cs.wait_failover(old); cs.revive(old)
    cs.move_slot(cs.slot_of("idem:k"), cs.masters()[1])   # MOVED from the old owner
    mon = Monitor(srv); srv.freeze(); ...; mon.commands(since=unix_time)  # what it ran, when

From the command line (a cluster for a whole run of scripts/test):

    /usr/bin/python3 redis_fixtures.py cluster --dir DIR [--masters 3] [--replicas 1]

prints the seed URL (every master) on one line, runs until SIGTERM/SIGINT,
then stops its servers and exits 0 (1, with the reason on stderr, when the
cluster could not be started).

Requires /usr/bin/redis-server built with TLS (Debian's is), /usr/bin/redis-cli
(for the cluster), the openssl CLI and python3-redis.
"""
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import redis
import redis.cluster

try:
    import waiting
except ImportError:  # run as a script: test/waiting.py is one folder up
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import waiting

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"
CLUSTER_SLOTS = 16384
OPENSSL = "openssl"
HOST = "127.0.0.1"


class FixtureError(RuntimeError):
    """A fixture server could not be started, or a bounded wait ran out."""


# --------------------------------------------------------------------------- ports

_used_ports = set()
_ports_lock = threading.Lock()


def free_port():
    """A free TCP port on 127.0.0.1 (test/waiting.py's: in a pytest-xdist
    worker, one of its own below the ephemeral range, which no outgoing
    connection takes while a server is stopped), never one this process has
    handed out before, so the servers of one set never collide with each
    other."""
    for _ in range(100):
        port = waiting.free_port()
        with _ports_lock:
            if port not in _used_ports:
                _used_ports.add(port)
                return port
    raise FixtureError("no unused free port found on %s" % HOST)


def log_tail(path, limit=3000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError as e:
        return "(log %s unreadable: %s)" % (path, e)
    text = data.decode("utf-8", "replace")
    return ("...\n" if size > limit else "") + text


# --------------------------------------------------------------------------- PKI

_OPENSSL_CNF = """\
# Written by redis_fixtures.make_pki: nothing comes from the system's openssl.cnf.
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder

[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[wrong_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:wrong.example
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class Pki:
    """Paths of the files make_pki wrote (absolute). Also readable as a dict
    by file name: pki["server.crt"]."""

    FILES = ("ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key",
             "other-ca.crt", "other-ca.key", "wrong.crt", "wrong.key")

    def __init__(self, dirpath):
        self.dir = os.path.abspath(str(dirpath))
        self.ca_crt = self._p("ca.crt")
        self.ca_key = self._p("ca.key")
        self.server_crt = self._p("server.crt")
        self.server_key = self._p("server.key")
        self.client_crt = self._p("client.crt")
        self.client_key = self._p("client.key")
        self.other_ca_crt = self._p("other-ca.crt")
        self.other_ca_key = self._p("other-ca.key")
        self.wrong_crt = self._p("wrong.crt")
        self.wrong_key = self._p("wrong.key")

    def _p(self, name):
        return os.path.join(self.dir, name)

    def __getitem__(self, name):
        if name not in self.FILES:
            raise KeyError(name)
        return self._p(name)

    def as_dict(self):
        return {n: self._p(n) for n in self.FILES}

    def __repr__(self):
        return "Pki(%r)" % self.dir


def _openssl(args, cwd):
    r = subprocess.run([OPENSSL] + args, cwd=cwd, capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise FixtureError("openssl %s failed (%d):\n%s%s" % (
            " ".join(args), r.returncode, r.stdout.decode(errors="replace"),
            r.stderr.decode(errors="replace")))


def make_pki(dirpath):
    """Writes into <dirpath> (created if needed), with the openssl CLI and EC
    P-256 keys: a CA (ca.crt/ca.key, basicConstraints critical CA:TRUE); a
    server certificate it signs for DNS:localhost and IP:127.0.0.1, EKU
    serverAuth (server.crt/server.key); a client certificate it signs, EKU
    clientAuth (client.crt/client.key); an unrelated second CA
    (other-ca.crt/other-ca.key); a server certificate the good CA signs for
    DNS:wrong.example only (wrong.crt/wrong.key). Returns a Pki."""
    d = os.path.abspath(str(dirpath))
    os.makedirs(d, exist_ok=True)
    cnf = os.path.join(d, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write(_OPENSSL_CNF)

    def key(name):
        _openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                  "-out", name], d)
        os.chmod(os.path.join(d, name), 0o600)

    def ca(stem, cn):
        key(stem + ".key")
        _openssl(["req", "-config", cnf, "-new", "-x509", "-sha256", "-days", "3650",
                  "-key", stem + ".key", "-subj", "/CN=" + cn, "-extensions", "ca_ext",
                  "-out", stem + ".crt"], d)

    def leaf(stem, cn, ext):
        key(stem + ".key")
        _openssl(["req", "-config", cnf, "-new", "-key", stem + ".key", "-subj", "/CN=" + cn,
                  "-out", stem + ".csr"], d)
        _openssl(["x509", "-req", "-sha256", "-days", "825", "-in", stem + ".csr",
                  "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-set_serial", str(int.from_bytes(os.urandom(8), "big") >> 1),
                  "-extfile", cnf, "-extensions", ext, "-out", stem + ".crt"], d)
        os.unlink(os.path.join(d, stem + ".csr"))

    ca("ca", "idemproxy test CA")
    ca("other-ca", "unrelated test CA")
    leaf("server", "localhost", "server_ext")
    leaf("client", "idemproxy test client", "client_ext")
    leaf("wrong", "wrong.example", "wrong_ext")
    return Pki(d)


# --------------------------------------------------------------------------- one process


class _Proc:
    """One redis-server process (data node or sentinel) with its config file
    <workdir>/<name>.conf, log <workdir>/<name>.log and working directory
    <workdir>/<name>/. Subclasses provide _conf_lines()."""

    sentinel = False
    kind = "redis-server"

    def __init__(self, workdir, name, pki=None, tls_auth_clients="no", auth=(None, None)):
        if tls_auth_clients not in ("no", "yes", "optional"):
            raise ValueError("tls_auth_clients: no, yes or optional")
        self.workdir = os.path.abspath(str(workdir))
        self.name = name
        self.pki = pki
        self.tls_auth_clients = tls_auth_clients
        self.auth = auth  # (username, password) the fixture's own clients use
        self.port = free_port()
        self.conf_path = os.path.join(self.workdir, name + ".conf")
        self.log_path = os.path.join(self.workdir, name + ".log")
        self.dir = os.path.join(self.workdir, name)
        self.proc = None
        self.frozen = False
        self.started_seconds = None
        self._conf_port = None

    # ---- subclass hooks
    def _conf_lines(self):
        raise NotImplementedError

    def _common_lines(self):
        lines = ["bind %s" % HOST, "daemonize no", 'logfile ""', "dir %s" % self.dir,
                 "protected-mode no"]
        if self.pki is None:
            lines.append("port %d" % self.port)
        else:
            lines += ["port 0", "tls-port %d" % self.port,
                      "tls-ca-cert-file %s" % self.pki.ca_crt,
                      "tls-auth-clients %s" % self.tls_auth_clients,
                      # What this process presents when it is the client (replication,
                      # sentinel links): the server certificate is serverAuth only.
                      "tls-client-cert-file %s" % self.pki.client_crt,
                      "tls-client-key-file %s" % self.pki.client_key]
        return lines

    # ---- identity
    @property
    def tls(self):
        return self.pki is not None

    @property
    def addr(self):
        return (HOST, self.port)

    def describe(self):
        return "%s %s on %s:%d%s (log %s)" % (self.kind, self.name, HOST, self.port,
                                              " (TLS)" if self.tls else "", self.log_path)

    def url(self, username=None, password=None, db=None):
        """redis[s]://[[USER]:PASSWORD@]127.0.0.1:PORT[/DB] (credentials only when given)."""
        userinfo = ""
        if password is not None or username is not None:
            userinfo = "%s:%s@" % (urllib.parse.quote(username or "", safe=""),
                                   urllib.parse.quote(password or "", safe=""))
        return "%s://%s%s:%d%s" % ("rediss" if self.tls else "redis", userinfo, HOST,
                                   self.port, "" if db is None else "/%d" % db)

    # ---- clients
    def client(self, username=None, password=None, ca=None, client_cert=None,
               check_hostname=False, timeout=5.0, **kw):
        """A redis.Redis to this process. Without username/password, the
        fixture's own credentials (if any) are used; pass password="" to
        connect with none. TLS: verified against <ca> (default the PKI's CA);
        client_cert None = the PKI's client certificate when the server asks
        for one (tls_auth_clients yes/optional), False = none, or a
        (certfile, keyfile) pair."""
        if username is None and password is None:
            username, password = self.auth
        if password == "":
            username, password = None, None
        args = dict(host=HOST, port=self.port, username=username, password=password,
                    socket_timeout=timeout, socket_connect_timeout=timeout)
        if self.tls:
            args.update(ssl=True, ssl_cert_reqs="required",
                        ssl_ca_certs=ca or self.pki.ca_crt,
                        ssl_check_hostname=check_hostname)
            if client_cert is None and self.tls_auth_clients != "no":
                client_cert = (self.pki.client_crt, self.pki.client_key)
            if client_cert:
                args.update(ssl_certfile=client_cert[0], ssl_keyfile=client_cert[1])
        args.update(kw)
        return redis.Redis(**args)

    # ---- process
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def write_conf(self):
        os.makedirs(self.dir, exist_ok=True)
        with open(self.conf_path, "w") as f:
            f.write("# written by redis_fixtures for %s\n" % self.name)
            f.write("\n".join(self._conf_lines()) + "\n")

    def spawn(self, write_conf=None):
        """Starts the process (does not wait). The config file is written on
        the first start on a port (write_conf=None) and kept on a restart: a
        sentinel rewrites its own (the current master, epochs), and sentinels
        rewrite a data node's on failover (replicaof)."""
        assert not self.running(), "%s already running" % self.describe()
        if write_conf or (write_conf is None and self._conf_port != self.port):
            self.write_conf()
            self._conf_port = self.port
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        argv = [REDIS_SERVER, self.conf_path] + (["--sentinel"] if self.sentinel else [])
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.frozen = False
        self._spawned_at = time.monotonic()

    def _port_clash(self):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return b"Address already in use" in f.read()
        except OSError:
            return False

    def wait_up(self, timeout=10.0):
        """Waits until the process answers PING (an authentication error
        counts as an answer). Returns True; False if the process exited
        because its port was taken; raises FixtureError otherwise."""
        deadline = time.monotonic() + timeout
        c = self.client(timeout=1.0)
        last = None
        try:
            while True:
                if self.proc.poll() is not None:
                    if self._port_clash():
                        return False
                    raise FixtureError("%s exited with %s during start-up:\n%s" % (
                        self.describe(), self.proc.returncode, log_tail(self.log_path)))
                try:
                    if c.ping():
                        break
                except (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError):
                    break  # it answered (NOAUTH, WRONGPASS...): it is up
                except redis.exceptions.RedisError as e:
                    last = e
                if time.monotonic() > deadline:
                    raise FixtureError(
                        "%s did not answer PING%s within %.0f s (last error: %s):\n%s" % (
                            self.describe(), " over TLS" if self.tls else "", timeout, last,
                            log_tail(self.log_path)))
                time.sleep(0.03)
        finally:
            c.close()
        self.started_seconds = time.monotonic() - self._spawned_at
        return True

    def start(self, timeout=10.0, write_conf=None):
        """spawn() + wait_up(), on a new port if the chosen one was taken
        meanwhile (on a first start only: a restart keeps its port). Returns
        self."""
        for _ in range(3):
            first = self._conf_port != self.port
            self.spawn(write_conf)
            if self.wait_up(timeout):
                return self
            self.proc.wait(5)
            self.proc = None
            if not first:
                raise FixtureError("%s: its port was taken meanwhile (restart):\n%s" % (
                    self.describe(), log_tail(self.log_path)))
            self.port = free_port()
        raise FixtureError("%s: port taken three times in a row" % self.describe())

    def restart(self, timeout=10.0):
        """stop() then start() on the same port, with the config file as it
        is now. Returns self."""
        self.stop()
        return self.start(timeout)

    def kill(self):
        """SIGKILL (a crash), and reaps it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None
        self.frozen = False

    def freeze(self):
        """SIGSTOP: the process holds its connections but answers nothing."""
        assert self.running(), self.describe()
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self):
        if self.running() and self.frozen:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self, timeout=3.0):
        """SIGTERM (after SIGCONT if frozen); SIGKILL if it has not exited
        within <timeout>. Only this object's own process is signalled."""
        if self.proc is None:
            return
        self.signal_term()
        self.reap(timeout)

    def signal_term(self):
        if self.proc is not None and self.proc.poll() is None:
            if self.frozen:
                self.proc.send_signal(signal.SIGCONT)
                self.frozen = False
            self.proc.send_signal(signal.SIGTERM)

    def reap(self, timeout=3.0):
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
        self.frozen = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return "<%s>" % self.describe()


# --------------------------------------------------------------------------- data nodes


class RedisInstance(_Proc):
    """A redis-server data node on 127.0.0.1:<free port>, `save ""`,
    `appendonly no`.

    pki:               a Pki: TLS only (`port 0`, `tls-port PORT`), the PKI's
                       server certificate unless cert/key override it
    tls_auth_clients:  "no" (default), "yes" (mutual TLS) or "optional"
    cert, key:         the certificate and key served (e.g. pki.wrong_crt)
    acl:               ACL user lines (e.g. "user app on >secret ~idem:* +@all",
                       "user default off"), written to <name>.acl (`aclfile`)
    password:          `requirepass` (the default user's password)
    auth:              (username, password) the fixture's own clients use by
                       default (defaults to (None, password))
    replicaof:         (host, port) of a master; master_auth (user, password)
                       gives `masteruser`/`masterauth`
    extra_conf:        further config lines
    """

    def __init__(self, workdir, pki=None, tls_auth_clients="no", cert=None, key=None,
                 acl=None, password=None, auth=None, replicaof=None, master_auth=(None, None),
                 extra_conf=(), name=None):
        if (cert is None) != (key is None):
            raise ValueError("cert and key go together")
        if cert is not None and pki is None:
            raise ValueError("cert/key need a pki (TLS)")
        super().__init__(workdir, name or "redis", pki, tls_auth_clients,
                         auth if auth is not None else (None, password))
        if name is None:
            self._rename("redis-%d" % self.port)
        self.cert = cert
        self.key = key
        self.acl = list(acl) if acl is not None else None
        self.password = password
        self.replicaof = replicaof
        self.master_auth = master_auth
        self.extra_conf = list(extra_conf)
        self.acl_path = os.path.join(self.workdir, self.name + ".acl")

    def _rename(self, name):
        self.name = name
        self.conf_path = os.path.join(self.workdir, name + ".conf")
        self.log_path = os.path.join(self.workdir, name + ".log")
        self.dir = os.path.join(self.workdir, name)

    def _conf_lines(self):
        lines = self._common_lines()
        lines += ['save ""', "appendonly no",
                  "repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
        if self.tls:
            lines += ["tls-cert-file %s" % (self.cert or self.pki.server_crt),
                      "tls-key-file %s" % (self.key or self.pki.server_key),
                      "tls-replication yes"]
        if self.acl is not None:
            with open(self.acl_path, "w") as f:
                f.write("\n".join(self.acl) + "\n")
            lines.append("aclfile %s" % self.acl_path)
        if self.password is not None:
            lines.append("requirepass %s" % _conf_quote(self.password))
        user, pw = self.master_auth
        if user is not None:
            lines.append("masteruser %s" % _conf_quote(user))
        if pw is not None:
            lines.append("masterauth %s" % _conf_quote(pw))
        if self.replicaof is not None:
            lines.append("replicaof %s %d" % tuple(self.replicaof))
        return lines + self.extra_conf

    def role(self):
        """ROLE's first element ("master", "slave"), via the fixture's credentials."""
        c = self.client(timeout=1.0)
        try:
            return _s(c.execute_command("ROLE")[0])
        finally:
            c.close()

    def wait_replica_up(self, timeout=10.0):
        """Waits until INFO replication says master_link_status:up."""
        deadline = time.monotonic() + timeout
        c = self.client(timeout=1.0)
        info = None
        try:
            while True:
                try:
                    info = c.info("replication")
                    if info.get("master_link_status") == "up":
                        return
                except redis.exceptions.RedisError as e:
                    info = e
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise FixtureError("replica %s: master_link_status not up within %.0f s "
                                       "(last INFO replication: %r):\n%s" % (
                                           self.describe(), timeout, info,
                                           log_tail(self.log_path)))
                time.sleep(0.05)
        finally:
            c.close()


class TlsRedisServer(RedisInstance):
    """A RedisInstance over TLS only: TlsRedisServer(workdir, pki,
    tls_auth_clients="no"|"yes", cert=None, key=None, acl=None, password=None).
    start() returns once it answers PING over TLS."""

    def __init__(self, workdir, pki, tls_auth_clients="no", cert=None, key=None, **kw):
        if pki is None:
            raise ValueError("TlsRedisServer needs a pki (make_pki)")
        super().__init__(workdir, pki=pki, tls_auth_clients=tls_auth_clients, cert=cert,
                         key=key, **kw)


# --------------------------------------------------------------------------- watching


class Monitor:
    """MONITOR on one Redis server over a raw socket: the connection outlives
    a SIGSTOP of the server and streams what it runs once it resumes. Keeps
    (server time, client address, command) of every command a client sent
    (not those a script ran: their address is "lua")."""

    LINE = re.compile(r'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] "([^"]*)"')

    def __init__(self, node):
        self.sock = socket.create_connection(node.addr, timeout=5)
        self.sock.sendall(b"CLIENT ID\r\n")
        self.f = self.sock.makefile("rb")
        self.id = int(self.f.readline()[1:])
        self.sock.sendall(b"MONITOR\r\n")
        assert self.f.readline().startswith(b"+OK")
        self.sock.settimeout(None)
        self.lock = threading.Lock()
        self.seen = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for raw in self.f:
                m = self.LINE.match(raw.decode("utf-8", "replace"))
                if m and m.group(2) != "lua":
                    with self.lock:
                        self.seen.append((float(m.group(1)), m.group(2), m.group(3).upper()))
        except (OSError, ValueError):
            pass

    def commands(self, since):
        with self.lock:
            return [c for c in self.seen if c[0] >= since]

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)


SCRIPTS = ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL")


def cut_links(node, keep):
    """Closes every client connection of <node> but <keep> (ids), replicas and
    pub/sub: the proxies' links (and the sentinels' command links, which
    reconnect at once)."""
    c = node.client()
    try:
        ids = []
        for line in c.execute_command("CLIENT", "LIST").splitlines():
            f = dict(kv.split("=", 1) for kv in _s(line).split(" ") if "=" in kv)
            if int(f["id"]) not in keep and not set(f["flags"]) & set("SMPO") \
                    and f["cmd"] != "client|list":
                ids.append(f["id"])
        for i in ids:  # one ID filter a call: several would all have to match
            c.execute_command("CLIENT", "KILL", "ID", i)
    finally:
        c.close()


# --------------------------------------------------------------------------- sentinel


class SentinelInstance(_Proc):
    sentinel = True
    kind = "redis-sentinel"

    def __init__(self, workdir, name, sset):
        super().__init__(workdir, name, sset.pki, sset.tls_auth_clients,
                         (sset.sentinel_user, sset.sentinel_password))
        self.sset = sset
        self.myid = os.urandom(20).hex()

    def renew(self):
        """A new port and id (before a retried start)."""
        self.port = free_port()
        self.myid = os.urandom(20).hex()

    def _conf_lines(self):
        s = self.sset
        lines = self._common_lines()
        if self.tls:
            lines += ["tls-cert-file %s" % self.pki.server_crt,
                      "tls-key-file %s" % self.pki.server_key,
                      # TLS to the master, the replicas and the other sentinels
                      "tls-replication yes"]
        if s.sentinel_password is not None:
            if s.sentinel_user is not None:
                lines += ["user default off",
                          "user %s on #%s allchannels +@all" % (
                              s.sentinel_user, _sha256(s.sentinel_password))]
            else:
                lines.append("requirepass %s" % _conf_quote(s.sentinel_password))
        lines += ["sentinel resolve-hostnames no",
                  "sentinel myid %s" % self.myid]
        if s.sentinel_password is not None:
            if s.sentinel_user is not None:
                lines.append("sentinel sentinel-user %s" % _conf_quote(s.sentinel_user))
            lines.append("sentinel sentinel-pass %s" % _conf_quote(s.sentinel_password))
        n = s.name
        mhost, mport = s.initial_master.addr
        lines += ["sentinel monitor %s %s %d %d" % (n, mhost, mport, s.quorum),
                  "sentinel down-after-milliseconds %s %d" % (n, s.down_after_ms),
                  "sentinel failover-timeout %s %d" % (n, s.failover_timeout_ms),
                  "sentinel parallel-syncs %s 1" % n]
        if s.username is not None:
            lines.append("sentinel auth-user %s %s" % (n, _conf_quote(s.username)))
        if s.password is not None:
            lines.append("sentinel auth-pass %s %s" % (n, _conf_quote(s.password)))
        # The other sentinels are declared up front (as a sentinel's own config
        # rewrite would), so they need not discover each other through hello
        # messages (published every 2 s) before the set can fail over.
        for other in s.sentinels:
            if other is not self:
                lines.append("sentinel known-sentinel %s %s %d %s" % (n, HOST, other.port,
                                                                      other.myid))
        return lines

    def command(self, *args, timeout=1.0):
        c = self.client(timeout=timeout)
        try:
            return c.execute_command(*args)
        finally:
            c.close()


class _ServerSet:
    """What SentinelSet and ClusterSet share: a set of servers started
    together, each its own process. A subclass has start(), <pki> (None: no
    TLS), _stop_groups() (the processes, in groups stopped one after the
    other) and _data_nodes() (the Redis servers that node() finds)."""

    def stop(self):
        """Ends every process of the set (its own PIDs only), group by group:
        SIGTERM to each of a group (SIGCONT first to a frozen one), then
        SIGKILL to any still there after 3 s."""
        for group in self._stop_groups():
            for p in group:
                p.signal_term()
            for p in group:
                p.reap()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def tls(self):
        return self.pki is not None

    def node(self, addr):
        """The Redis server of this set listening on addr (host, port)."""
        for n in self._data_nodes():
            if n.addr == tuple(addr):
                return n
        raise FixtureError("%s:%s is none of this set's Redis servers (%s)" % (
            addr[0], addr[1], ", ".join(n.describe() for n in self._data_nodes())))


class SentinelSet(_ServerSet):
    """A master, <replicas> replicas (`replicaof`) and <sentinels> sentinels
    on free loopback ports, each its own redis-server process with a config
    file under <workdir>.

    name:                the monitored master's name ("mymaster")
    pki, tls_auth_clients: TLS everywhere (data nodes, sentinels, replication,
                         sentinel links) as in RedisInstance
    password:            the data nodes' password: `requirepass` (username
                         None) or, with username, an ACL user `~* &* +@all`
                         with `user default off`; the replicas' `masterauth`/
                         `masteruser`, the sentinels' `auth-pass`/`auth-user`
    acl_users:           further ACL lines for the data nodes (e.g. a user
                         restricted to ~idem:*), with or without username
    sentinel_password:   the sentinels' own password (`requirepass`, or with
                         sentinel_user an ACL user; `sentinel sentinel-pass`)
    down_after_ms, failover_timeout_ms, quorum: the sentinel settings

    start() returns once the replicas are in sync and every sentinel sees the
    master, the replicas and the other sentinels connected.
    """

    def __init__(self, workdir, name="mymaster", pki=None, tls_auth_clients="no",
                 password=None, username=None, acl_users=(), sentinel_password=None,
                 sentinel_user=None, replicas=1, sentinels=3, quorum=2, down_after_ms=1000,
                 failover_timeout_ms=3000):
        if username is not None and password is None:
            raise ValueError("username needs a password")
        if sentinel_user is not None and sentinel_password is None:
            raise ValueError("sentinel_user needs a sentinel_password")
        self.workdir = os.path.abspath(str(workdir))
        os.makedirs(self.workdir, exist_ok=True)
        self.name = name
        self.pki = pki
        self.tls_auth_clients = tls_auth_clients
        self.username = username
        self.password = password
        self.sentinel_user = sentinel_user
        self.sentinel_password = sentinel_password
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.startup_seconds = None

        acl = None
        requirepass = None
        if username is not None:
            acl = ["user default off",
                   "user %s on #%s ~* &* +@all" % (username, _sha256(password))] + list(acl_users)
        else:
            requirepass = password
            if acl_users:
                acl = list(acl_users)

        def data_node(nm, replicaof):
            return RedisInstance(self.workdir, pki=pki, tls_auth_clients=tls_auth_clients,
                                 acl=acl, password=requirepass, auth=(username, password),
                                 replicaof=replicaof, master_auth=(username, password),
                                 name=nm)

        self.initial_master = data_node("master", None)
        self.data_nodes = [self.initial_master]
        for i in range(replicas):
            self.data_nodes.append(data_node("replica%d" % (i + 1), self.initial_master.addr))
        self.sentinels = [SentinelInstance(self.workdir, "sentinel%d" % (i + 1), self)
                          for i in range(sentinels)]

    # ---- start / stop
    def start(self, timeout=15.0):
        t0 = time.monotonic()
        try:
            self.initial_master.start()
            for r in self.data_nodes[1:]:
                r.replicaof = self.initial_master.addr
                r.start()
            for r in self.data_nodes[1:]:
                r.wait_replica_up(timeout)
            self._start_sentinels()
            self.wait_sentinels_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start_sentinels(self):
        for _ in range(3):
            for s in self.sentinels:
                s.spawn()
            if all([s.wait_up() for s in self.sentinels]):
                return
            for s in self.sentinels:  # a port was taken: all again, new ports and ids
                s.kill()
                s.renew()
        raise FixtureError("sentinels: ports taken three times in a row")

    def sentinels_ready(self):
        """None when every sentinel sees the master (flags "master"), every
        replica (link ok) and every other sentinel connected; otherwise a
        description of what is missing."""
        for s in self.sentinels:
            try:
                # last-ping-sent is "0" once the last PING on that link was
                # answered (it counts from the link's creation until then)
                m = _pairs(s.command("SENTINEL", "MASTER", self.name))
                if m.get("flags") != "master" or m.get("last-ping-sent") != "0":
                    return "%s: master %r" % (s.name, m)
                reps = [_pairs(x) for x in s.command("SENTINEL", "REPLICAS", self.name)]
                ok = [x for x in reps if x.get("flags") == "slave"
                      and x.get("master-link-status") == "ok"]
                if len(ok) < len(self.data_nodes) - 1:
                    return "%s: replicas %r" % (s.name, reps)
                sens = [_pairs(x) for x in s.command("SENTINEL", "SENTINELS", self.name)]
                ok = [x for x in sens if x.get("flags") == "sentinel"
                      and x.get("last-ping-sent") == "0"]
                if len(ok) < len(self.sentinels) - 1:
                    return "%s: sentinels %r" % (s.name, sens)
                q = _s(s.command("SENTINEL", "CKQUORUM", self.name))
                if not q.startswith("OK"):
                    return "%s: ckquorum %r" % (s.name, q)
            except redis.exceptions.RedisError as e:
                return "%s: %s" % (s.name, e)
        return None

    def wait_sentinels_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            why = self.sentinels_ready()
            if why is None:
                return
            for s in self.sentinels:
                if s.proc.poll() is not None:
                    raise FixtureError("%s exited:\n%s" % (s.describe(), log_tail(s.log_path)))
            if time.monotonic() > deadline:
                raise FixtureError("sentinels of %s not ready within %.0f s: %s\nlogs: %s" % (
                    self.name, timeout, why, ", ".join(s.log_path for s in self.sentinels)))
            time.sleep(0.05)

    def _stop_groups(self):
        # the sentinels first, so that they do not fail over during the teardown
        return (self.sentinels, self.data_nodes)

    def _data_nodes(self):
        return self.data_nodes

    # ---- addresses, clients
    def sentinel_addrs(self):
        return [s.addr for s in self.sentinels]

    def sentinel_url(self, master=None, tls=None, credentials=True, db=None):
        """redis-sentinel://[[USER]:PASSWORD@]127.0.0.1:S1,127.0.0.1:S2,...[/DB]?master=NAME
        (SPEC §2.1). tls None = as the set runs (rediss-sentinel:// on a TLS
        set); master None = the set's name; credentials: the master's
        user/password in the userinfo and the sentinels' as sentinel_user /
        sentinel_password query parameters, when the set has them."""
        tls = self.tls if tls is None else tls
        userinfo = ""
        if credentials and self.password is not None:
            userinfo = "%s:%s@" % (urllib.parse.quote(self.username or "", safe=""),
                                   urllib.parse.quote(self.password, safe=""))
        hosts = ",".join("%s:%d" % a for a in self.sentinel_addrs())
        query = [("master", master or self.name)]
        if credentials and self.sentinel_user is not None:
            query.append(("sentinel_user", self.sentinel_user))
        if credentials and self.sentinel_password is not None:
            query.append(("sentinel_password", self.sentinel_password))
        return "%s://%s%s%s?%s" % ("rediss-sentinel" if tls else "redis-sentinel", userinfo,
                                   hosts, "" if db is None else "/%d" % db,
                                   urllib.parse.urlencode(query, quote_via=urllib.parse.quote))

    def sentinel_reports(self):
        """{sentinel name: (host, port) | error string} from every running,
        unfrozen sentinel's SENTINEL get-master-addr-by-name."""
        out = {}
        for s in self.sentinels:
            if not s.running() or s.frozen:
                continue
            try:
                r = s.command("SENTINEL", "get-master-addr-by-name", self.name)
                out[s.name] = (_s(r[0]), int(r[1])) if r else None
            except redis.exceptions.RedisError as e:
                out[s.name] = "error: %s" % e
        return out

    def master_addr(self):
        """(host, port) of the master as the first sentinel that answers reports it."""
        reports = self.sentinel_reports()
        for v in reports.values():
            if isinstance(v, tuple):
                return v
        raise FixtureError("no sentinel of %s reports a master: %r" % (self.name, reports))

    def master(self):
        return self.node(self.master_addr())

    def master_client(self, **kw):
        return self.master().client(**kw)

    def replicas(self):
        """The running data nodes other than the current master."""
        m = self.master_addr()
        return [n for n in self.data_nodes if n.addr != m and n.running()]

    def kill_master(self):
        """SIGKILL the current master's process. Returns its address."""
        m = self.master()
        m.kill()
        return m.addr

    def freeze_master(self):
        """SIGSTOP the current master's process. Returns its address."""
        m = self.master()
        m.freeze()
        return m.addr

    def revive(self, addr, wait_replica=False, timeout=20.0):
        """Starts the (killed) data node at addr again, same port and config
        file. A killed master comes back as a master; the sentinels turn it
        into a replica of the current master after about 8 s (Redis waits
        4 hello periods): wait_replica=True waits for that. Returns the node."""
        n = self.node(addr)
        n.start()
        if wait_replica:
            n.wait_replica_up(timeout)
        return n

    def thaw(self):
        """SIGCONT every frozen process of the set."""
        for p in self.data_nodes + self.sentinels:
            p.thaw()

    def wait_failover(self, old_addr, timeout=15.0, all_sentinels=True):
        """Waits until the sentinels report a master other than old_addr (all
        answering sentinels agreeing, unless all_sentinels=False) and that
        node answers ROLE as master. Returns its (host, port)."""
        old_addr = tuple(old_addr)
        deadline = time.monotonic() + timeout
        reports, role = None, None
        while True:
            reports = self.sentinel_reports()
            addrs = [v for v in reports.values() if isinstance(v, tuple)]
            new = [a for a in addrs if a != old_addr]
            agreed = new and (len(set(addrs)) == 1 if all_sentinels else True)
            if agreed:
                cand = new[0]
                try:
                    role = self.node(cand).role()
                    if role == "master":
                        return cand
                except redis.exceptions.RedisError as e:
                    role = "error: %s" % e
            if time.monotonic() > deadline:
                raise FixtureError(
                    "no failover of %s away from %s:%d within %.0f s: sentinels report %r, "
                    "ROLE of the candidate %r\nlogs: %s" % (
                        self.name, old_addr[0], old_addr[1], timeout, reports, role,
                        ", ".join(p.log_path for p in self.sentinels + self.data_nodes)))
            time.sleep(0.05)


# --------------------------------------------------------------------------- cluster


class ClusterInstance(RedisInstance):
    """A RedisInstance with `cluster-enabled yes`. Its nodes file is
    <workdir>/<name>-nodes.conf (`cluster-config-file`: Redis writes it,
    and a restart on the same port keeps it, so the node comes back with
    its id, epoch and peers); its cluster bus listens on a free port of its
    own (`cluster-port`: the default, the client port + 10000, may be taken
    or above 65535); `cluster-node-timeout <node_timeout_ms>`. With a pki the
    bus and replication use TLS too (`tls-cluster yes`,
    `tls-replication yes`). No `replicaof`: the cluster says who replicates
    whom."""

    kind = "redis-server (cluster)"

    def __init__(self, workdir, name, node_timeout_ms=2000, **kw):
        super().__init__(workdir, name=name, **kw)
        self.node_timeout_ms = node_timeout_ms
        self.nodes_conf_path = os.path.join(self.workdir, name + "-nodes.conf")
        self.bus_port = None
        self.node_id = None  # CLUSTER MYID, once started

    def write_conf(self):
        """A new config file (the first start on a port) makes a new node:
        the nodes file of an earlier attempt goes."""
        if os.path.exists(self.nodes_conf_path):
            os.unlink(self.nodes_conf_path)
        super().write_conf()

    def _conf_lines(self):
        self.bus_port = free_port()  # written with the config: kept on a restart
        lines = super()._conf_lines()
        lines += ["cluster-enabled yes",
                  "cluster-config-file %s" % self.nodes_conf_path,
                  "cluster-port %d" % self.bus_port,
                  "cluster-node-timeout %d" % self.node_timeout_ms]
        if self.tls:
            lines.append("tls-cluster yes")
        return lines

    def describe(self):
        return "%s %s on %s:%d%s, bus %s (log %s)" % (
            self.kind, self.name, HOST, self.port, " (TLS)" if self.tls else "",
            self.bus_port, self.log_path)

    def command(self, *args, timeout=2.0):
        """One command with the fixture's credentials, on a connection of its own."""
        c = self.client(timeout=timeout)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def cluster_info(self, timeout=2.0):
        """CLUSTER INFO as {str: str}."""
        text = _s(self.command("CLUSTER", "INFO", timeout=timeout))
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class ClusterSet(_ServerSet):
    """A Redis Cluster of <masters> masters (at least 3) with <replicas>
    replicas each, on free loopback ports: masters * (1 + replicas)
    ClusterInstances node1, node2... under <workdir>, joined with
    `redis-cli --cluster create … --cluster-replicas R --cluster-yes`
    (on one host, redis-cli makes the first <masters> nodes the masters, in
    that order, each taking an equal share of the 16384 slots, and pairs the
    replicas with them as it likes: ask masters()/replicas(), never assume a
    pairing). Start-up takes about 2 to 3.5 s, most of it redis-cli's own
    one-second polls.

    node_timeout_ms:     `cluster-node-timeout` (a failover takes about 1.5
                         times this, plus the replica's election delay)
    pki, tls_auth_clients: TLS everywhere as in RedisInstance (`port 0`,
                         `tls-port`, `tls-cluster yes`, `tls-replication
                         yes`); redis-cli gets `--tls --cacert` (and the
                         client certificate when tls_auth_clients is not "no")
    password:            `requirepass` (username None) or, with username, an
                         ACL user `~* &* +@all` with `user default off`, as
                         in SentinelSet; every node's `masterauth`/
                         `masteruser` (any of them may become a replica), and
                         redis-cli's (REDISCLI_AUTH in its environment, and
                         --user)
    acl_users:           further ACL lines (e.g. a user restricted to ~idem:*)

    With tls-cluster yes, CLUSTER SLOTS, CLUSTER NODES and the MOVED/ASK
    redirections name each node's tls-port (the only port here, `port 0`) to
    a client that came over TLS; Redis 7.0 gives the plaintext port instead
    (pport) to a client that came over plain TCP to a node that also has a
    `port` (checked by hand: CLUSTER SHARDS shows both).

    start() returns once every node answers CLUSTER INFO with cluster_state:ok,
    16384 slots assigned and ok and every node known, every replica's
    master_link_status is up, all nodes report the same slot map, and each
    sees every other as what that one says it is (problem()). Every process
    of the set is ended by its own PID (stop(), also when start() fails).
    """

    def __init__(self, workdir, masters=3, replicas=1, node_timeout_ms=2000, pki=None,
                 tls_auth_clients="no", password=None, username=None, acl_users=()):
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters (redis-cli refuses fewer)")
        if replicas < 0:
            raise ValueError("replicas: 0 or more")
        if username is not None and password is None:
            raise ValueError("username needs a password")
        self.workdir = os.path.abspath(str(workdir))
        os.makedirs(self.workdir, exist_ok=True)
        self.n_masters = masters
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.pki = pki
        self.tls_auth_clients = tls_auth_clients
        self.username = username
        self.password = password
        self.startup_seconds = None
        self.create_log_path = os.path.join(self.workdir, "cluster-create.log")
        self._down = {}  # addr -> (monotonic time, its slot ranges, its replicas' addrs)
        self.promoted = {}  # old master's addr -> the replica wait_failover saw take over

        acl = None
        requirepass = None
        if username is not None:
            acl = ["user default off",
                   "user %s on #%s ~* &* +@all" % (username, _sha256(password))] + list(acl_users)
        else:
            requirepass = password
            if acl_users:
                acl = list(acl_users)
        self.nodes = [
            ClusterInstance(self.workdir, "node%d" % (i + 1), node_timeout_ms=node_timeout_ms,
                            pki=pki, tls_auth_clients=tls_auth_clients, acl=acl,
                            password=requirepass, auth=(username, password),
                            master_auth=(username, password))
            for i in range(masters * (1 + replicas))]

    # ---- start / stop
    def start(self, timeout=20.0):
        t0 = time.monotonic()
        try:
            for n in self.nodes:
                n.start()
            for n in self.nodes:
                n.node_id = _s(n.command("CLUSTER", "MYID"))
            self._create(timeout)
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _redis_cli_args(self):
        """redis-cli's TLS and user options, and its environment (the password
        goes in REDISCLI_AUTH, never on a command line)."""
        args, env = [], dict(os.environ)
        env.pop("REDISCLI_AUTH", None)
        if self.tls:
            args += ["--tls", "--cacert", self.pki.ca_crt]
            if self.tls_auth_clients != "no":
                args += ["--cert", self.pki.client_crt, "--key", self.pki.client_key]
        if self.username is not None:
            args += ["--user", self.username]
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password
        return args, env

    def _create(self, timeout):
        args, env = self._redis_cli_args()
        argv = ([REDIS_CLI] + args + ["--cluster", "create"]
                + ["%s:%d" % n.addr for n in self.nodes]
                + ["--cluster-replicas", str(self.n_replicas), "--cluster-yes"])
        with open(self.create_log_path, "ab") as log:
            log.write(("$ %s\n" % " ".join(argv)).encode())
            log.flush()
            try:
                r = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise FixtureError("redis-cli --cluster create did not end within %.0f s:\n%s"
                                   % (timeout, log_tail(self.create_log_path)))
        if r.returncode != 0:
            raise FixtureError("redis-cli --cluster create failed (%d):\n%s\nnode logs: %s" % (
                r.returncode, log_tail(self.create_log_path),
                ", ".join(n.log_path for n in self.nodes)))

    def _live(self):
        """The nodes running and not frozen."""
        return [n for n in self.nodes if n.running() and not n.frozen]

    def _node_problem(self, n, known):
        """None when <n> reports the cluster up: cluster_state:ok, every slot
        assigned and ok, <known> nodes known, and (a replica) its link to its
        master up; otherwise what is missing."""
        try:
            info = n.cluster_info(timeout=1.0)
            if (info.get("cluster_state") != "ok"
                    or info.get("cluster_slots_assigned") != str(CLUSTER_SLOTS)
                    or info.get("cluster_slots_ok") != str(CLUSTER_SLOTS)
                    or info.get("cluster_known_nodes") != str(known)):
                return "%s: CLUSTER INFO %r" % (n.name, info)
            rep = n.client(timeout=1.0)
            try:
                r = rep.info("replication")
            finally:
                rep.close()
            if r.get("role") == "slave" and r.get("master_link_status") != "up":
                return "%s: replica, master_link_status %r (%s:%s)" % (
                    n.name, r.get("master_link_status"), r.get("master_host"),
                    r.get("master_port"))
            # The master's side too: until it says "online" (not "wait_bgsave"), a
            # WAIT on it counts no replica.
            for k, v in r.items():
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") != "online":
                    return "%s: master, its replica %s:%s is %r" % (
                        n.name, v.get("ip"), v.get("port"), v.get("state"))
        except redis.exceptions.RedisError as e:
            return "%s: %s" % (n.name, e)
        return None

    def problem(self, nodes=None):
        """None when every node of <nodes> (default: the running, unfrozen
        ones) reports the cluster up (see _node_problem), they all report
        the same slot map, and each of them sees every other as what that
        one says it is (master, or replica of the same master, not failing:
        gossip can lag behind a replica's link coming up); otherwise what is
        missing."""
        nodes = self._live() if nodes is None else nodes
        for n in nodes:
            why = self._node_problem(n, len(self.nodes))
            if why is not None:
                return why
        maps, views, selves = {}, {}, {}
        for n in nodes:
            try:
                maps[n.name] = [(a, b, m) for a, b, m, _ in self.slot_map(via=n)]
                view = self.cluster_nodes(via=n)
            except redis.exceptions.RedisError as e:
                return "%s: %s" % (n.name, e)
            views[n.name] = {d["id"]: d for d in view}
            for d in view:
                if "myself" in d["flags"]:
                    selves[d["id"]] = (n.name, "master" if "master" in d["flags"] else "slave",
                                       d["master"])
        if len(set(map(tuple, maps.values()))) > 1:
            return "the nodes disagree on the slot map: %r" % maps
        for name, view in views.items():
            for nid, (other, role, master) in selves.items():
                d = view.get(nid)
                if (d is None or role not in d["flags"] or d["master"] != master
                        or d["flags"] & {"fail", "fail?", "handshake", "noaddr"}):
                    return "%s sees %s as %r, which says it is a %s%s" % (
                        name, other, d and (sorted(d["flags"]), d["master"]), role,
                        " of %s" % master if master else "")
        return None

    def wait_ok(self, timeout=20.0, nodes=None):
        """Waits until problem(nodes) is None (see start())."""
        deadline = time.monotonic() + timeout
        while True:
            why = self.problem(nodes)
            if why is None:
                return
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise FixtureError("%s exited:\n%s" % (n.describe(), log_tail(n.log_path)))
            if time.monotonic() > deadline:
                raise FixtureError("cluster not up within %.0f s: %s\nlogs: %s" % (
                    timeout, why, ", ".join(n.log_path for n in self.nodes)))
            time.sleep(0.05)

    def _stop_groups(self):
        return (self.nodes,)

    def _data_nodes(self):
        return self.nodes

    # ---- addresses, clients

    def _node_by_id(self, node_id):
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise FixtureError("no node of this cluster has the id %s" % node_id)

    def _viewer(self, via=None):
        if via is not None:
            return self.node(via) if isinstance(via, tuple) else via
        live = self._live()
        if not live:
            raise FixtureError("no node of the cluster is running (and unfrozen)")
        return live[0]

    def seed_url(self, tls=None, credentials=True, seeds=1):
        """redis://[[USER]:PASSWORD@]127.0.0.1:P1[,127.0.0.1:P2…] (SPEC §2.1's
        seed list; rediss:// on a TLS cluster, or as <tls> says). seeds: how
        many nodes, the masters first (by their first slot) then the
        replicas, or a list of (host, port). credentials: the user/password
        in the userinfo, when the cluster has them."""
        tls = self.tls if tls is None else tls
        if isinstance(seeds, int):
            pool = self.masters() + self.replicas()
            if not 1 <= seeds <= len(pool):
                raise ValueError("seeds: 1 to %d" % len(pool))
            seeds = pool[:seeds]
        userinfo = ""
        if credentials and self.password is not None:
            userinfo = "%s:%s@" % (urllib.parse.quote(self.username or "", safe=""),
                                   urllib.parse.quote(self.password, safe=""))
        return "%s://%s%s" % ("rediss" if tls else "redis", userinfo,
                              ",".join("%s:%d" % tuple(a) for a in seeds))

    def client(self, username=None, password=None, ca=None, client_cert=None, timeout=5.0,
               **kw):
        """A redis.cluster.RedisCluster (redis-py's cluster client: follows
        MOVED and ASK) seeded with every master, with the fixture's
        credentials unless given (password="" for none) and, on a TLS
        cluster, the PKI's CA (or <ca>) and client certificate as
        RedisInstance.client does. Built from the cluster's current slot map:
        make a new one after a failover."""
        if username is None and password is None:
            username, password = self.username, self.password
        if password == "":
            username, password = None, None
        args = dict(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in self.masters()],
                    username=username, password=password, socket_timeout=timeout,
                    socket_connect_timeout=timeout)
        if self.tls:
            args.update(ssl=True, ssl_cert_reqs="required", ssl_ca_certs=ca or self.pki.ca_crt)
            if client_cert is None and self.tls_auth_clients != "no":
                client_cert = (self.pki.client_crt, self.pki.client_key)
            if client_cert:
                args.update(ssl_certfile=client_cert[0], ssl_keyfile=client_cert[1])
        args.update(kw)
        return redis.cluster.RedisCluster(**args)

    def node_client(self, addr, **kw):
        """A plain redis.Redis to the node at addr (no redirections followed):
        RedisInstance.client's arguments."""
        return self.node(addr).client(**kw)

    # ---- topology
    def slot_map(self, via=None):
        """CLUSTER SLOTS as one node sees it (<via>: a node or an address;
        default the first running, unfrozen one): [(first, last, master
        (host, port), [replica (host, port)...])] by first slot. An empty host
        (Redis 7: an address the node does not know) is 127.0.0.1. Redis 7.0
        lists a replica there only once it has a replication offset (after
        the first write it replicated): replicas() reads CLUSTER NODES."""
        n = self._viewer(via)
        out = []
        for r in n.command("CLUSTER", "SLOTS"):
            nodes = [(_s(x[0]) or HOST, int(x[1])) for x in r[2:]]
            out.append((int(r[0]), int(r[1]), nodes[0], nodes[1:]))
        return sorted(out)

    def cluster_nodes(self, via=None):
        """CLUSTER NODES as one node sees it: [{"id", "addr" (host, port),
        "bus_port", "flags" (set), "master" (an id or None), "link",
        "slots" [(first, last)], "migrating" ["[slot->-id]"...]}]."""
        n = self._viewer(via)
        out = []
        for line in _s(n.command("CLUSTER", "NODES")).splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            hostport, _, rest = f[1].partition("@")
            host, _, port = hostport.rpartition(":")
            slots, migrating = [], []
            for s in f[8:]:
                if s.startswith("["):
                    migrating.append(s)
                else:
                    a, _, b = s.partition("-")
                    slots.append((int(a), int(b or a)))
            out.append(dict(id=f[0], addr=(host or HOST, int(port)),
                            bus_port=int(rest.split(",")[0]) if rest else None,
                            flags=set(f[2].split(",")), master=None if f[3] == "-" else f[3],
                            link=f[7], slots=slots, migrating=migrating))
        return out

    def masters(self, via=None):
        """[(host, port)] of the masters that serve slots (CLUSTER SLOTS), by
        their first slot."""
        seen = []
        for _, _, m, _ in self.slot_map(via):
            if m not in seen:
                seen.append(m)
        return seen

    def replicas(self, master=None, via=None):
        """[(host, port)] of the replicas not flagged failing (CLUSTER NODES),
        those of every master in masters() order, or of <master> only."""
        view = self.cluster_nodes(via)
        by_id = {d["id"]: d for d in view}
        order = {m: i for i, m in enumerate(self.masters(via))}
        out = []
        for d in view:
            if "slave" not in d["flags"] or d["flags"] & {"fail", "fail?", "noaddr", "handshake"}:
                continue
            m = by_id.get(d["master"])
            if m is None or (master is not None and m["addr"] != tuple(master)):
                continue
            out.append((order.get(m["addr"], len(order)), d["addr"]))
        return [a for _, a in sorted(out)]

    def master_of_slot(self, slot, via=None):
        """(host, port) of the master serving <slot> (CLUSTER SLOTS)."""
        for a, b, m, _ in self.slot_map(via):
            if a <= slot <= b:
                return m
        raise FixtureError("slot %d is served by no node (as %s sees it)" % (
            slot, self._viewer(via).name))

    def slots_of(self, addr, via=None):
        """[(first, last)] ranges the master at addr serves (CLUSTER SLOTS)."""
        return [(a, b) for a, b, m, _ in self.slot_map(via) if m == tuple(addr)]

    def slot_of(self, key):
        """The hash slot of <key> as the server computes it (CLUSTER KEYSLOT)."""
        return int(self._viewer().command("CLUSTER", "KEYSLOT", key))

    # ---- failures
    def _note_down(self, addr):
        """Records, before <addr> is killed or frozen, what wait_failover
        needs: the time, its slots, its replicas."""
        addr = tuple(addr)
        self._down[addr] = (time.monotonic(), self.slots_of(addr), self.replicas(master=addr))

    def _default_master(self, addr):
        return tuple(addr) if addr is not None else self.master_of_slot(0)

    def kill_master(self, addr=None):
        """SIGKILL the master at addr (default: the master of slot 0), and
        reaps it. Returns its address."""
        addr = self._default_master(addr)
        n = self.node(addr)
        if not self.slots_of(addr):
            raise FixtureError("%s serves no slots: not a master" % n.describe())
        self._note_down(addr)
        n.kill()
        return addr

    def freeze(self, addr):
        """SIGSTOP the node at addr: it holds its connections and answers
        nothing (a master is failed over after the node timeout). Returns addr."""
        addr = tuple(addr)
        n = self.node(addr)
        if self.slots_of(addr):
            self._note_down(addr)
        n.freeze()
        return addr

    def freeze_master(self, addr=None):
        """freeze() of the master at addr (default: the master of slot 0)."""
        return self.freeze(self._default_master(addr))

    def thaw(self, addr=None):
        """SIGCONT the node at addr, or every frozen node of the cluster."""
        for n in ([self.node(addr)] if addr is not None else self.nodes):
            n.thaw()

    def revive(self, addr, wait_replica=True, timeout=20.0):
        """Starts the (killed) node at addr again: same port, config file and
        nodes file, so it comes back with its id and rejoins. A master that
        was failed over meanwhile learns from its peers that its slots have
        a newer owner and turns into a replica of it; wait_replica=True waits
        for that (its master_link_status up) and for the whole cluster to be
        up (wait_ok). Returns the node."""
        n = self.node(addr)
        n.start()
        if wait_replica:
            deadline = time.monotonic() + timeout
            while True:
                c = n.client(timeout=1.0)
                try:
                    r = c.info("replication")
                except redis.exceptions.RedisError as e:
                    r = e
                finally:
                    c.close()
                if isinstance(r, dict) and r.get("role") == "slave" \
                        and r.get("master_link_status") == "up":
                    break
                if n.proc.poll() is not None or time.monotonic() > deadline:
                    raise FixtureError("%s did not come back as a replica within %.0f s "
                                       "(INFO replication %r):\n%s" % (
                                           n.describe(), timeout, r, log_tail(n.log_path)))
                time.sleep(0.05)
            self.wait_ok(max(1.0, deadline - time.monotonic()))
        self._down.pop(tuple(addr), None)
        return n

    def wait_failover(self, old_addr, timeout=15.0):
        """Waits until every slot the master at old_addr served is served by
        one of its replicas, which answers ROLE as master, and every other
        running, unfrozen node reports cluster_state:ok and that slot map.
        old_addr should have gone down through kill_master/freeze (which
        note its slots and replicas); otherwise they are read now. Returns
        the seconds from the kill/freeze (else from this call) to then; the
        new master is self.promoted[old_addr]."""
        old_addr = tuple(old_addr)
        t_call = time.monotonic()
        if old_addr not in self._down:
            self._note_down(old_addr)
            self._down[old_addr] = (t_call,) + self._down[old_addr][1:]
        t_down, old_slots, old_replicas = self._down[old_addr]
        if not old_slots:
            raise FixtureError("%s:%d served no slots: no failover to wait for" % old_addr)
        deadline = t_call + timeout
        why = None
        while True:
            survivors = [n for n in self._live() if n.addr != old_addr]
            why = self.problem(survivors)
            if why is None:
                try:
                    owners = {self.master_of_slot(a, via=survivors[0]) for a, _ in old_slots}
                    new = owners.pop() if len(owners) == 1 else None
                    if new is None or new == old_addr or (old_replicas and new not in old_replicas):
                        why = "the slots %r are served by %r" % (old_slots, owners or new)
                    elif self.node(new).role() != "master":
                        why = "%s:%d serves the slots but ROLE says otherwise" % new
                    else:
                        took = time.monotonic() - t_down
                        self.promoted[old_addr] = new
                        return took
                except redis.exceptions.RedisError as e:
                    why = str(e)
            if time.monotonic() > deadline:
                raise FixtureError("no failover away from %s:%d within %.0f s: %s\nlogs: %s" % (
                    old_addr[0], old_addr[1], timeout, why,
                    ", ".join(n.log_path for n in self.nodes)))
            time.sleep(0.05)

    # ---- slot migration (MOVED and ASK)
    def begin_migration(self, slot, dst_addr):
        """CLUSTER SETSLOT <slot> IMPORTING <source id> on the destination,
        then MIGRATING <destination id> on the source (its current master).
        From then on the source answers ASK for the slot's keys it no longer
        holds. Returns the source's address."""
        src = self.node(self.master_of_slot(slot))
        dst = self.node(dst_addr)
        if src is dst:
            raise FixtureError("slot %d is already served by %s" % (slot, dst.name))
        self._setslot(dst, slot, "IMPORTING", src.node_id)
        self._setslot(src, slot, "MIGRATING", dst.node_id)
        return src.addr

    def _setslot(self, n, slot, *args):
        try:
            n.command("CLUSTER", "SETSLOT", slot, *args)
        except redis.exceptions.RedisError as e:
            raise FixtureError("%s: CLUSTER SETSLOT %d %s: %s" % (
                n.describe(), slot, " ".join(map(str, args)), e))

    def _migrating_to(self, slot):
        """(source, destination) nodes of a migration begun for <slot>,
        read from the source's CLUSTER NODES ([slot->-dst_id])."""
        src = self.node(self.master_of_slot(slot))
        mark = "[%d->-" % slot
        for d in self.cluster_nodes(via=src):
            if "myself" in d["flags"]:
                for m in d["migrating"]:
                    if m.startswith(mark):
                        return src, self._node_by_id(m[len(mark):-1])
        raise FixtureError("slot %d is not being migrated away from %s" % (slot, src.name))

    def migrate_keys(self, slot, count=None, timeout_ms=5000):
        """Moves keys of a slot being migrated (begin_migration) from its
        source to its destination: CLUSTER GETKEYSINSLOT, then MIGRATE … KEYS
        (with AUTH/AUTH2 when the cluster has a password). count: at most
        that many keys, None = all. Returns the keys moved (str)."""
        src, dst = self._migrating_to(slot)
        auth = []
        if self.password is not None:
            auth = (["AUTH2", self.username, self.password] if self.username is not None
                    else ["AUTH", self.password])
        moved = []
        while count is None or len(moved) < count:
            want = 100 if count is None else min(100, count - len(moved))
            keys = src.command("CLUSTER", "GETKEYSINSLOT", slot, want)
            if not keys:
                break
            try:
                src.command("MIGRATE", HOST, dst.port, "", 0, timeout_ms, *auth, "KEYS", *keys,
                            timeout=timeout_ms / 1000.0 + 2)
            except redis.exceptions.RedisError as e:
                raise FixtureError("%s: MIGRATE of %d keys of slot %d to %s: %s" % (
                    src.describe(), len(keys), slot, dst.name, e))
            moved += [_s(k) for k in keys]
        return moved

    def finish_migration(self, slot, dst_addr, timeout=10.0):
        """CLUSTER SETSLOT <slot> NODE <destination id> on the destination,
        then the source, then every other master; then waits until every
        running node reports the destination as the slot's master (the
        replicas learn it by gossip). The source must hold none of the
        slot's keys any more."""
        dst = self.node(dst_addr)
        masters = [self.node(a) for a in self.masters()]
        src = self.node(self.master_of_slot(slot))
        order = [dst] + ([src] if src is not dst else []) + [
            m for m in masters if m is not dst and m is not src]
        for m in order:
            self._setslot(m, slot, "NODE", dst.node_id)
        deadline = time.monotonic() + timeout
        while True:
            views = {}
            for n in self._live():
                try:
                    views[n.name] = self.master_of_slot(slot, via=n)
                except (redis.exceptions.RedisError, FixtureError) as e:
                    views[n.name] = str(e)
            if set(views.values()) == {dst.addr}:
                return
            if time.monotonic() > deadline:
                raise FixtureError("slot %d: not every node sees %s as its master within "
                                   "%.0f s: %r" % (slot, dst.name, timeout, views))
            time.sleep(0.05)

    def move_slot(self, slot, dst_addr):
        """begin_migration + migrate_keys (all) + finish_migration. Returns
        the source's address."""
        src = self.begin_migration(slot, dst_addr)
        self.migrate_keys(slot)
        self.finish_migration(slot, dst_addr)
        return src


# --------------------------------------------------------------------------- small helpers


def _sha256(password):
    """An ACL rule's "#<hash>" form of <password>: any characters, no quoting."""
    return hashlib.sha256(password.encode()).hexdigest()


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _pairs(flat):
    """A flat [k1, v1, k2, v2...] reply as {str: str}."""
    it = iter(flat)
    return {_s(k): _s(v) for k, v in zip(it, it)}


def _conf_quote(v):
    """A config-file argument: quoted when it holds anything but safe characters."""
    if v and all(c.isalnum() or c in "-_.:@/+=*~&<>!%" for c in v):
        return v
    return '"%s"' % v.replace("\\", "\\\\").replace('"', '\\"')


# --------------------------------------------------------------------------- command line


class _Signalled(BaseException):
    """SIGTERM or SIGINT reached the command-line entry."""


def _on_signal(signum, frame):
    # once: a second signal must not interrupt the teardown the first one began
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Signalled(signum)


def main(argv=None):
    """redis_fixtures.py cluster --dir DIR [--masters 3] [--replicas 1]
    [--node-timeout-ms 2000]: starts a ClusterSet in DIR (created if
    needed), prints its seed URL with every master as a seed on one line of
    stdout (redis://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3), then stays in
    the foreground until SIGTERM or SIGINT, stops every redis-server it
    started and exits 0. A failed start-up (or a signal during it) stops
    what was started, says why on stderr and exits 1. Nothing but the URL
    goes to stdout; the node logs and redis-cli's output stay in DIR."""
    import argparse

    p = argparse.ArgumentParser(prog="redis_fixtures.py",
                                description="Redis servers for idemproxy's tests, from the "
                                            "command line.")
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cluster", help="run a Redis Cluster until SIGTERM/SIGINT")
    c.add_argument("--dir", required=True, help="working directory (configs, logs, data)")
    c.add_argument("--masters", type=int, default=3, help="masters (at least 3; default 3)")
    c.add_argument("--replicas", type=int, default=1,
                   help="replicas of each master (default 1)")
    c.add_argument("--node-timeout-ms", type=int, default=2000,
                   help="cluster-node-timeout (default 2000)")
    args = p.parse_args(argv)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    cs = None
    up = False
    try:
        cs = ClusterSet(args.dir, masters=args.masters, replicas=args.replicas,
                        node_timeout_ms=args.node_timeout_ms)
        cs.start()
        url = cs.seed_url(seeds=args.masters)
        print(url, flush=True)
        up = True
        print("redis_fixtures: cluster up in %.1f s: masters %s, replicas %s, in %s" % (
            cs.startup_seconds, " ".join("%s:%d" % a for a in cs.masters()),
            " ".join("%s:%d" % a for a in cs.replicas()) or "none", cs.workdir),
            file=sys.stderr, flush=True)
        while True:
            signal.pause()
    except _Signalled as e:
        if up:
            return 0
        print("redis_fixtures: cluster: start-up interrupted by %s" % (
            signal.Signals(e.args[0]).name), file=sys.stderr, flush=True)
        return 1
    except Exception as e:  # noqa: BLE001: whatever it is, stderr says it
        print("redis_fixtures: cluster: %s: %s" % (
            "failed" if up else "start-up failed", e), file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cs is not None:
            cs.stop()


if __name__ == "__main__":
    sys.exit(main())
