/* SPDX-License-Identifier: MIT */
#include <openssl/rand.h>

#include "idemproxy/store.h"

int store_token_new(struct store_token *ret)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[STORE_TOKEN_HEX / 2];
    struct store_token t;

    if (RAND_bytes(raw, (int)sizeof(raw)) != 1)
        return -EIO;
    for (size_t i = 0; i < sizeof(raw); i++) {
        t.hex[2 * i] = hex[raw[i] >> 4];
        t.hex[2 * i + 1] = hex[raw[i] & 0xf];
    }
    t.hex[STORE_TOKEN_HEX] = '\0';
    *ret = t;
    return 0;
}
