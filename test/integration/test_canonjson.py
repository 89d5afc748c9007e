"""Canonical JSON (src/canonjson.c, doc/configuration.md, "Fingerprint")
against an independent implementation: npm's `canonicalize`, the JavaScript
reference of RFC 8785 by the RFC's author, run by node over the same
documents. The documents are generated (seeded, so a failure replays):
objects, arrays, strings with every kind of character, numbers of every kind,
each written with its members shuffled, whitespace between any two tokens
and its strings escaped anew (\\u escapes in either case, surrogate pairs for
characters past U+FFFF, the short escapes, '\\/').

Numbers: within the agreed domain -- integer literals up to 2^53 and other
literals whose double's shortest text has exactly their value (written as
1.5, 15e-1, 0.150E+1, 150.00e-2, ...) -- the bytes must be `canonicalize`'s.
Outside it canonjson keeps the literal on purpose (integers past 2^53, more
than 17 significant digits, 1e400, 0.1000000000000000055511151231257827):
there the document goes to node with a placeholder string in the number's
place, and our output must be node's with the literal in the placeholder's.

test/canonjson_cli (built beside the binary, in <build>/test) reads the
documents as one batch; node runs once per batch. `canonicalize` is installed
with npm into <build>/npm/canonicalize-<version> once, as test_stripe_sdk.py
installs the Stripe SDK: no node, no npm or no registry is a failure, never a
skip (scripts/test installs nodejs and npm).

No proxy runs here, and no store: the module is pure, so the tests take no
`store` fixture and run once in each pass.
"""
import decimal
import json
import os
import random
import struct
import subprocess

import pytest

from fixtures.npm import npm_install
from fixtures.proxy import IDEMPROXY_BIN

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH_JS = os.path.join(HERE, "canonicalize_batch.js")
CANONICALIZE_VERSION = "2.1.0"
DOCS = 10000
SEED = 8785
PLACEHOLDER = "\x01canonjson-literal-%d\x01"  # \x01 is never in a generated string


# --------------------------------------------------------------------------- the two programs
def build_dir():
    return os.path.dirname(os.path.dirname(os.path.abspath(IDEMPROXY_BIN)))


@pytest.fixture(scope="session")
def canonicalize_dir():
    """The --prefix directory of canonicalize@CANONICALIZE_VERSION, installed once."""
    return npm_install("canonicalize", CANONICALIZE_VERSION, "the canonical JSON cross-check")


