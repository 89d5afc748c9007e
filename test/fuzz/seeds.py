#!/usr/bin/python3
# Writes the hand-written seed corpora into corpus/<target>/ (run once, from
# anywhere; the files are committed). Regression cases (regress-*) are kept
# by hand and never rewritten here. The record seeds follow record.c's
# layout: "IDR1", u16 status, u8 flags, u32 nheaders, then per header
# u32 name_len, name, u32 value_len, value; all big-endian.
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode("latin-1") if isinstance(data, str) else data)


# fuzz_idemkey: the header value; lines after the first only feed the scope.
for name, v in {
    "bare": "8e03978e-40d5-43e8-bc93-6894a57f9324",
    "bare-symbols": "a!#$%&'*+-.^_`|~:;<=>?@[]{}/",
    "quoted": '"order-1234"',
    "quoted-escapes": r'"a\"b\\c"',
    "max-255": "k" * 255,
    "max-255-quoted": '"' + "q" * 255 + '"',
    "too-long-256": "k" * 256,
    "empty-quoted": '""',
    "unterminated": '"abc',
    "bad-escape": r'"a\nb"',
    "after-quote": '"abc"def',
    "bare-comma": "a,b",
    "space": "a b",
    "8bit": "cl\xe9",
    "scope-lines": "key-1\nBearer abc\n\x01\n",
}.items():
    write("fuzz_idemkey", name, v)

# fuzz_target: selector byte, then "<method> <target>"; selector bit 7: base URL first.
for name, v in {
    "origin": "\x00POST /pay",
    "query": "\x01POST /pay?a=1&b=%20x&c",
    "percent": "\x02PUT /a%2Fb/%E2%82%AC?q=%ZZ",
    "absolute-form": "\x00GET http://other.example/x?y",
    "asterisk": "\x03OPTIONS *",
    "8bit": "\x04POST /caf\xe9/\xff?\x80=1",
    "dot-segments": "\x05GET /a/../b/./c//d",
    "space-ctl": "\x06POST /a b\tc\x7f",
    "empty": "\x07POST ",
    "fragment": "\x00GET /x#frag",
    "own-base": "\x80http://10.0.0.1:81/base\nPATCH /p?x",
    "own-base-noscheme": "\x80host/a/b\nPOST /c",
    # the shapes that once steered a request elsewhere when glued to the base
    "userinfo": "\x00GET @127.0.0.1:6202/x",
    "port-digit": "\x04GET 1/x",
    "host-suffix": "\x05GET .other.example/x",
    "port-colon": "\x04GET :6202/x",
    "double-slash": "\x01GET //127.0.0.1:6202/x",
    "absolute-userinfo": "\x00GET http://u:p@127.0.0.1:6202/x",
    "absolute-https": "\x01POST HTTPS://[::1]:6202?q",
    "connect": "\x00CONNECT 127.0.0.1:6202",
    "asterisk-get": "\x00GET *",
    "backslash": "\x00GET \\\\127.0.0.1\\x",
    "own-base-userinfo": "\x80http://user:pw@h:80/p\nGET /x",
    "own-base-query": "\x80http://h/p?q=1\nGET /x",
    "own-base-no-authority": "\x80http:///api\nGET /x",
}.items():
    write("fuzz_target", name, v)

# fuzz_headers: header blocks as upstreams send them.
write("fuzz_headers", "plain",
      "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
      "Location: /orders/1\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n")
write("fuzz_headers", "connection-listed",
      "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Internal ,x-debug\r\nX-Internal: 1\r\n"
      "X-Debug: yes\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nConnection: Foo\r\n"
      "Foo: bar\r\nVary: Accept\r\n\r\n")
write("fuzz_headers", "interim-1xx",
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
      "HTTP/1.1 200 OK\r\nETag: \"x\"\r\n\r\nTrailer-Field: t\r\n")
write("fuzz_headers", "obs-fold",
      "HTTP/1.1 200 OK\r\nX-Long: first\r\n  continued\r\n\tmore\r\n\r\n")
write("fuzz_headers", "malformed",
      "HTTP/1.1 200 OK\r\n: empty-name\r\nBad Name: x\r\nNoColon\r\nX-Ctl: a\x01b\r\n"
      "X-Cr: a\rb\r\nX-Del: \x7f\r\nX-Nul: a\x00b\r\nX-Empty:\r\nX-Ows:  \t v \t \r\n"
      "X-8bit: caf\xe9\r\n")
