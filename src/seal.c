/* SPDX-License-Identifier: MIT */
/* Sealed records: the key file, and AES-256-GCM through OpenSSL's EVP.
 *
 * A sealed record's body, all integers big-endian:
 *   "IDS1", u8 id_len, id, 12-byte nonce,         -- the header
 *   AES-256-GCM( u32 head_len, head, body ),      -- head: record_encode_head()
 *   16-byte tag over the header, the store key and the ciphertext.
 * The header and the store key are the associated data: a record moved to
 * another key, or given another key id, does not open. */
#include "idemproxy/seal.h"

#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/record.h"
#include "idemproxy/rng.h"

#define SEAL_MAGIC "IDS1"
#define SEAL_MAGIC_LEN 4
#define SEAL_NONCE_BYTES 12
#define SEAL_TAG_BYTES 16
#define SEAL_B64_LEN 44       /* 32 bytes: 43 characters and one '=' */
#define SEAL_CHUNK (1u << 30) /* EVP takes an int length */

/* ---- The key file ---- */

static bool is_id_byte(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

static bool is_b64_byte(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/';
}

/* Decodes the 44 base64 characters at <s> into 32 bytes. */
static bool decode_key(struct span s, unsigned char key[SEAL_KEY_BYTES])
{
    unsigned char out[SEAL_B64_LEN / 4 * 3];

    if (s.len != SEAL_B64_LEN || s.base[SEAL_B64_LEN - 1] != '=')
        return false;
    for (size_t i = 0; i + 1 < SEAL_B64_LEN; i++) {
        if (!is_b64_byte(s.base[i]))
            return false;
    }
    /* 44 characters decode to 33 bytes, the last being the padding's. */
    if (EVP_DecodeBlock(out, (const unsigned char *)s.base, SEAL_B64_LEN) != (int)sizeof(out)) {
        OPENSSL_cleanse(out, sizeof(out));
        return false;
    }
    memcpy(key, out, SEAL_KEY_BYTES);
    OPENSSL_cleanse(out, sizeof(out));
    return true;
}

/* Parses the line <line> (number <no>) into <k>'s next key. */
static int parse_line(struct seal_keys *k, struct span line, unsigned no, char *why, size_t why_len)
{
    const char *colon = memchr(line.base, ':', line.len);
    struct seal_key *key = &k->keys[k->n];
    size_t id_len = colon ? (size_t)(colon - line.base) : 0;

    if (!colon) {
        snprintf(why, why_len, "line %u: not ID:KEY (no ':')", no);
        return -EINVAL;
    }
    if (id_len == 0 || id_len > SEAL_ID_MAX) {
        snprintf(why, why_len, "line %u: the key id is %s (1 to %d characters)", no,
                 id_len ? "too long" : "empty", SEAL_ID_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i < id_len; i++) {
        if (!is_id_byte(line.base[i])) {
            snprintf(why, why_len,
                     "line %u: the key id may hold letters, digits, '.', '_' and '-' only", no);
            return -EINVAL;
        }
    }
    if (!decode_key((struct span){ colon + 1, line.len - id_len - 1 }, key->key)) {
        snprintf(why, why_len,
                 "line %u: the key is not 32 bytes in base64 (44 characters, as `openssl rand "
                 "-base64 32` prints)",
                 no);
        return -EINVAL;
    }
    memcpy(key->id, line.base, id_len);
    key->id[id_len] = '\0';
    for (size_t i = 0; i < k->n; i++) {
        if (!strcmp(k->keys[i].id, key->id)) {
            snprintf(why, why_len, "line %u: the key id '%s' is given twice", no, key->id);
            OPENSSL_cleanse(key, sizeof(*key));
            return -EINVAL;
        }
    }
    k->n++;
    return 0;
}

int seal_keys_parse(struct span text, struct seal_keys **ret, char *why, size_t why_len)
{
    struct seal_keys *k;
    unsigned no = 0;
    int err = 0;

    if (text.len > SEAL_FILE_MAX) {
        snprintf(why, why_len, "larger than %d bytes", SEAL_FILE_MAX);
        return -EINVAL;
    }
    k = calloc(1, sizeof(*k));
    if (!k || !(k->keys = calloc(SEAL_KEYS_MAX, sizeof(*k->keys))) ||
        !(k->aead = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL))) {
        seal_keys_free(k);
        return -ENOMEM;
    }
    for (size_t at = 0; at < text.len && err == 0;) {
        const char *nl = memchr(text.base + at, '\n', text.len - at);
        struct span line = { text.base + at, nl ? (size_t)(nl - text.base) - at : text.len - at };

        at += line.len + (nl ? 1 : 0);
        no++;
        if (line.len && line.base[line.len - 1] == '\r')
            line.len--;
        if (line.len == 0 || line.base[0] == '#')
            continue;
        if (k->n == SEAL_KEYS_MAX) {
            snprintf(why, why_len, "line %u: more than %d keys", no, SEAL_KEYS_MAX);
            err = -EINVAL;
        } else {
            err = parse_line(k, line, no, why, why_len);
        }
    }
    if (err == 0 && k->n == 0) {
        snprintf(why, why_len, "holds no key (lines of ID:KEY, the first one seals)");
        err = -EINVAL;
    }
    if (err < 0) {
        seal_keys_free(k);
        return err;
    }
    *ret = k;
    return 0;
}

int seal_keys_load(const char *path, struct seal_keys **ret, char *why, size_t why_len)
{
    char *text = NULL, inner[256];
    struct stat sb;
    ssize_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC), err;

    if (fd < 0 || fstat(fd, &sb) < 0) {
        snprintf(why, why_len, "%s: cannot read it: %s", path, strerror(errno));
        err = -EINVAL;
        goto out;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size > SEAL_FILE_MAX) {
        snprintf(why, why_len, "%s: %s", path,
                 S_ISREG(sb.st_mode) ? "larger than a key file can be" : "not a file");
        err = -EINVAL;
        goto out;
    }
    text = malloc((size_t)sb.st_size + 1);
    if (!text) {
        err = -ENOMEM;
        goto out;
    }
    n = read(fd, text, (size_t)sb.st_size + 1);
    if (n < 0 || n > sb.st_size) {
        snprintf(why, why_len, "%s: cannot read it: %s", path,
                 n < 0 ? strerror(errno) : "it grew while read");
        err = -EINVAL;
        goto out;
    }
    err = seal_keys_parse((struct span){ text, (size_t)n }, ret, inner, sizeof(inner));
    if (err == -EINVAL)
        snprintf(why, why_len, "%s: %s", path, inner);
out:
    if (text) {
        OPENSSL_cleanse(text, (size_t)sb.st_size + 1);
        free(text);
    }
    if (fd >= 0)
        close(fd);
    return err;
}