def canonicalize(prefix, texts):
    """`canonicalize` of each JSON text of <texts>, by one node process."""
    r = subprocess.run(["node", BATCH_JS, prefix], input=json.dumps(texts).encode(),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, "canonicalize_batch.js failed (%d):\n%s" % (r.returncode,
                                                                        r.stderr.decode()[-3000:])
    out = json.loads(r.stdout.decode("utf-8"))
    assert len(out) == len(texts)
    return out


def canonjson(bodies, pointers=()):
    """canonjson_cli's answer for each body (bytes): its canonical form (str),
    or "EINVAL", "E2BIG", "ENOMEM"."""
    cli = os.path.join(build_dir(), "test", "canonjson_cli")
    assert os.access(cli, os.X_OK), "%s is not built (ninja -C %s)" % (cli, build_dir())
    batch = b"".join(b"%d\n%s" % (len(b), b) for b in bodies)
    r = subprocess.run([cli, "-b"] + list(pointers), input=batch, capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.split(b"\n")  # not splitlines(): U+2028 and \x1c-\x1e are not line ends
    assert lines[-1] == b"" and len(lines) == len(bodies) + 1
    return [line.decode("utf-8") for line in lines[:-1]]


# --------------------------------------------------------------------------- generated documents
# A value is ("object", [(name, value), ...]), ("array", [...]), ("string", s),
# ("literal", "true"), or ("number", literal, kept): kept when canonjson keeps
# the literal where RFC 8785 would print a double.
SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
         "\t": "\\t"}
NAME_PIECES = ["a", "b", "aa", "ab", "", "A", "_", "1", "10", "2", "\xe9", "\u20ac", "\ue000",
               "\uffff", "\U0001f600", "\U0001f601", "\U00010000", "\x7f", "\r", "\x00", "/",
               "~", "\u2028"]


def random_char(rng):
    k = rng.random()
    if k < 0.5:
        return chr(rng.randint(0x20, 0x7e))
    if k < 0.6:
        return rng.choice(['"', "\\", "/", "\x7f", "\u2028", "\u2029", "\ufeff", "\uffff"])
    if k < 0.7:
        return chr(rng.choice([0, *range(2, 0x20)]))  # controls, not \x01 (PLACEHOLDER's)
    if k < 0.8:
        return chr(rng.randint(0x80, 0x7ff))
    if k < 0.9:
        return chr(rng.choice([rng.randint(0x800, 0xd7ff), rng.randint(0xe000, 0xffff)]))
    return chr(rng.randint(0x10000, 0x10ffff))


def random_string(rng):
    return "".join(random_char(rng) for _ in range(rng.choice([0, 1, 2, 5, 12, 30])))


def random_name(rng):
    if rng.random() < 0.3:
        return random_string(rng)
    return "".join(rng.choice(NAME_PIECES) for _ in range(rng.randint(1, 3)))


def digits_of(d):
    """(sign, digits, exponent) of the shortest text of the finite d != 0:
    Python's repr, like ECMAScript's, is the shortest that reads back, the
    nearest among those."""
    t = decimal.Decimal(repr(d)).normalize().as_tuple()
    return t.sign, "".join(map(str, t.digits)), t.exponent


def literal_of(rng, sign, digits, exp):
    """A literal, with a fraction or an exponent, whose value is exactly
    digits * 10^exp: written one of several ways."""
    k = len(digits)
    e = rng.choice("eE")
    pm = lambda n: ("+" if n >= 0 and rng.random() < 0.5 else "") + str(n)  # noqa: E731
    form = rng.randint(0, 3)
    if form == 0:  # d.ddde±x
        body = digits[0] + ("." + digits[1:] if k > 1 else rng.choice(["", ".0"])) \
            + e + pm(exp + k - 1)
    elif form == 1 and -25 < exp + k < 25:  # plain, with trailing zeros
        point = exp + k  # digits before the point
        if point <= 0:
            body = "0." + "0" * -point + digits
        elif point >= k:
            body = digits + "0" * (point - k) + "."
        else:
            body = digits[:point] + "." + digits[point:]
        body += "0" * rng.randint(1 if body.endswith(".") else 0, 3)
    elif form == 2:  # ddd000e±x
        z = rng.randint(0, 3)
        body = digits + "0" * z + e + pm(exp - z)
    else:  # 0.000ddde±x
        z = rng.randint(0, 3)
        body = "0." + "0" * z + digits + e + pm(exp + k + z)
    return ("-" if sign else "") + body


def random_double(rng):
    k = rng.random()
    if k < 0.3:
        while True:
            d = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if d == d and abs(d) != float("inf"):
                return d
    if k < 0.6:
        return round(rng.uniform(-10000, 10000), rng.randint(0, 6))
    if k < 0.8:
        return rng.choice([1.0, -1.0, 0.5, 0.1, 0.2, 0.3, 1e21, 1e-7, 1e-6, 9.999999999999999e20,
                           1e20, 5e-324, -5e-324, 1.7976931348623157e308, 2.2250738585072014e-308,
                           123456789012345680000.0, 1.5e-7, 0.000001, 4.35, 9007199254740992.0,
                           1424953923781206.2, 333333333.3333333, 1e23, 1e22])
    return rng.choice([1, -1]) * 2.0 ** rng.randint(-1074, 1023)


KEPT = ["0.1000000000000000055511151231257827", "1e400", "-1E400", "1e-400", "-7e-500",
        "4.9e-324", "1.7976931348623159e308", "333333333.33333329", "0.3000000000000000444",
        "123456789012345678901234567890.0"]


def random_number(rng):
    """("number", literal, kept)."""
    k = rng.random()
    if k < 0.25:
        return ("number", rng.choice(["0", "-0", str(rng.randint(-10 ** 6, 10 ** 6))]), False)
    if k < 0.35:
        return ("number", str(rng.randint(-2 ** 53, 2 ** 53)), False)
    if k < 0.45:  # integers past 2^53: their digits stay
        n = rng.randint(2 ** 53 + 1, 10 ** rng.randint(17, 40))
        return ("number", rng.choice(["", "-"]) + str(n), True)
    if k < 0.9:
        d = random_double(rng)
        if d == 0:
            return ("number", rng.choice(["0.0", "-0.0", "0e5", "-0E-3", "0.000"]), False)
        return ("number", literal_of(rng, *digits_of(d)), False)
    if k < 0.95:  # more than 17 significant digits
        digits = str(rng.randint(10 ** 17, 10 ** 30)).rstrip("0") + rng.choice("123456789")
        return ("number", literal_of(rng, rng.randint(0, 1), digits, rng.randint(-40, 10)), True)
    return ("number", rng.choice(KEPT), True)


def random_object(rng, depth, sizes=(0, 1, 2, 3, 5, 8)):
    members, seen = [], set()
    for _ in range(rng.choice(sizes)):
        name = random_name(rng)
        if name not in seen:
            seen.add(name)
            members.append((name, random_value(rng, depth + 1)))
    return ("object", members)


def random_value(rng, depth):
    k = rng.random()
    if depth < 5 and k < 0.3:
        return random_object(rng, depth)
    if depth < 5 and k < 0.45:
        return ("array", [random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 4]))])
    if k < 0.65:
        return ("string", random_string(rng))
    if k < 0.95:
        return random_number(rng)
    return ("literal", rng.choice(["true", "false", "null"]))