write("fuzz_headers", "hop-by-hop",
      "HTTP/1.1 200 OK\nTE: trailers\nTrailer: X\nUpgrade: h2c\nProxy-Authenticate: Basic\n"
      "Proxy-Authorization: x\nProxy-Connection: close\nKEEP-ALIVE: 1\ncontent-length: 0\n"
      "Date: Sun, 22 Nov 2026 03:16:35 GMT\n\n")
write("fuzz_headers", "many", "HTTP/1.1 200 OK\r\n" + "".join("X-H%d: %d\r\n" % (i, i) for i in range(260)))


def record(status, headers, flags=0):
    out = b"IDR1" + struct.pack(">HBI", status, flags, len(headers))
    for n, v in headers:
        out += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
    return out


def record_input(head, body):
    return struct.pack(">I", len(head)) + head + body


write("fuzz_record", "empty-200", record_input(record(200, []), b""))
write("fuzz_record", "created-json", record_input(
    record(201, [(b"Content-Type", b"application/json"), (b"Location", b"/orders/1")]),
    b'{"id":1,"ok":true}'))
write("fuzz_record", "repeats-empty-value", record_input(
    record(200, [(b"Set-Cookie", b"a=1"), (b"Set-Cookie", b"b=2"), (b"X-Empty", b"")]), b"body"))
write("fuzz_record", "too-large", record_input(record(0, [], flags=1), b""))
write("fuzz_record", "sealed", record_input(record(0, [], flags=2), b"IDS1\x01a" + b"n" * 12 + b"c" * 20))
write("fuzz_record", "sealed-with-status", record_input(record(200, [], flags=2), b""))
write("fuzz_record", "sealed-too-large", record_input(record(0, [], flags=3), b""))
write("fuzz_record", "status-599-8bit", record_input(record(599, [(b"X", b"caf\xe9")]), b"\x00\xff"))
write("fuzz_record", "bad-magic", record_input(b"IDR2" + record(200, [])[4:], b""))
write("fuzz_record", "truncated", record_input(record(200, [(b"A", b"bbbb")])[:-2], b""))
write("fuzz_record", "trailing", record_input(record(204, []) + b"x", b""))
write("fuzz_record", "nul-in-name", record_input(record(200, [(b"A\x00B", b"v")]), b""))
write("fuzz_record", "count-too-big", record_input(
    b"IDR1" + struct.pack(">HBI", 200, 0, 0xFFFFFFFF), b""))
write("fuzz_record", "max-headers", record_input(
    record(200, [(b"H%d" % i, b"v") for i in range(256)]), b""))

# fuzz_config: NUL-separated; the first string goes to every value parser.
for name, v in {
    "bytes-1M": "1M",
    "bytes-big": "17179869183G",
    "seconds": "30s",
    "seconds-frac": "0.5",
    "seconds-tiny": "0.0004",
    "bool": "Yes",
    "addr-v4": "127.0.0.1:8080",
    "addr-v6": "[::1]:8080",
    "addr-name": "localhost:80",
    "status-list": "5xx, 429,404",
    "redis-url": "redis://:pw@host:6379/2",
    "redis-user": "redis://user:p%40ss/w@[::1]:7000/15",
    "redis-bad": "redis://host:0/x?y",
    "load-minimal": "x\x00--upstream\x00http://127.0.0.1:3000",
    "load-full": "0\x00--upstream=https://api.example.com/v1/\x00--redis\x00redis://127.0.0.1:6379/1\x00"
                 "--methods\x00post,PUT\x00--scope-header\x00Authorization\x00--scope-header\x00X-Tenant\x00"
                 "--ttl\x000.5\x00--max-ttl\x00100\x00--no-cache-status\x005xx,429\x00--max-body\x001M\x00"
                 "--listen\x00[::1]:8080\x00--log-format\x00json\x00--require-key",
    "load-env": "x\x00IDEMPROXY_UPSTREAM=http://h:1\x00IDEMPROXY_TTL=abc\x00IDEMPOTENCY_ENABLED=off",
    "load-help": "x\x00--key-prefix\x00-h\x00--version\x00--help",
    "load-memory-budget": "x\x00--upstream\x00http://h\x00--memory-max-bytes\x001K\x00--max-response\x001M",
    "load-bad": "x\x00--ttl\x00\x00--upstream\x00ftp://h\x00stray",
}.items():
    write("fuzz_config", name, v)

