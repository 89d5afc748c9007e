"""Encryption at rest (doc/configuration.md, Encryption at rest):
--store-encryption-key-file seals every stored answer with AES-256-GCM, its
store key as associated data. The store is read directly: Redis's hashes,
PostgreSQL's rows (the memory store's records are checked in
test_pipeline.c, which reads the store itself)."""
import base64
import json
import os

from fixtures.client import REPLAY, end_to_end, hone, http_request, new_key
from fixtures.marks import shared_store, store_independent
from fixtures.probes import redis_keys
from fixtures.proxy import run_binary
from fixtures.waiting import wait_for

SECRET_BODY = b'{"card": "4111-SECRET-BODY-7f3a", "name": "Ada Lovelace"}'
SECRET_HEADER = "tok_SECRET_HEADER_9c2e"
CLEAR_BITS = (b"SECRET", b"Lovelace", b"Set-Cookie", b"tok_", b"application/json")


def new_secret():
    return base64.b64encode(os.urandom(32)).decode()


def key_file(tmp_path, *lines, name="store-keys", mode=0o600):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    path.chmod(mode)
    return str(path)


def answer_target():
    """An upstream answer that carries the secrets in its header and body."""
    return "/answer?h=Set-Cookie:session=%s&h=X-Token:%s" % (SECRET_HEADER, SECRET_HEADER)


def execute(p, key, body=SECRET_BODY):
    st, h, b = p.request("POST", answer_target(), [("Idempotency-Key", key)], body)
    assert st == 201 and hone(h, REPLAY) == "false", (st, h, b)
    return st, h, b


def stored_bytes(p):
    """Everything the store holds: every Redis hash field and string (a
    tombstone, a resource link), every PostgreSQL column."""
    out = []
    if p.store == "redis":
        for k in p.rdb.scan_iter(count=1000):
            out.append(k)
            if p.rdb.type(k) == b"string":
                out.append(p.rdb.get(k))
                continue
            for f, v in p.rdb.hgetall(k).items():
                out += [f, v]
    else:
        for row in p.pg.sql("SELECT * FROM idemproxy_keys"):
            out += [bytes(c) if isinstance(c, memoryview) else str(c).encode() for c in row]
    return b"\0".join(out)


def stored_field(p, key, field):
    """The bytes of a completed key's column (head, body) on Redis or PostgreSQL."""
    if p.store == "redis":
        (k,) = redis_keys(p.rdb, key)
        return p.rdb.hget(k, field), k
    (row,) = p.pg.sql("SELECT key, %s FROM idemproxy_keys WHERE key LIKE %%s" % field,
                      ("%:" + key,))
    return bytes(row[1]), row[0]


def set_stored_field(p, store_key, field, value):
    if p.store == "redis":
        p.rdb.hset(store_key, field, value)
    else:
        p.pg.sql("UPDATE idemproxy_keys SET %s = %%s WHERE key = %%s" % field, (value, store_key))


def key_id(p, key):
    st, _, b = p.admin_request("GET", "/keys/" + key)
    assert st == 200, b
    (rec,) = json.loads(b)["records"]
    return rec.get("key_id"), rec


def refused_unreadable(p, upstream, key, before):
    """A duplicate of <key> gets 503 store_unavailable, and nothing runs again."""
    st, h, b = p.request("POST", answer_target(), [("Idempotency-Key", key)], SECRET_BODY)
    assert st == 503, (st, b)
    assert json.loads(b)["code"] == "store_unavailable"
    assert hone(h, REPLAY) is None
    assert upstream.hits("/answer") == before
    return b