void seal_keys_free(struct seal_keys *k)
{
    if (!k)
        return;
    if (k->keys) {
        OPENSSL_cleanse(k->keys, SEAL_KEYS_MAX * sizeof(*k->keys));
        free(k->keys);
    }
    EVP_CIPHER_free(k->aead);
    free(k);
}

/* ---- Sealing ---- */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Feeds <len> bytes at <in> through <c>, the output at <out>. */
static bool crypt_update(EVP_CIPHER_CTX *c, bool enc, unsigned char *out, const void *in,
                         size_t len)
{
    const unsigned char *p = in;

    while (len) {
        int n = (int)(len < SEAL_CHUNK ? len : SEAL_CHUNK), outl;

        if ((enc ? EVP_EncryptUpdate(c, out, &outl, p, n)
                 : EVP_DecryptUpdate(c, out, &outl, p, n)) != 1 ||
            outl != n)
            return false;
        p += n, len -= (size_t)n;
        if (out)
            out += n;
    }
    return true;
}

/* Starts <c> with the cipher of <k> for the key <key> and the nonce at
 * <nonce>, and feeds the associated data: the header <hdr> and the store key. */
static bool crypt_start(EVP_CIPHER_CTX *c, const struct seal_keys *k, bool enc,
                        const unsigned char *key, const unsigned char *nonce, struct span hdr,
                        struct span store_key)
{
    if ((enc ? EVP_EncryptInit_ex(c, k->aead, NULL, key, nonce)
             : EVP_DecryptInit_ex(c, k->aead, NULL, key, nonce)) != 1)
        return false;
    return crypt_update(c, enc, NULL, hdr.base, hdr.len) &&
           crypt_update(c, enc, NULL, store_key.base, store_key.len);
}