# fuzz_cluster: the same bytes are a key, a MOVED/ASK error text, and (when
# they start with '*') a CLUSTER SLOTS reply in RESP2, as hiredis reads it.


def resp(v):
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, str):
        v = v.encode("latin-1")
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    return b"*%d\r\n" % len(v) + b"".join(resp(e) for e in v)


for name, v in {
    "key-tag": "{user1000}.following",
    "key-empty-tag": "foo{}{bar}",
    "key-nested-tag": "foo{{bar}}zap",
    "key-binary": "idem:\x00\xff{t}\r\n",
    "moved": "MOVED 3999 127.0.0.1:6381",
    "ask": "ASK 16383 node-2.example:65535",
    "moved-ipv6": "MOVED 1 ::1:7000",
    "moved-ipv6-brackets": "ASK 2 [2001:db8::1]:7001",
    "moved-self": "MOVED 12182 :7000",
    "moved-unknown": "MOVED 1 ?:7000",
    "moved-bad-slot": "MOVED 16384 h:1",
    "moved-bad-port": "MOVED 1 h:65536",
    "moved-overflow": "MOVED 99999999999999999999 h:1",
}.items():
    write("fuzz_cluster", name, v)
write("fuzz_cluster", "slots-three-masters", resp([
    [0, 5460, ["10.0.0.1", 7000, "a" * 40], ["10.0.0.4", 7003, "d" * 40]],
    [5461, 10922, ["10.0.0.2", 7001, "b" * 40]],
    [10923, 16383, ["10.0.0.3", 7002, "c" * 40], ["10.0.0.6", 7005, "f" * 40]]]))
# as redis-server 7.0.15 answers: metadata maps, "" (own address unknown),
# nil (unknown-endpoint), "?" (hostname asked for, none announced)
write("fuzz_cluster", "slots-redis7", resp([
    [0, 2, ["node1.example", 6379, "f5c4784d671c376f20161adda24120146cf1e6a1", ["ip", "10.0.0.1"]]],
    [100, 100, ["", 6380, "id2", ["hostname", "node2.example"]]],
    [200, 300, [None, 6381, "id3", []]],
    [301, 16383, ["?", 6382, "id4", []], ["::1", 6383, "id5", []]]]))
write("fuzz_cluster", "slots-empty", resp([]))
write("fuzz_cluster", "slots-malformed", resp([[5, 4, ["h", 0, "i"]], [0, 16384, [1, "h"]]]))

# fuzz_keysource: the first line is the JSON pointer, the rest the body (and,
# split at '\n', the values of a composite key).
for name, v in {
    "stripe-event": '/id\n{"id":"evt_1NG8Du2eZvKYlo2C","object":"event","type":"charge.succeeded"}',
    "nested": '/data/object/id\n{"data":{"object":{"id":"pi_42","amount":500}},"id":"evt_1"}',
    "array-index": '/items/1/id\n{"items":[{"id":"a"},{"id":"b"},{"id":"c"}]}',
    "array-leading-zero": '/items/01\n{"items":["a","b"]}',
    "array-dash": '/items/-\n{"items":["a"]}',
    "escaped-names": '/a~1b/m~0n/~01\n{"a/b":{"m~n":{"~1":"k","/":"no"}}}',
    "empty-name": '/\n{"":"empty-member"}',
    "integer": '/n\n{"n":-9223372036854775808}',
    "integer-overflow": '/n\n{"n":9223372036854775808}',
    "real": '/n\n{"n":1.5e3}',
    "literals": '/t\n{"t":true,"f":false,"z":null}',
    "whole-string": '\n"abc"',
    "whole-object": '\n{"id":"x"}',
    "no-pointer": '"bare-body"',
    "key-255": '/k\n{"k":"' + "k" * 255 + '"}',
    "key-256": '/k\n{"k":"' + "k" * 256 + '"}',
    "key-escapes": '/k\n{"k":"a\\"b\\\\c\\u0041\\/"}',
    "key-space": '/k\n{"k":"a b"}',
    "key-utf8": '/k\n{"k":"caf\\u00e9 \xc3\xa9"}',
    "nul-escape": '/k\n{"k":"a\\u0000b"}',
    "duplicates": '/id\n{"id":"a","id":"b"}',
    "trailing": '\n{}x',
    "truncated": '/id\n{"id":"ev',
    "bad-pointer": '/a~2\n{"a~2":"x"}',
    "deep": '/0/0/0/0\n' + '[' * 300 + ']' * 300,
    "composite": 'x\n//example.com/source\nA234-1234-1234',
    "composite-bad": 'x\nok\n\na b\n\x7f',
}.items():
    write("fuzz_keysource", name, v)