def test_sealed_answers_replay_byte_for_byte(proxy, upstream, tmp_path):
    """Every store: the replay is the answer, byte for byte; /keys opens it."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()))
    key = new_key()
    st, h, b = execute(p, key)
    st2, h2, b2 = p.request("POST", answer_target(), [("Idempotency-Key", key)], SECRET_BODY)
    assert (st2, end_to_end(h2), b2) == (st, end_to_end(h), b)
    assert hone(h2, REPLAY) == "true" and b2 == SECRET_BODY
    assert upstream.hits("/answer") == 1
    kid, rec = key_id(p, key)
    assert kid == "k1" and rec["status"] == 201 and "unreadable" not in rec
    st, _, body = p.admin_request("GET", "/keys/%s?body=1" % key)
    (rec,) = json.loads(body)["records"]
    assert base64.b64decode(rec["body_base64"]) == SECRET_BODY
    assert ["X-Token", SECRET_HEADER] in rec["headers"]
    assert "sealed with AES-256-GCM under key 'k1'" in p.wait_log("sealed with AES-256-GCM")


@shared_store
def test_holds_no_answer_in_clear_shared_redis(proxy, upstream, tmp_path):
    """Redis and PostgreSQL, read directly: no byte of the answer's distinctive
    header or body values, nor a header name, is there in clear; a too-large
    marker is sealed too."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()),
              "--max-response", "32")
    key = new_key()
    execute(p, key, body=b'{"n": "SECRET"}')
    big = new_key()
    st, _, _ = p.request("POST", answer_target(), [("Idempotency-Key", big)], SECRET_BODY)
    assert st == 201
    dump = stored_bytes(p)
    assert key.encode() in dump and big.encode() in dump  # keys stay readable for /keys
    for bit in CLEAR_BITS:
        assert bit not in dump, bit
    head, _ = stored_field(p, key, "head")
    assert head == b"IDR1\x00\x00\x02\x00\x00\x00\x00"  # no status, no header: sealed
    st, _, b = p.request("POST", answer_target(), [("Idempotency-Key", big)], SECRET_BODY)
    assert st == 502 and json.loads(b)["code"] == "response_too_large"


@shared_store
def test_rotation_shared_redis(proxy, upstream, tmp_path):
    """Rotation: a new first line seals, an old line still opens; once it is
    gone, what it sealed no longer opens (503, not run again)."""
    k1, k2 = "2026-10:" + new_secret(), "2026-11:" + new_secret()
    path = key_file(tmp_path, k1)
    p = proxy("--store-encryption-key-file", path)
    old = new_key()
    execute(p, old)
    key_file(tmp_path, k2, k1)
    p.restart()
    st, h, _ = p.request("POST", answer_target(), [("Idempotency-Key", old)], SECRET_BODY)
    assert st == 201 and hone(h, REPLAY) == "true"
    new = new_key()
    execute(p, new)
    assert key_id(p, old)[0] == "2026-10" and key_id(p, new)[0] == "2026-11"
    key_file(tmp_path, k2)
    p.restart()
    st, h, _ = p.request("POST", answer_target(), [("Idempotency-Key", new)], SECRET_BODY)
    assert st == 201 and hone(h, REPLAY) == "true"
    refused_unreadable(p, upstream, old, before=2)
    kid, rec = key_id(p, old)
    assert kid == "2026-10" and "does not list" in rec["unreadable"] and "status" not in rec
    wait_for(lambda: "its stored answer does not open" in p.stderr(), what="the log line")
    assert "key id 2026-10" in p.stderr()


@shared_store
def test_tampered_record_refused_shared_redis(proxy, upstream, tmp_path):
    """One flipped byte of a sealed answer: 503, logged, never replayed and
    never run again."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()))
    key = new_key()
    execute(p, key)
    body, store_key = stored_field(p, key, "body")
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    set_stored_field(p, store_key, "body", bytes(flipped))
    refused_unreadable(p, upstream, key, before=1)
    refused_unreadable(p, upstream, key, before=1)
    wait_for(lambda: "its tag does not verify" in p.stderr(), what="the log line")
    assert "(key id k1); answered 503, neither replayed nor run again" in p.stderr()


@shared_store
def test_unreadable_record_refused_even_with_passthrough_shared_redis(proxy, upstream, tmp_path):
    """--on-store-error passthrough forwards a request the store cannot
    serve; an answer that does not open is not that: its request ran, so it
    gets 503 and is never forwarded again."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()),
              "--on-store-error", "passthrough")
    key = new_key()
    execute(p, key)
    body, store_key = stored_field(p, key, "body")
    flipped = bytearray(body)
    flipped[-1] ^= 0x01
    set_stored_field(p, store_key, "body", bytes(flipped))
    refused_unreadable(p, upstream, key, before=1)
    refused_unreadable(p, upstream, key, before=1)