int seal_record(const struct seal_keys *k, struct span store_key, const struct record *rec,
                struct record **ret)
{
    const struct seal_key *key = &k->keys[0];
    size_t id_len = strlen(key->id), hdr_len = SEAL_MAGIC_LEN + 1 + id_len + SEAL_NONCE_BYTES;
    struct buf head = BUF_INIT(SIZE_MAX);
    EVP_CIPHER_CTX *c = NULL;
    struct record *sealed = NULL;
    unsigned char *p, len4[4];
    size_t plain_len;
    int err, outl;

    err = record_encode_head(rec, &head);
    if (err < 0)
        goto out;
    err = -E2BIG;
    if (head.len > UINT32_MAX || rec->body.len > SIZE_MAX / 2)
        goto out;
    plain_len = 4 + head.len + rec->body.len;
    err = -ENOMEM;
    sealed = record_new(hdr_len + plain_len + SEAL_TAG_BYTES);
    c = EVP_CIPHER_CTX_new();
    if (!sealed || !c || buf_reserve(&sealed->body, hdr_len + plain_len + SEAL_TAG_BYTES) < 0)
        goto out;
    p = (unsigned char *)sealed->body.data;
    memcpy(p, SEAL_MAGIC, SEAL_MAGIC_LEN);
    p[SEAL_MAGIC_LEN] = (unsigned char)id_len;
    memcpy(p + SEAL_MAGIC_LEN + 1, key->id, id_len);
    err = -EIO;
    if (rng_bytes(p + hdr_len - SEAL_NONCE_BYTES, SEAL_NONCE_BYTES) < 0)
        goto out;
    put_u32(len4, (uint32_t)head.len);
    p += hdr_len;
    if (!crypt_start(c, k, true, key->key, p - SEAL_NONCE_BYTES,
                     (struct span){ sealed->body.data, hdr_len }, store_key) ||
        !crypt_update(c, true, p, len4, 4) || !crypt_update(c, true, p + 4, head.data, head.len) ||
        !crypt_update(c, true, p + 4 + head.len, rec->body.data, rec->body.len) ||
        EVP_EncryptFinal_ex(c, p + plain_len, &outl) != 1 || outl != 0 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_BYTES, p + plain_len) != 1)
        goto out;
    sealed->body.len = hdr_len + plain_len + SEAL_TAG_BYTES;
    sealed->sealed = true;
    *ret = sealed;
    sealed = NULL;
    err = 0;
out:
    EVP_CIPHER_CTX_free(c);
    if (head.data)
        OPENSSL_cleanse(head.data, head.len);
    buf_done(&head);
    record_unref(sealed);
    return err;
}

const char *seal_failure_text(enum seal_failure f)
{
    switch (f) {
    case SEAL_OK:
        return "it opens";
    case SEAL_CLEAR:
        return "it is stored in clear, and --store-encryption-key-file asks for sealed answers";
    case SEAL_NO_KEYS:
        return "it is sealed, and there is no --store-encryption-key-file to open it";
    case SEAL_UNKNOWN_KEY:
        return "it is sealed under a key id that --store-encryption-key-file does not list";
    case SEAL_TAMPERED:
        return "its tag does not verify: its bytes were changed, it was moved from another key, "
               "or its key id names another key now";
    case SEAL_MALFORMED:
        break;
    }
    return "it is not a sealed record";
}

/* The key of <k> named <id> (<id_len> bytes), or NULL. */
static const struct seal_key *find_key(const struct seal_keys *k, const char *id, size_t id_len)
{
    for (size_t i = 0; i < k->n; i++) {
        if (strlen(k->keys[i].id) == id_len && !memcmp(k->keys[i].id, id, id_len))
            return &k->keys[i];
    }
    return NULL;
}

/* Decrypts the <len> bytes at <in> through <c> into nothing that is kept,
 * then checks the tag <tag>: whether it verifies. */
static bool tag_verifies(EVP_CIPHER_CTX *c, const unsigned char *in, size_t len, unsigned char *tag)
{
    unsigned char scratch[4096];
    int outl;
    bool ok = true;

    for (size_t n; ok && len; in += n, len -= n) {
        n = len < sizeof(scratch) ? len : sizeof(scratch);
        ok = crypt_update(c, false, scratch, in, n);
    }
    OPENSSL_cleanse(scratch, sizeof(scratch));
    return ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, tag) == 1 &&
           EVP_DecryptFinal_ex(c, scratch, &outl) == 1;
}

/* Decrypts the sealed body <b> with <key> of <k> into a new record in
 * <ret>: its head apart, its body straight into the record's own buffer,
 * both used only once the tag verified. */