# fuzz_pg_url: a PostgreSQL URL (and the same bytes as text to escape).
for name, v in {
    "plain": "postgresql://app@db.internal:5432/pay",
    "password": "postgresql://app:s3cret@db/pay?sslpassword=k&password=p",
    "hosts": "postgres://a:1,b:2,[::1]:3/db?target_session_attrs=read-write&port=5432",
    "params": "postgresql:///db?host=/tmp&hostaddr=127.0.0.1&sslmode=verify-full",
    "bad-param": "postgresql://h/db?nosuch=1",
    "encoded": "postgresql://a%40b:p%3Aw@h/d%2Fb",
    "bytes": "postgresql://h/\xff\xfe\x00x?\x7f=\x01",
    "many-hosts": "postgresql://" + ",".join("h%d" % i for i in range(20)) + "/db",
}.items():
    write("fuzz_pg_url", name, v)

# fuzz_request_id: the X-Request-Id values, one a line.
for name, v in {
    "kept": "order-7f3a",
    "symbols": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "max-200": "r" * 200,
    "too-long-201": "r" * 201,
    "space": "a b",
    "tab": "a\tb",
    "nul": "a\x00b",
    "del": "a\x7fb",
    "8bit": "caf\xc3\xa9",
    "two-fields": "one\ntwo",
    "empty": "",
    "crlf": "a\r\nX-Injected: 1",
}.items():
    write("fuzz_request_id", name, v)

# fuzz_seal: a key file, a NUL, then an answer's body (sealed and opened) and
# bytes opened as a stored sealed body.
K1 = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
K2 = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="
for name, v in {
    "one-key": "k1:%s\n\x00{\"card\":\"4242\"}" % K1,
    "rotation": "# new first\nnew:%s\r\n\nold:%s\n\x00body" % (K2, K1),
    "no-colon": "k1 %s\n\x00" % K1,
    "short-key": "k1:%s\n\x00" % K1[:-4],
    "no-padding": "k1:%sA\n\x00" % K1[:-1],
    "twice": "a:%s\na:%s\n\x00" % (K1, K2),
    "bad-id": "a b:%s\n\x00" % K1,
    "long-id": "%s:%s\n\x00" % ("i" * 33, K1),
    "empty": "\x00",
    "comments-only": "# k1:%s\n\x00" % K1,
    "sealed-like": "a:%s\x00IDS1\x01a%s%s" % (K1, "n" * 12, "c" * 40),
    "sealed-bad-id": "a:%s\x00IDS1\x05a\x01\x02\x03\x04%s%s" % (K1, "n" * 12, "c" * 40),
    "sealed-id-too-long": "a:%s\x00IDS1\xffa" % K1,
}.items():
    write("fuzz_seal", name, v)

# fuzz_storage: the storage header's values, one a line (the first is parsed alone).
for name, v in {
    "no-store": "no-store",
    "no-store-case": "No-Store",
    "ttl": "ttl=2592000",
    "ttl-case-ows": " \tTTL=60 ",
    "ttl-zero": "ttl=0",
    "ttl-negative": "ttl=-5",
    "ttl-unit": "ttl=1h",
    "ttl-empty": "ttl=",
    "ttl-huge": "ttl=" + "9" * 40,
    "ttl-edge": "ttl=18446744073709551",
    "ttl-edge-1": "ttl=18446744073709552",
    "two": "no-store\nttl=5",
    "list": "no-store, ttl=5",
    "empty": "",
}.items():
    write("fuzz_storage", name, v)


