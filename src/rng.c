/* SPDX-License-Identifier: MIT */
/* Random bytes in per-thread blocks of OpenSSL's (rng.h). */
#include "idemproxy/rng.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <string.h>

/* One RAND_bytes() call per RNG_BLOCK bytes handed out: a block serves 32
 * tokens or request ids. Per thread, so no lock. */
#define RNG_BLOCK 512

int rng_bytes(void *out, size_t n)
{
    static _Thread_local unsigned char block[RNG_BLOCK];
    static _Thread_local size_t used = RNG_BLOCK;
    unsigned char *p = out;

    if (n > RNG_BLOCK) /* large draws go straight to OpenSSL */
        return RAND_bytes(p, (int)n) == 1 ? 0 : -EIO;
    if (RNG_BLOCK - used < n) {
        if (RAND_bytes(block, (int)sizeof(block)) != 1)
            return -EIO;
        used = 0;
    }
    memcpy(p, block + used, n);
    OPENSSL_cleanse(block + used, n);
    used += n;
    return 0;
}

int rng_hex(char *out, size_t n)
{
    unsigned char raw[64];

    if (n > sizeof(raw) || rng_bytes(raw, n) < 0)
        return -EIO;
    hex_encode(raw, n, out);
    out[2 * n] = '\0';
    OPENSSL_cleanse(raw, n);
    return 0;
}
