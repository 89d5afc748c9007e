/* SPDX-License-Identifier: MIT */
/* The request fingerprint: SHA-256 over the method and the raw target, each
 * framed with its length, then the body, fed chunk by chunk as it arrives. */
#ifndef IDEMPROXY_FINGERPRINT_H
#define IDEMPROXY_FINGERPRINT_H

#include "idemproxy/common.h"

struct http_header;

#define FINGERPRINT_LEN 32
#define FINGERPRINT_HEX (2 * FINGERPRINT_LEN)

struct fingerprint {
    void *md; /* owned EVP_MD_CTX; NULL when not started */
};

/* Starts a fingerprint of <method> and <target> in <fp> (which must be zeroed
 * or done). Returns 0, -ENOMEM or -EIO. */
int fingerprint_init(struct fingerprint *fp, struct span method, struct span target);

/* Feeds the header field <name> as the <n> <fields> of a request have it
 * (names compared case-insensitively; none: absent): the values, in order,
 * each trimmed of spaces and tabs, joined with ", " (two fields are the one
 * field that lists both, as in HTTP), framed with its length after whether
 * it is present, so that absent and empty differ. Call after init, before
 * the body. Returns 0 or -EIO. */
int fingerprint_add_field(struct fingerprint *fp, struct span name,
                          const struct http_header *fields, size_t n);

/* Writes <target> with the parameters of its query sorted (by name, then
 * the whole parameter, bytes as received, '&'-separated; the path and each
 * parameter unchanged) into the new string <ret> (NUL-terminated, the
 * caller frees it) of <ret_len> bytes. Returns 0 or -ENOMEM. */
int fingerprint_sort_query(struct span target, char **ret, size_t *ret_len);

/* Feeds <n> body bytes at <p>. Returns 0 or -EIO. */
int fingerprint_update(struct fingerprint *fp, const void *p, size_t n);

/* Finishes the digest into <ret> and releases the context. Returns 0 or -EIO. */
int fingerprint_final(struct fingerprint *fp, uint8_t ret[FINGERPRINT_LEN]);

/* Releases the context if any. NULL-safe, may be called after final. */
void fingerprint_done(struct fingerprint *fp);

/* Writes <fp> as 64 lowercase hex characters and a NUL into <ret>. */
void fingerprint_hex(const uint8_t fp[FINGERPRINT_LEN], char ret[FINGERPRINT_HEX + 1]);

#endif
