/* SPDX-License-Identifier: MIT */
/* Encryption at rest of stored answers (doc/configuration.md, Encryption at rest): the keys of
 * --store-encryption-key-file, and a record sealed with AES-256-GCM
 * (OpenSSL's EVP) under the first of them, a fresh 96-bit nonce each time,
 * and the store key as associated data, so that a sealed record opens under
 * its own key only. A sealed record is a record like any other to the
 * stores (record.h: <sealed>, its body the sealed bytes), so all three keep
 * it as they keep any answer. Pure, any thread. */
#ifndef IDEMPROXY_SEAL_H
#define IDEMPROXY_SEAL_H

#include "idemproxy/common.h"

struct record;

#define SEAL_KEY_BYTES 32   /* AES-256 */
#define SEAL_ID_MAX 32      /* a key id: 1 to 32 of A-Z a-z 0-9 . _ - */
#define SEAL_KEYS_MAX 64    /* lines of a key file */
#define SEAL_FILE_MAX 16384 /* bytes of a key file */

struct seal_key {
    char id[SEAL_ID_MAX + 1];
    unsigned char key[SEAL_KEY_BYTES];
};

/* The keys of a key file, in its order: the first seals, every one opens. */
struct seal_keys {
    struct seal_key *keys; /* owned array of n, wiped when freed */
    size_t n;
    struct evp_cipher_st *aead; /* owned: AES-256-GCM, fetched once (OpenSSL 3 looks a
                                   cipher up under a lock each time it is named) */
};

/* Parses the text of a key file: lines "ID:KEY", KEY being 32 bytes in
 * base64 (44 characters, as `openssl rand -base64 32` prints them); empty
 * lines and lines beginning with '#' are skipped, a line may end in "\r".
 * No key bytes ever reach <why>. Returns 0 with new keys in <ret>, -EINVAL
 * with one line in <why> ("line 3: ..."; no keys, a repeated id, too many
 * lines or bytes), or -ENOMEM. */
int seal_keys_parse(struct span text, struct seal_keys **ret, char *why, size_t why_len);

/* Reads and parses the key file <path> (at most SEAL_FILE_MAX bytes). Returns
 * 0, or -EINVAL with one line in <why> naming the file, or -ENOMEM. */
int seal_keys_load(const char *path, struct seal_keys **ret, char *why, size_t why_len);

/* Wipes and frees <k>. NULL-safe. */
void seal_keys_free(struct seal_keys *k);

/* Seals <rec> (status, flags, headers and body) for the store key
 * <store_key> under the first key of <k>. Returns 0 with a new sealed
 * record (refs 1) in <ret>, -EIO when OpenSSL fails, -E2BIG or -ENOMEM. */
int seal_record(const struct seal_keys *k, struct span store_key, const struct record *rec,
                struct record **ret);

/* Why a stored record did not open (seal_open). */
enum seal_failure {
    SEAL_OK,
    SEAL_CLEAR,       /* stored in clear while answers are sealed */
    SEAL_NO_KEYS,     /* sealed, and there is no key file */
    SEAL_UNKNOWN_KEY, /* sealed under a key id the file lacks */
    SEAL_TAMPERED,    /* the tag failed: other bytes, another store key, or a changed key */
    SEAL_MALFORMED,   /* not the sealed layout, or its contents do not decode */
};

/* The failure <f> in words for the log ("its tag does not verify"). */
const char *seal_failure_text(enum seal_failure f);

/* Opens the stored record <rec> of <store_key>: a sealed one with the key its
 * id names in <k>; a clear one is returned as it is when <k> is NULL (no key
 * file). Returns 0 with a reference (a new record, or <rec>'s own) in <ret>;
 * -EBADMSG when it does not open, <failure> saying why (and <ret_id>, of
 * SEAL_ID_MAX + 1 bytes, the key id it names, "" when none); -ENOMEM. */
int seal_open(const struct seal_keys *k, struct span store_key, struct record *rec,
              struct record **ret, enum seal_failure *failure, char *ret_id);

#endif