@shared_store
def test_record_copied_to_another_key_refused_shared_redis(proxy, upstream, tmp_path):
    """A sealed answer moved under another key (same fingerprint, so that it
    would replay) does not open there: the store key is its associated data."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()))
    a, b = new_key(), new_key()
    execute(p, a, body=b'{"n": 1}')
    execute(p, b, body=b'{"n": 1}')
    body_a, _ = stored_field(p, a, "body")
    _, store_key_b = stored_field(p, b, "body")
    set_stored_field(p, store_key_b, "body", body_a)
    st, h, got = p.request("POST", answer_target(), [("Idempotency-Key", b)], b'{"n": 1}')
    assert st == 503 and json.loads(got)["code"] == "store_unavailable", (st, got)
    assert upstream.hits("/answer") == 2
    st, h, _ = p.request("POST", answer_target(), [("Idempotency-Key", a)], b'{"n": 1}')
    assert st == 201 and hone(h, REPLAY) == "true"


@shared_store
def test_clear_and_sealed_do_not_mix_shared_redis(proxy, upstream, tmp_path):
    """An answer stored in clear is not replayed once answers are sealed (a
    clear record could be forged), and a sealed one not without the keys:
    503 both ways, nothing runs twice."""
    path = key_file(tmp_path, "k1:" + new_secret())
    p = proxy()
    clear = new_key()
    execute(p, clear)
    p.stop()
    q = proxy("--store-encryption-key-file", path)
    refused_unreadable(q, upstream, clear, before=1)
    sealed = new_key()
    execute(q, sealed)
    q.stop()
    r = proxy()
    refused_unreadable(r, upstream, sealed, before=2)
    wait_for(lambda: "there is no --store-encryption-key-file" in r.stderr(), what="the log")


def test_operator_answer_is_sealed(proxy, upstream, tmp_path):
    """PUT /keys (an operator resolving an unknown key) stores a sealed answer
    that replays."""
    p = proxy("--store-encryption-key-file", key_file(tmp_path, "k1:" + new_secret()),
              "--upstream-timeout", "0.3", "--upstream-late-timeout", "0")
    key = new_key()
    st, _, _ = p.request("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"x")
    assert st == 504
    _, rec = key_id(p, key)
    body = json.dumps({"status": 201, "headers": [["X-Token", SECRET_HEADER]],
                       "body": "resolved"}).encode()
    st, _, b = http_request("127.0.0.1", p.admin_port, "PUT",
                            "/keys/%s?scope=%s" % (key, rec["scope"]), None, body)
    assert st == 200, b
    st, h, b = p.request("POST", "/slow?ms=1500", [("Idempotency-Key", key)], b"x")
    assert (st, b, hone(h, "X-Token"), hone(h, REPLAY)) == (201, b"resolved", SECRET_HEADER, "true")
    assert key_id(p, key)[0] == "k1"


def test_bad_key_file_refused_at_start(tmp_path, upstream):
    """A key file that cannot be used stops start-up (and --check-config)
    with exit 2, naming the option, the file and the line, never a key."""
    secret = new_secret()
    cases = [
        (["k1 " + secret], "line 1: not ID:KEY"),
        (["k1:" + secret[:-2]], "line 1: the key is not 32 bytes in base64"),
        (["# nothing"], "holds no key"),
        (["a:" + secret, "a:" + new_secret()], "line 2: the key id 'a' is given twice"),
        (["bad id:" + secret], "letters, digits"),
    ]
    for i, (lines, says) in enumerate(cases):
        path = key_file(tmp_path, *lines, name="keys%d" % i)
        for extra in ([], ["--check-config"]):
            r = run_binary(["--upstream", upstream.url, "--store-encryption-key-file", path]
                           + extra)
            err = r.stderr.decode() + r.stdout.decode()
            assert r.returncode == 2, (lines, err)
            assert "--store-encryption-key-file" in err and path in err and says in err, err
            assert secret[:20] not in err
    r = run_binary(["--upstream", upstream.url, "--store-encryption-key-file",
                    str(tmp_path / "missing")])
    assert r.returncode == 2 and "--store-encryption-key-file" in r.stderr.decode()


@store_independent
def test_key_file_readable_by_others_is_warned(proxy, tmp_path):
    p = proxy("--store-encryption-key-file",
              key_file(tmp_path, "k1:" + new_secret(), mode=0o644))
    assert "may be read by others (mode 0644)" in p.wait_log("may be read by others")