def random_document(rng):
    if rng.random() < 0.8:
        return random_object(rng, 0, (1, 2, 3, 5, 8, 13))
    return random_value(rng, 0)


def escaped(rng, s):
    """<s> as a JSON string, each character written one of its ways."""
    out = ['"']
    for c in s:
        o = ord(c)
        k = rng.random()
        if o > 0xffff and k < 0.5:
            hi, lo = 0xd800 + ((o - 0x10000) >> 10), 0xdc00 + ((o - 0x10000) & 0x3ff)
            out.append(("\\u%04x\\u%04x" if rng.random() < 0.5 else "\\u%04X\\u%04X") % (hi, lo))
        elif o <= 0xffff and (k < 0.3 or o < 0x20 or c in '"\\'):
            if c in SHORT and rng.random() < 0.6:
                out.append(SHORT[c])
            else:
                out.append(("\\u%04x" if rng.random() < 0.5 else "\\u%04X") % o)
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def ws(rng):
    return rng.choice(["", "", "", " ", "\n", "\t", "\r\n", "  ", " \t "])


def write(rng, v, out, placeholders=None):
    """Appends the text of <v> to <out>: shuffled, re-spaced, re-escaped.
    With <placeholders> (a list), a kept number is written as a placeholder
    string, and its literal appended to the list."""
    kind = v[0]
    out.append(ws(rng))
    if kind == "object":
        members = list(v[1])
        rng.shuffle(members)
        out.append("{")
        for i, (name, value) in enumerate(members):
            out.append((ws(rng) + "," if i else "") + ws(rng) + escaped(rng, name) + ws(rng) + ":")
            write(rng, value, out, placeholders)
        out.append(ws(rng) + "}")
    elif kind == "array":
        out.append("[")
        for i, value in enumerate(v[1]):
            out.append("," if i else "")
            write(rng, value, out, placeholders)
        out.append(ws(rng) + "]")
    elif kind == "string":
        out.append(escaped(rng, v[1]))
    elif kind == "number" and v[2] and placeholders is not None:
        out.append(json.dumps(PLACEHOLDER % len(placeholders)))
        placeholders.append(v[1])
    else:
        out.append(v[1])
    out.append(ws(rng))


def text_of(rng, v, placeholders=None):
    out = []
    write(rng, v, out, placeholders)
    return "".join(out)


def expected(node_form, placeholders):
    """node's form with each placeholder string replaced by its literal."""
    for i, literal in enumerate(placeholders):
        token = json.dumps(PLACEHOLDER % i)  # as canonicalize writes it: \u0001 lowercase
        assert node_form.count(token) == 1, (token, node_form)
        node_form = node_form.replace(token, literal)
    return node_form


