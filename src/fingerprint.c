/* SPDX-License-Identifier: MIT */
/* The framed, incremental SHA-256 of a request (fingerprint.h). */
#include "idemproxy/fingerprint.h"

#include <openssl/evp.h>

#include "idemproxy/digest.h"

/* Feeds <s> after its length, so ("POS", "T/a") and ("POST", "/a") differ. */
static int feed_framed(EVP_MD_CTX *md, struct span s)
{
    uint8_t len[8];

    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)s.len >> (56 - 8 * i));
    if (EVP_DigestUpdate(md, len, sizeof(len)) != 1)
        return -EIO;
    if (s.len > 0 && EVP_DigestUpdate(md, s.base, s.len) != 1)
        return -EIO;
    return 0;
}

int fingerprint_init(struct fingerprint *fp, struct span method, struct span target)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int r;

    if (!md)
        return -ENOMEM;
    if (EVP_DigestInit_ex(md, digest_sha256(), NULL) != 1) {
        r = -EIO;
        goto fail;
    }
    r = feed_framed(md, method);
    if (r < 0)
        goto fail;
    r = feed_framed(md, target);
    if (r < 0)
        goto fail;
    fp->md = md;
    return 0;

fail:
    EVP_MD_CTX_free(md);
    return r;
}

/* The body goes last, unframed: one EVP_DigestUpdate() per MHD chunk, no copy. */
int fingerprint_update(struct fingerprint *fp, const void *p, size_t n)
{
    if (!fp->md)
        return -EIO;
    if (n == 0)
        return 0;
    if (EVP_DigestUpdate(fp->md, p, n) != 1)
        return -EIO;
    return 0;
}

int fingerprint_final(struct fingerprint *fp, uint8_t ret[FINGERPRINT_LEN])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    int r = 0;

    if (!fp->md)
        return -EIO;
    if (EVP_DigestFinal_ex(fp->md, md, &len) != 1 || len != FINGERPRINT_LEN)
        r = -EIO;
    else
        memcpy(ret, md, FINGERPRINT_LEN);
    fingerprint_done(fp);
    return r;
}

void fingerprint_done(struct fingerprint *fp)
{
    if (!fp)
        return;
    EVP_MD_CTX_free(fp->md);
    fp->md = NULL;
}

void fingerprint_hex(const uint8_t fp[FINGERPRINT_LEN], char ret[FINGERPRINT_HEX + 1])
{
    hex_encode(fp, FINGERPRINT_LEN, ret);
}
