/* SPDX-License-Identifier: MIT */
/* Where a route's keys come from (doc/configuration.md, Key sources), each
 * kind of source with its own name, configuration, extraction, description and
 * domain tag: one header (an Idempotency-Key), a composite of several headers,
 * an RFC 6901 JSON pointer into the body; and a request's own fingerprint as
 * the fallback. Admission (admission.h) asks a source for a key and never
 * looks at its kind. Pure functions, any thread. */
#ifndef IDEMPROXY_KEYSOURCE_H
#define IDEMPROXY_KEYSOURCE_H

#include "idemproxy/common.h"
#include "idemproxy/idemkey.h" /* struct idemkey, IDEMKEY_MAX */

#define KEYSOURCE_MAX_NAMES 32 /* the headers of a composite key */

struct keysource_kind; /* a kind of source: its entry in keysource.c's table */
struct request;

/* A route's key source. All zero is "not given": keysource_set_default()
 * makes it the top level's key header. */
struct keysource {
    const struct keysource_kind *kind;
    char *names[KEYSOURCE_MAX_NAMES]; /* owned: the header, the headers, or the JSON pointer */
    size_t nnames;
    bool fallback; /* fallback: fingerprint: a request without a key is keyed by its fingerprint */
};

/* Sets <name> of a route's `key` mapping on <ks>: a source (header, headers,
 * json) from its value <items>[0] (<is_list> false) or the <n> items of a
 * list, or the fallback. Returns 0; -EINVAL with why in <why> ("key.json:
 * 'id' is not a JSON pointer ...", a second source); -ENOENT for a name that
 * is none of these; -ENOMEM. */
int keysource_set(struct keysource *ks, const char *name, const char *const *items, size_t n,
                  bool is_list, char *why, size_t whylen);

/* A source not given becomes the header <key_header>. Returns 0 or -ENOMEM. */
int keysource_set_default(struct keysource *ks, const char *key_header);

/* The kind of <ks>, as the file names it: "header", "headers" or "json". */
const char *keysource_name(const struct keysource *ks);

/* Frees what <ks> owns; it becomes "not given". NULL-safe, idempotent. */
void keysource_done(struct keysource *ks);

enum keysource_found {
    KEYSOURCE_FOUND,   /* the key is in <ret> */
    KEYSOURCE_MISSING, /* the request carries none */
    KEYSOURCE_INVALID, /* it carries one that is not a key: why, for the client, in <detail> */
    KEYSOURCE_IN_BODY, /* the source reads the body: keysource_read_body() once it is in */
};

/* A request's key, once read. */
struct keysource_key {
    struct span key;  /* the key: borrows the request, <parsed> or <derived> */
    struct span sent; /* for the access line: the header value as sent, or <derived> */
    char *derived;    /* owned: a key not sent as such (composite, JSON, fingerprint): what
                         /keys finds */
    bool fingerprint; /* the request's fingerprint stands for its key (fallback) */
    struct idemkey parsed;
};

/* Reads the key of <rq> from its header section into <ret> (whose spans may
 * borrow <rq>). Returns an enum keysource_found, or -ENOMEM. */
int keysource_read(const struct keysource *ks, const struct request *rq, struct keysource_key *ret,
                   char *detail, size_t detaillen);

/* Reads the key of a source that reads the body from <body>. Returns FOUND,
 * MISSING (no JSON, or nothing at the pointer), INVALID, or -ENOMEM. */
int keysource_read_body(const struct keysource *ks, struct span body, struct keysource_key *ret,
                        char *detail, size_t detaillen);

/* Makes the hex text of the <len> bytes of <digest> (a request's
 * fingerprint) the key in <ret> (fallback). Returns FOUND or -ENOMEM. */
int keysource_fingerprint(const uint8_t *digest, size_t len, struct keysource_key *ret);

/* The domain tag the scope of <k>, read by <ks>, hashes (doc/configuration.md, Key sources: keys of
 * different sources never share a store key); {NULL, 0} for a client's own
 * key header. */
struct span keysource_tag(const struct keysource *ks, const struct keysource_key *k);

/* What the access line shows of a request whose key was not read (not
 * enforced): the key header as sent, for a header source; else nothing. */
struct span keysource_sent(const struct keysource *ks, const struct request *rq);

/* What <ks> asks of a request without a key: the missing_key problem's detail. */
void keysource_describe(const struct keysource *ks, char *out, size_t outlen);

/* Frees what <k> owns. */
void keysource_key_done(struct keysource_key *k);

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

struct json_t;

/* The value at the checked <pointer> in the jansson document <doc>
 * (borrowed from it), or NULL when it finds nothing or on OOM. */
struct json_t *keysource_pointer_find(struct json_t *doc, const char *pointer);

/* A composite key: each of the <n> (1..) values must be 1-IDEMKEY_MAX bytes,
 * each 0x21-0x7E (else -EINVAL); they are joined with one space into a new
 * NUL-terminated heap string in <ret> (the caller frees), its length in
 * <ret_len>. Returns 0, -EINVAL or -ENOMEM; <ret> and <ret_len> untouched on
 * failure. */
int keysource_composite(const struct span *values, size_t n, char **ret, size_t *ret_len);

#endif