# fuzz_answer: a flags byte (bit 0: the request was a HEAD; bit 1: a 64-byte
# header limit), a byte that seeds the reads' sizes, then the upstream's bytes.
for name, v in {
    "length": "\x00\x07HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    "length-then-next": "\x00\x05HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
                        "Content-Length: 4\r\n\r\nnext",
    "chunked-trailer": "\x00\x03HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n"
                       "5;ext=1\r\npedia\r\n0\r\nX-Trailer: t\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    "close-delimited": "\x00\x09HTTP/1.0 200 OK\r\nServer: old\r\n\r\nuntil the close",
    "interim-1xx": "\x00\x11HTTP/1.1 100 Continue\r\nX-Early: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                   "Link: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "head": "\x01\x02HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
    "no-content": "\x00\x02HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\nHTTP/1.1 200 OK\r\n",
    "te-and-length": "\x00\x04HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
                     "\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "two-lengths": "\x00\x04HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "obs-fold": "\x00\x06HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n",
    "small-limit": "\x02\x06HTTP/1.1 200 OK\r\nX-Long: " + "v" * 80 + "\r\nContent-Length: 0\r\n\r\n",
    "upgrade": "\x00\x08HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\nraw",
    "hop-by-hop": "\x00\x0aHTTP/1.1 200 OK\r\nConnection: close, X-Drop\r\nKeep-Alive: 5\r\n"
                  "X-Drop: 1\r\nContent-Length: 1\r\n\r\nZ",
}.items():
    write("fuzz_answer", name, v)

# fuzz_canonjson: the first line holds JSON pointers one space apart (to
# remove), the rest is the body; without a '\n' the whole input is the body.
for name, v in {
    "rfc8785-sample": '\n{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
                      '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
                      '"literals": [null, true, false]}',
    "rfc8785-sort": '{"\\u20ac":"Euro","\\r":"CR","\\ufb33":"Dalet","1":"One",'
                    '"\\ud83d\\ude00":"Emoji","\\u0080":"Control","\\u00f6":"o"}',
    "utf16-order": '{"\xee\x80\x80":1,"\xf0\x9f\x98\x80":2,"\\ue000":3}',
    "stripe-charge": '/metadata/nonce /expand/0\n{"amount": 2000, "currency": "usd", '
                     '"source": "tok_visa", "metadata": {"order_id": "6735", "nonce": "n-1"}, '
                     '"expand": ["customer", "invoice"]}',
    "numbers": '[1.0, 1e2, -0, -0.0, 0.1000000000000000055511151231257827, 1e400, 4.9e-324, '
               '100000000000000000000.0, 1e21, 9007199254740993, 1.5e-7, 0e5, 5e-324, '
               '1.7976931348623157e308, 123456789012345678901234567890]',
    "escapes": '"\\b\\t\\n\\f\\r\\"\\\\\\/\\u0000\\u001f\\u007f\\u2028\\uD83D\\uDE00 caf\xc3\xa9"',
    "pointers-escaped": '/a~1b /m~0n / /d/1 /d/01 /d/-\n{"a/b":1,"m~n":2,"":3,"d":[1,2,3],"x":{}}',
    "whole": ' \n{"a":1}',
    "empty-pointer-list": '\n[ ]',
    "deep": "[" * 70 + "]" * 70,
    "duplicates": '{"a":1,"\\u0061":2}',
    "lone-surrogate": '["\\ud800", "\\udc00"]',
    "bad-utf8": '["\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"]',
    "trailing": '{} {}',
    "scalar": '"just a string"',
}.items():
    write("fuzz_canonjson", name, v)


# fuzz_scope: a bearer token; the target's secret MACs the "good" ones.
def _b64(b):
    import base64
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _hs256(header, claims, key=b"fuzzing secret, thirty-two bytes or more"):
    import hashlib
    import hmac
    import json
    signing = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    return signing + "." + _b64(hmac.new(key, signing.encode(), hashlib.sha256).digest())


for name, v in {
    "good": _hs256({"alg": "HS256"}, {"iss": "i", "sub": "a", "exp": 1900000000}),
    "expired": _hs256({"alg": "HS256"}, {"iss": "i", "sub": "a", "exp": 1}),
    "kid": _hs256({"alg": "HS256", "kid": "k"}, {"iss": "i", "sub": {"x": [1, 2]}}),
    "none": _b64(b'{"alg":"none"}') + "." + _b64(b'{"iss":"i","sub":"a"}') + ".",
    "rs256": _hs256({"alg": "RS256"}, {"iss": "i", "sub": "a"}),
    "badsig": _hs256({"alg": "HS256"}, {"iss": "i", "sub": "a"}, b"x" * 40),
    "dup": _b64(b'{"alg":"HS256","alg":"none"}') + ".e30.AAAA",
    "junk": "a.b.c",
}.items():
    write("fuzz_scope", name, v)
