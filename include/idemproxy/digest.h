/* SPDX-License-Identifier: MIT */
/* SHA-256 as OpenSSL's default provider gives it, fetched once for the
 * process: EVP_DigestInit_ex() with EVP_sha256() fetches it again on every
 * call (a lookup under a lock, on every request's fingerprint and scope).
 * Base module: any thread. */
#ifndef IDEMPROXY_DIGEST_H
#define IDEMPROXY_DIGEST_H

#include <openssl/evp.h>

/* The digest, fetched on first use and kept until the process exits; NULL
 * if the provider has none (then EVP_DigestInit_ex() fails, as it would). */
const EVP_MD *digest_sha256(void);

#endif