def remove(v, pointer):
    """<v> without what the RFC 6901 <pointer> (not "") finds."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    return _remove(v, tokens)


def _remove(v, tokens):
    head, rest = tokens[0], tokens[1:]
    if v[0] == "object":
        items = [(n, x, n == head) for n, x in v[1]]
    elif v[0] == "array" and head.isdigit() and (head == "0" or not head.startswith("0")):
        items = [(None, x, j == int(head)) for j, x in enumerate(v[1])]
    else:
        return v
    out = [(n, _remove(x, rest) if hit else x) for n, x, hit in items if not (hit and not rest)]
    return (v[0], out if v[0] == "object" else [x for _, x in out])


# --------------------------------------------------------------------------- the tests
def cross_check(prefix, docs, pointers=()):
    """Each document written as ours and as node's; both canonical forms
    agree, and ours is its own canonical form. Returns how many numbers of
    each kind were checked."""
    rng = random.Random(SEED + 1)
    bodies, node_texts, kept = [], [], []
    for doc in docs:
        bodies.append(text_of(rng, doc).encode("utf-8"))
        reduced = doc
        for p in pointers:
            reduced = remove(reduced, p)
        placeholders = []
        node_texts.append(text_of(rng, reduced, placeholders))
        kept.append(placeholders)
    ours = canonjson(bodies, pointers)
    theirs = canonicalize(prefix, node_texts)
    bad = [(i, bodies[i], ours[i], expected(theirs[i], kept[i])) for i in range(len(docs))
           if ours[i] != expected(theirs[i], kept[i])]
    assert not bad, "%d of %d differ; the first ones (body, ours, expected):\n%s" % (
        len(bad), len(docs), "\n".join(repr(b) for b in bad[:5]))
    again = canonjson([o.encode("utf-8") for o in ours])
    assert again == ours, "a canonical form that is not its own canonical form"
    return sum(len(k) for k in kept)


def test_canonjson_agrees_with_canonicalize(canonicalize_dir):
    rng = random.Random(SEED)
    docs = [random_document(rng) for _ in range(DOCS)]
    kept = cross_check(canonicalize_dir, docs)
    assert kept > 1000  # the literals kept were checked too, not only the doubles


def test_canonjson_removes_pointers_like_deleting_them(canonicalize_dir):
    rng = random.Random(SEED + 2)
    docs = []
    for _ in range(2000):
        doc = random_document(rng)
        if doc[0] != "object":
            doc = ("object", [("v", doc)])
        members = [m for m in doc[1] if m[0] not in ("nonce", "meta", "items", "a/b")]
        members += [("nonce", ("string", random_string(rng))),
                    ("meta", ("object", [("ts", random_number(rng)),
                                         ("keep", random_value(rng, 3))])),
                    ("items", ("array", [random_value(rng, 3) for _ in range(rng.randint(0, 3))]))]
        if rng.random() < 0.5:
            members.append(("a/b", random_value(rng, 3)))
        docs.append(("object", members))
    cross_check(canonicalize_dir, docs, ["/nonce", "/meta/ts", "/items/0", "/a~1b", "/none/0"])


def test_canonjson_same_document_any_writing_same_bytes():
    rng = random.Random(SEED + 3)
    docs = [random_document(rng) for _ in range(1000)]
    first = canonjson([text_of(rng, d).encode("utf-8") for d in docs])
    second = canonjson([text_of(rng, d).encode("utf-8") for d in docs])
    assert first == second
    assert "EINVAL" not in first


def test_canonjson_refusals_through_the_cli():
    bodies = [b"", b"{", b'{"a":1,"a":2}', b'{"a":1,"\\u0061":2}', b'"\\ud800"', b'"\\udc00x"',
              b'"\xff"', b'"\xed\xa0\x80"', b"[1,]", b"01", b"1.", b"{} []", b"NaN", b"[" * 65 +
              b"]" * 65]
    assert canonjson(bodies) == ["EINVAL"] * len(bodies)
    assert canonjson([b"[" * 64 + b"]" * 64]) == ["[" * 64 + "]" * 64]
