/* SPDX-License-Identifier: MIT */
/* Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) for the semantic
 * fingerprint (doc/configuration.md, Fingerprint): a body that says the same thing in other words
 * (members in another order, other whitespace, other escapes, 1.0 for 1)
 * gives the same bytes, and two bodies that say different things never do.
 * Pure functions, any thread. */
#ifndef IDEMPROXY_CANONJSON_H
#define IDEMPROXY_CANONJSON_H

#include "idemproxy/common.h"

struct buf;

/* The deepest nesting canonjson_write() ever accepts, whatever its caller
 * asks: each level is three stack frames of its writer. */
#define CANONJSON_DEPTH_MAX 1000

/* Room for ECMAScript's text of any double and a NUL
 * ("-0.0000033333333333333333" and "-1.7976931348623157e+308" are the
 * longest kinds: 25 and 24 characters). */
#define CANONJSON_DOUBLE_MAX 32

/* Parses <body> as one JSON text and appends its canonical form to <out>,
 * after removing the members and array elements at the <nignore> RFC 6901
 * pointers <ignore>. Returns 0; -EINVAL when <body> is not I-JSON (RFC 7493):
 * not one JSON text (trailing bytes included, an empty body too), invalid
 * UTF-8 (overlong forms and encoded surrogates included), a lone surrogate
 * escape (\ud800 not followed by a low surrogate escape, or \udc00 alone), an
 * object with two members of the same name (compared after unescaping), more
 * than <max_depth> arrays and objects open at once (1 allows [1] but not
 * [[1]]; 0, scalars only; above CANONJSON_DEPTH_MAX it is that), a number
 * that is not JSON's grammar (01, 1., .5, +1, NaN); -E2BIG when <out> would
 * pass its limit (only for an I-JSON body: the walk goes on unwritten to
 * find out), or <body> is 4 GiB or more; -ENOMEM. Noncharacters (U+FFFF,
 * U+FDD0) are accepted, though RFC 7493 §2.1 excludes them: they are text
 * that means one thing. The caller fingerprints the raw body on -EINVAL,
 * whatever <ignore> removes. On failure <out> keeps its length
 * (its capacity may have grown). <body> is read, never written, never past
 * body.len; no NUL is needed.
 *
 * <ignore> pointers are those keysource_pointer_check() accepts (an unchecked
 * one is a caller bug: assert): a token is a member name (~1 is '/', ~0 is
 * '~', names compared byte for byte after unescaping) or, on an array, an
 * index ("0" or a decimal without leading zeros; "-" finds nothing). Every
 * pointer designates a place in the body as received: removing /a/0 and /a/1
 * removes the first two elements of a. A pointer that finds nothing removes
 * nothing; "" removes the whole document (nothing is appended). What is
 * removed must still be I-JSON: the answer does not depend on <ignore>, only
 * the bytes do.
 *
 * The canonical form (RFC 8785 §3.2): no whitespace; object members sorted
 * by their names as arrays of UTF-16 code units (so U+10000, D800 DC00 in
 * UTF-16, sorts before U+E000); strings with the escapes of ECMAScript's
 * JSON.stringify: \b \t \n \f \r \" \\ and \u00xx (lowercase hex) for the
 * other controls below 0x20, everything else as UTF-8, '/', DEL and U+2028
 * included; true, false and null.
 *
 * Numbers (doc/configuration.md, Fingerprint: two different amounts never fingerprint alike, so
 * this is stricter than RFC 8785, which would turn every number into a double):
 * - an integer literal (an optional '-' and digits, no fraction, no
 *   exponent) keeps its digits, however many: 9007199254740993 stays
 *   9007199254740993 (RFC 8785: 9007199254740992). "-0" is "0" (the same
 *   amount, and RFC 8785's answer too).
 * - any other literal is read as the nearest double, and that double's text
 *   as ECMAScript's Number.prototype.toString writes it (the shortest digits
 *   that read back as it, the nearest to it among those; exponent form below
 *   1e-6 and from 1e21: 1e+21, 1.5e-7) is used when, and only when, it has
 *   exactly the literal's decimal value (compared as decimals, never through
 *   the double): 1.0 is 1, 1e2 is 100, 4.50 is 4.5, 2e-3 is 0.002, 1E30 is
 *   1e+30, 100000000000000000000.0 is 100000000000000000000, and -0.0 and
 *   0e7 are 0. Otherwise the literal is kept as written:
 *   0.1000000000000000055511151231257827 (the exact value of the double 0.1,
 *   whose text is 0.1), 333333333.33333329 (read as 333333333.3333333),
 *   1e400 (no double), 4.9e-324 (read as 5e-324), 1E400 too, whose bytes
 *   differ from 1e400's: kept literals are not normalized, so the same amount
 *   written two such ways fingerprints differently, never the reverse.
 *   An integer literal of 22 digits or more stays digits where RFC 8785 would
 *   write 1e+21: 1000000000000000000000 and 1e21 are different bytes.
 *
 * Memory: the body's structure, 8 bytes per value, and 4 bytes per member of
 * the objects being written; time: linear but for the sort of each object's
 * names. Nothing is recursed deeper than <max_depth>. Reads numbers in the
 * "C" locale whatever the thread's is. */
int canonjson_write(struct span body, const char *const *ignore, size_t nignore, size_t max_depth,
                    struct buf *out);

/* Writes ECMAScript's Number.prototype.toString of the finite <d> into <out>
 * with a NUL: the form canonjson_write() gives a non-integer literal whose
 * value it is (RFC 8785 §3.2.2.3). Returns the length (1-25); -EINVAL for a
 * NaN or an infinity (<out> untouched); -ENOMEM when the "C" locale cannot be
 * had. */
int canonjson_format_double(double d, char out[CANONJSON_DOUBLE_MAX]);

#endif