static int open_with(const struct seal_keys *k, const struct seal_key *key, struct span store_key,
                     struct span b, size_t hdr_len, struct record **ret, enum seal_failure *failure)
{
    size_t plain_len = b.len - hdr_len - SEAL_TAG_BYTES, head_len, body_len;
    const unsigned char *in = (const unsigned char *)b.base + hdr_len;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    struct buf body = BUF_INIT(0);
    unsigned char tag[SEAL_TAG_BYTES], len4[4], *head = NULL;
    int err = -ENOMEM, outl;

    *failure = SEAL_TAMPERED;
    if (!c)
        goto out;
    memcpy(tag, in + plain_len, SEAL_TAG_BYTES);
    err = -EBADMSG;
    if (!crypt_start(c, k, false, key->key, in - SEAL_NONCE_BYTES, (struct span){ b.base, hdr_len },
                     store_key) ||
        !crypt_update(c, false, len4, in, 4))
        goto out;
    /* Not verified yet: bounded, then the tag decides. */
    head_len = (size_t)len4[0] << 24 | (size_t)len4[1] << 16 | (size_t)len4[2] << 8 | len4[3];
    if (head_len > plain_len - 4) {
        if (tag_verifies(c, in + 4, plain_len - 4, tag))
            *failure = SEAL_MALFORMED;
        goto out;
    }
    body_len = plain_len - 4 - head_len;
    body = BUF_INIT(body_len);
    err = -ENOMEM;
    if (!(head = malloc(head_len ? head_len : 1)) || buf_reserve(&body, body_len) < 0)
        goto out;
    err = -EBADMSG;
    if (!crypt_update(c, false, head, in + 4, head_len) ||
        !crypt_update(c, false, (unsigned char *)body.data, in + 4 + head_len, body_len) ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, tag) != 1 ||
        EVP_DecryptFinal_ex(c, len4, &outl) != 1)
        goto out;
    body.len = body_len;
    *failure = SEAL_MALFORMED;
    err = record_decode((struct span){ (const char *)head, head_len }, (struct span){ "", 0 }, ret);
    if (err == -EPROTO)
        err = -EBADMSG;
    if (err == 0) {
        *failure = SEAL_OK;
        buf_done(&(*ret)->body);
        (*ret)->body = body; /* the answer's body, as it was sealed */
        body = BUF_INIT(0);
    }
out:
    EVP_CIPHER_CTX_free(c);
    if (head) {
        OPENSSL_cleanse(head, head_len);
        free(head);
    }
    if (body.data)
        OPENSSL_cleanse(body.data, body.cap);
    buf_done(&body);
    return err;
}

int seal_open(const struct seal_keys *k, struct span store_key, struct record *rec,
              struct record **ret, enum seal_failure *failure, char *ret_id)
{
    struct span b = buf_span(&rec->body);
    const struct seal_key *key;
    size_t id_len, hdr_len;

    ret_id[0] = '\0';
    if (!rec->sealed) {
        *failure = k ? SEAL_CLEAR : SEAL_OK;
        if (k)
            return -EBADMSG;
        *ret = record_ref(rec);
        return 0;
    }
    *failure = SEAL_MALFORMED;
    if (b.len < SEAL_MAGIC_LEN + 1 || memcmp(b.base, SEAL_MAGIC, SEAL_MAGIC_LEN))
        return -EBADMSG;
    id_len = (unsigned char)b.base[SEAL_MAGIC_LEN];
    hdr_len = SEAL_MAGIC_LEN + 1 + id_len + SEAL_NONCE_BYTES;
    if (id_len == 0 || id_len > SEAL_ID_MAX || b.len < hdr_len + 4 + SEAL_TAG_BYTES)
        return -EBADMSG;
    for (size_t i = 0; i < id_len; i++) {
        if (!is_id_byte(b.base[SEAL_MAGIC_LEN + 1 + i]))
            return -EBADMSG;
    }
    memcpy(ret_id, b.base + SEAL_MAGIC_LEN + 1, id_len);
    ret_id[id_len] = '\0';
    *failure = k ? SEAL_UNKNOWN_KEY : SEAL_NO_KEYS;
    key = k ? find_key(k, ret_id, id_len) : NULL;
    if (!key)
        return -EBADMSG;
    return open_with(k, key, store_key, b, hdr_len, ret, failure);
}
