/* SPDX-License-Identifier: MIT */
/* The request fingerprint: SHA-256 over the method and the raw target, each
 * framed with its length, then the body, fed chunk by chunk as it arrives. */
#ifndef IDEMPROXY_FINGERPRINT_H
#define IDEMPROXY_FINGERPRINT_H

#include "idemproxy/common.h"

#define FINGERPRINT_LEN 32
#define FINGERPRINT_HEX (2 * FINGERPRINT_LEN)

struct fingerprint {
    void *md; /* owned EVP_MD_CTX; NULL when not started */
};

/* Starts a fingerprint of <method> and <target> in <fp> (which must be zeroed
 * or done). Returns 0, -ENOMEM or -EIO. */
int fingerprint_init(struct fingerprint *fp, struct span method, struct span target);

/* Feeds <n> body bytes at <p>. Returns 0 or -EIO. */
int fingerprint_update(struct fingerprint *fp, const void *p, size_t n);

/* Finishes the digest into <ret> and releases the context. Returns 0 or -EIO. */
int fingerprint_final(struct fingerprint *fp, uint8_t ret[FINGERPRINT_LEN]);

/* Releases the context if any. NULL-safe, may be called after final. */
void fingerprint_done(struct fingerprint *fp);

/* Writes <fp> as 64 lowercase hex characters and a NUL into <ret>. */
void fingerprint_hex(const uint8_t fp[FINGERPRINT_LEN], char ret[FINGERPRINT_HEX + 1]);

#endif
