/* SPDX-License-Identifier: MIT */
/* Random bytes for what must not be guessed (fencing tokens, request ids,
 * nonces, hash seeds): OpenSSL's generator, drawn in blocks per thread so
 * that a request costs no RAND_bytes() call of its own; each byte is wiped
 * from the block as it is handed out. Any thread. */
#ifndef IDEMPROXY_RNG_H
#define IDEMPROXY_RNG_H

#include "idemproxy/common.h"

/* Fills the <n> bytes at <out> with random bytes. Returns 0, or -EIO when
 * OpenSSL's generator fails (<out> then untouched). */
int rng_bytes(void *out, size_t n);

/* Writes <n> random bytes as 2 * <n> lowercase hex digits and a NUL into
 * <out>. Returns 0 or -EIO. */
int rng_hex(char *out, size_t n);

#endif
