/* SPDX-License-Identifier: MIT */
/* Keys taken from somewhere other than the Idempotency-Key header, for a
 * route's `key` source (SPEC §6): an RFC 6901 JSON pointer into the body, and
 * composite keys from several header values. Pure functions, any thread. */
#ifndef IDEMPROXY_KEYSOURCE_H
#define IDEMPROXY_KEYSOURCE_H

#include "idemproxy/common.h"
#include "idemproxy/idemkey.h" /* struct idemkey, IDEMKEY_MAX */

/* Checks an RFC 6901 JSON pointer as a config file gives it: "" (the whole
 * document) or '/'-separated reference tokens where '~' is only followed by
 * '0' or '1'. Returns 0 or -EINVAL. */
int keysource_pointer_check(const char *pointer);

/* The key at <pointer> (already checked) in the JSON text <body>: a string of
 * 1-IDEMKEY_MAX bytes, each 0x21-0x7E, is the key; an integer is the key as its
 * decimal text (e.g. -12, 9007199254740993; jansson's json_int_t). Returns 0
 * with the key in <ret>; -ENOENT when <body> is not one JSON text (jansson
 * refuses it, including duplicate object keys: JSON_REJECT_DUPLICATES, and
 * trailing bytes) or the pointer finds nothing; -EINVAL when it finds
 * another type (real, true/false/null, object, array) or a string that is
 * not a valid key; -ENOMEM. <ret> untouched on failure. Never reads past
 * body.len (use json_loadb) and never modifies <body>. An unchecked <pointer>
 * is a caller bug (assert).
 *
 * The body may be any JSON value, not only an object or array
 * (JSON_DECODE_ANY): a bare "abc" with the pointer "" is the key abc. As
 * jansson decodes without JSON_ALLOW_NUL, a body holding \u0000 anywhere is
 * refused (-ENOENT), and so is an integer outside json_int_t (jansson calls
 * it an overflow). A pointer token on an array is an index: "0" or a decimal
 * without leading zeros below the size ("-" finds nothing). */
int keysource_json(struct span body, const char *pointer, struct idemkey *ret);

/* A composite key: each of the <n> (1..) values must be 1-IDEMKEY_MAX bytes,
 * each 0x21-0x7E (else -EINVAL); they are joined with one space into a new
 * NUL-terminated heap string in <ret> (the caller frees), its length in
 * <ret_len>. Returns 0, -EINVAL or -ENOMEM; <ret> and <ret_len> untouched on
 * failure. */
int keysource_composite(const struct span *values, size_t n, char **ret, size_t *ret_len);

#endif
