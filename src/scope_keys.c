/* SPDX-License-Identifier: MIT */
/* The keys tokens are verified with (doc/configuration.md, Scope): a JWKS
 * or PEM file, a secret file, or a JWKS URL that one thread of this file
 * fetches (libcurl) and refreshes. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/buf.h"
#include "idemproxy/log.h"

#include "scope_impl.h"

#define RSA_MIN_BITS 2048
#define SECRET_MIN 32
#define KEYS_MAX 64 /* keys kept of one set */

/* <why> is "<msg><arg>" (<arg> may be ""). Returns -EINVAL. */
static int fail(char *why, size_t whylen, const char *msg, const char *arg)
{
    snprintf(why, whylen, "%s%s", msg, arg);
    return -EINVAL;
}

/* Whether <n> bytes at <p> hold <needle>. */
static bool contains(const char *p, size_t n, const char *needle)
{
    size_t k = strlen(needle);

    for (size_t i = 0; i + k <= n; i++) {
        if (memcmp(p + i, needle, k) == 0)
            return true;
    }
    return false;
}

/* ---- key sets ---- */

static int keyset_new(size_t n, struct scope_keyset **ret)
{
    struct scope_keyset *ks = calloc(1, sizeof(*ks) + n * sizeof(ks->keys[0]));

    if (!ks)
        return -ENOMEM;
    atomic_init(&ks->refs, 1);
    *ret = ks;
    return 0;
}

struct scope_keyset *scope_keyset_ref(struct scope_keyset *ks)
{
    if (ks)
        atomic_fetch_add(&ks->refs, 1);
    return ks;
}

void scope_keyset_unref(struct scope_keyset *ks)
{
    if (!ks || atomic_fetch_sub(&ks->refs, 1) != 1)
        return;
    for (size_t i = 0; i < ks->n; i++) {
        cjose_jwk_release(ks->keys[i].jwk);
        free(ks->keys[i].kid);
        free(ks->keys[i].alg);
    }
    free(ks);
}

/* The kind of <jwk>, or -1 for one no algorithm here takes (a small RSA key,
 * another curve). */
static int jwk_kind(const cjose_jwk_t *jwk)
{
    cjose_err err;

    switch (cjose_jwk_get_kty(jwk, &err)) {
    case CJOSE_JWK_KTY_RSA:
        return cjose_jwk_get_keysize(jwk, &err) >= RSA_MIN_BITS ? SCOPE_KEY_RSA : -1;
    case CJOSE_JWK_KTY_EC:
        return cjose_jwk_EC_get_curve(jwk, &err) == CJOSE_JWK_EC_P_256 ? SCOPE_KEY_EC256 : -1;
    default:
        return -1;
    }
}

/* Adds JWK <k> of a JWKS to <ks> when it is a public signing key of a kind
 * taken here. Returns 0 (added or left out) or -ENOMEM. */
static int add_jwk(struct scope_keyset *ks, json_t *k)
{
    const char *use = json_string_value(json_object_get(k, "use"));
    const char *kid = json_string_value(json_object_get(k, "kid"));
    const char *alg = json_string_value(json_object_get(k, "alg"));
    struct scope_key *key = &ks->keys[ks->n];
    cjose_err err;
    char *text;
    int kind;

    if (!json_is_object(k) || (use && strcmp(use, "sig") != 0) || json_object_get(k, "d") ||
        ks->n >= KEYS_MAX)
        return 0; /* not for signatures, or a private key: not a JWKS's to give */
    text = json_dumps(k, JSON_COMPACT);
    if (!text)
        return -ENOMEM;
    key->jwk = cjose_jwk_import(text, strlen(text), &err);
    free(text);
    if (!key->jwk)
        return err.code == CJOSE_ERR_NO_MEMORY ? -ENOMEM : 0;
    kind = jwk_kind(key->jwk);
    key->kid = kid ? strdup(kid) : NULL;
    key->alg = alg ? strdup(alg) : NULL;
    if (kind < 0 || (kid && !key->kid) || (alg && !key->alg)) {
        cjose_jwk_release(key->jwk);
        free(key->kid);
        free(key->alg);
        memset(key, 0, sizeof(*key));
        return kind < 0 ? 0 : -ENOMEM;
    }
    key->kind = (enum scope_key_kind)kind;
    ks->n++;
    return 0;
}

int scope_keyset_from_jwks(const char *json, size_t len, struct scope_keyset **ret, char *why,
                           size_t whylen)
{
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *keys = json_object_get(doc, "keys");
    struct scope_keyset *ks = NULL;
    int err = 0;

    if (!json_is_array(keys)) {
        json_decref(doc);
        return fail(why, whylen, "", "not a JWKS (a JSON object with a \"keys\" array)");
    }
    err = keyset_new(json_array_size(keys), &ks);
    for (size_t i = 0; err == 0 && i < json_array_size(keys); i++)
        err = add_jwk(ks, json_array_get(keys, i));
    json_decref(doc);
    if (err == 0 && ks->n == 0)
        err = fail(why, whylen, "",
                   "a JWKS without a key to verify with (RSA of 2048 bits or more, or EC "
                   "P-256, for signatures)");
    if (err < 0) {
        scope_keyset_unref(ks);
        return err;
    }
    *ret = ks;
    return 0;
}

/* The big-endian bytes of <pkey>'s parameter <name> into <out> (at most
 * <max>, left-padded to <pad> when not 0). Returns the length, or 0. */
static size_t key_param(const EVP_PKEY *pkey, const char *name, uint8_t *out, size_t max,
                        size_t pad)
{
    BIGNUM *bn = NULL;
    int n = -1;

    if (EVP_PKEY_get_bn_param(pkey, name, &bn) == 1 && (size_t)BN_num_bytes(bn) <= max)
        n = pad ? BN_bn2binpad(bn, out, (int)pad) : BN_bn2bin(bn, out);
    BN_free(bn);
    return n > 0 ? (size_t)n : 0;
}

/* A cjose JWK of the RSA or P-256 public key <pkey>, NULL for another. */
static cjose_jwk_t *pkey_jwk(const EVP_PKEY *pkey)
{
    uint8_t a[1024], b[1024];
    char group[32] = "";
    cjose_err err;

    if (EVP_PKEY_is_a(pkey, "RSA")) {
        cjose_jwk_rsa_keyspec spec = { 0 };

        spec.n = a;
        spec.nlen = key_param(pkey, OSSL_PKEY_PARAM_RSA_N, a, sizeof(a), 0);
        spec.e = b;
        spec.elen = key_param(pkey, OSSL_PKEY_PARAM_RSA_E, b, sizeof(b), 0);
        return spec.nlen && spec.elen ? cjose_jwk_create_RSA_spec(&spec, &err) : NULL;
    }
    if (EVP_PKEY_is_a(pkey, "EC") &&
        EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group),
                                       NULL) == 1 &&
        strcmp(group, "prime256v1") == 0) {
        cjose_jwk_ec_keyspec spec = { .crv = CJOSE_JWK_EC_P_256 };

        spec.x = a;
        spec.xlen = key_param(pkey, OSSL_PKEY_PARAM_EC_PUB_X, a, 32, 32);
        spec.y = b;
        spec.ylen = key_param(pkey, OSSL_PKEY_PARAM_EC_PUB_Y, b, 32, 32);
        return spec.xlen && spec.ylen ? cjose_jwk_create_EC_spec(&spec, &err) : NULL;
    }
    return NULL;
}

/* The key set of the PEM public keys in <text>. Returns 0, -EINVAL or -ENOMEM. */
static int keyset_from_pem(const char *text, size_t len, struct scope_keyset **ret, char *why,
                           size_t whylen)
{
    BIO *bio = BIO_new_mem_buf(text, (int)len);
    struct scope_keyset *ks = NULL;
    EVP_PKEY *pkey;
    int err = bio ? keyset_new(KEYS_MAX, &ks) : -ENOMEM;

    while (err == 0 && ks->n < KEYS_MAX && (pkey = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL))) {
        struct scope_key *k = &ks->keys[ks->n];
        int kind;

        k->jwk = pkey_jwk(pkey);
        EVP_PKEY_free(pkey);
        kind = k->jwk ? jwk_kind(k->jwk) : -1;
        if (kind < 0) {
            cjose_jwk_release(k->jwk);
            k->jwk = NULL;
            err = fail(why, whylen, "",
                       "a PEM public key that is neither RSA of 2048 bits or more nor EC P-256");
            break;
        }
        k->kind = (enum scope_key_kind)kind;
        ks->n++;
    }
    ERR_clear_error(); /* the end of the file is an error to OpenSSL */
    BIO_free(bio);
    if (err == 0 && ks->n == 0)
        err = fail(why, whylen, "", "no PEM public key (-----BEGIN PUBLIC KEY-----) in it");
    if (err < 0) {
        scope_keyset_unref(ks);
        return err;
    }
    *ret = ks;
    return 0;
}

/* Reads file <path> whole (at most SCOPE_JWKS_MAX bytes) into <out>. */
static int read_file(const char *path, struct buf *out, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    char chunk[4096];
    size_t n;
    int err = 0;

    if (!f)
        return fail(why, whylen, "cannot read ", path);
    while (err == 0 && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        err = buf_append(out, chunk, n);
    if (err == 0 && ferror(f))
        err = fail(why, whylen, "cannot read ", path);
    else if (err == -E2BIG)
        err = fail(why, whylen, "larger than 1 MiB: ", path);
    fclose(f);
    return err;
}

int scope_keyset_from_file(const char *path, struct scope_keyset **ret, char *why, size_t whylen)
{
    struct buf text = BUF_INIT(SCOPE_JWKS_MAX);
    char inner[256];
    int err = read_file(path, &text, why, whylen);

    if (err == 0 && contains(text.data, text.len, "-----BEGIN"))
        err = keyset_from_pem(text.data, text.len, ret, inner, sizeof(inner));
    else if (err == 0)
        err = scope_keyset_from_jwks(text.data, text.len, ret, inner, sizeof(inner));
    else
        inner[0] = '\0';
    if (err == -EINVAL && inner[0])
        snprintf(why, whylen, "%s: %s (keys takes a JWKS or PEM public keys)", path, inner);
    buf_done(&text);
    return err;
}

int scope_keyset_from_secret(const char *path, struct scope_keyset **ret, char *why, size_t whylen)
{
    struct buf text = BUF_INIT(SCOPE_JWKS_MAX);
    struct scope_keyset *ks = NULL;
    int err = read_file(path, &text, why, whylen);
    size_t n = 0;
    cjose_err cerr;

    while (err == 0 && n < text.len && text.data[n] != '\n' && text.data[n] != '\r')
        n++;
    if (err == 0 && n < SECRET_MIN)
        err = fail(why, whylen, "its first line is the HS256 secret, at least 32 bytes: ", path);
    if (err == 0)
        err = keyset_new(1, &ks);
    if (err == 0) {
        ks->keys[0].jwk = cjose_jwk_create_oct_spec((const uint8_t *)text.data, n, &cerr);
        ks->keys[0].kind = SCOPE_KEY_OCT;
        ks->n = ks->keys[0].jwk ? 1 : 0;
        if (!ks->keys[0].jwk)
            err = -ENOMEM;
    }
    if (text.data)
        memset(text.data, 0, text.len); /* the secret is kept in the key only */
    buf_done(&text);
    if (err < 0) {
        scope_keyset_unref(ks);
        return err;
    }
    *ret = ks;
    return 0;
}

/* ---- JWKS URLs: fetched by one thread ---- */

struct scope_source {
    int refs;  /* under <mu> */
    char *url; /* owned */
    struct scope_keyset *keys;
    uint64_t next_ms;             /* the next refresh (monotonic) */
    uint64_t kid_miss_ms;         /* the last refetch an unknown kid asked for; 0: none */
    bool want;                    /* a refetch is asked for */
    bool fetching;                /* the fetcher is fetching it now */
    struct scope_waiter *waiters; /* for the end of the refetch asked for or running */
    bool failing;                 /* the last fetch failed (logged once until one succeeds) */
    struct scope_source *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static struct scope_source *sources;
static pthread_t fetcher;
static bool fetcher_running, stopping;

static size_t on_body(char *p, size_t size, size_t n, void *ctx)
{
    return buf_append(ctx, p, size * n) == 0 ? size * n : 0;
}

/* Fetches <url>'s JWKS into a new set. Returns 0, or -EIO with <why>. */
static int fetch(const char *url, struct scope_keyset **ret, char *why, size_t whylen)
{
    struct buf body = BUF_INIT(SCOPE_JWKS_MAX);
    CURL *c = curl_easy_init();
    long status = 0;
    CURLcode rc;
    int err;

    if (!c)
        return fail(why, whylen, "out of memory", "");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)SCOPE_FETCH_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
    rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK)
        err = fail(why, whylen, "", curl_easy_strerror(rc));
    else if (status != 200) {
        snprintf(why, whylen, "it answered %ld, not 200", status);
        err = -EIO;
    } else
        err = scope_keyset_from_jwks(body.data, body.len, ret, why, whylen);
    buf_done(&body);
    return err < 0 ? -EIO : 0;
}

/* The waiters of <src>, which it forgets; <mu> held. */
static struct scope_waiter *take_waiters(struct scope_source *src)
{
    struct scope_waiter *w = src->waiters;

    src->waiters = NULL;
    return w;
}

/* Runs each of <w> (<mu> not held: a waiter may evaluate a token). */
static void run_waiters(struct scope_waiter *w)
{
    while (w) {
        struct scope_waiter *next = w->next;

        w->fn(w->ctx);
        w = next;
    }
}

/* Fetches <src> now (its url is constant; <mu> is not held) and keeps what
 * came; then runs the waiters of the refetch, unless another was asked for
 * meanwhile. */
static void refresh(struct scope_source *src)
{
    struct scope_waiter *waiters;
    struct scope_keyset *ks = NULL, *old = NULL;
    char why[256];
    int err = fetch(src->url, &ks, why, sizeof(why));

    pthread_mutex_lock(&mu);
    if (err == 0) {
        old = src->keys;
        src->keys = ks;
        if (src->failing)
            log_write(LOG_LEVEL_INFO, "keys-url %s: fetched again (%zu keys)", src->url, ks->n);
    } else if (!src->failing) {
        log_write(LOG_LEVEL_WARN,
                  "keys-url %s: cannot fetch the JWKS: %s; %s, tried again every 30 s", src->url,
                  why, src->keys ? "the keys fetched before are kept" : "its tokens get 401");
    }
    src->failing = err != 0;
    src->next_ms = now_ms() + (err == 0 ? SCOPE_REFRESH_MS : SCOPE_KID_REFETCH_MS);
    pthread_cond_signal(&wake); /* the fetcher's next wake may change */
    src->fetching = false;
    waiters = src->want ? NULL : take_waiters(src); /* asked for again meanwhile: after that one */
    pthread_mutex_unlock(&mu);
    scope_keyset_unref(old);
    run_waiters(waiters);
}

static void *fetcher_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct scope_source *due = NULL;
        uint64_t now = now_ms(), next = now + SCOPE_REFRESH_MS;
        struct timespec ts;

        for (struct scope_source *s = sources; s && !due; s = s->next) {
            if (s->want || s->next_ms <= now)
                due = s;
            else if (s->next_ms < next)
                next = s->next_ms;
        }
        if (due) {
            due->want = false;
            due->fetching = true;
            due->refs++; /* kept while fetched outside the lock */
            pthread_mutex_unlock(&mu);
            refresh(due);
            scope_source_unref(due);
            pthread_mutex_lock(&mu);
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        next -= now;
        ts.tv_sec += (time_t)(next / 1000);
        ts.tv_nsec += (long)(next % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&wake, &mu, &ts);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Whether <url> is one keys may come from: https://, or http:// to a
 * loopback address (a local agent, a test): a key set fetched in clear
 * from elsewhere could be anyone's. Read by libcurl's own URL parser, which
 * the fetch uses; no user info (it would be logged, and "127.0.0.1@host"
 * names another host). */
static bool url_allowed(const char *url)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *user = NULL;
    uint8_t a[16];
    bool ok = false;

    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_NO_USER) {
        if (strcmp(scheme, "https") == 0)
            ok = host[0] != '\0';
        else if (strcmp(scheme, "http") == 0)
            ok = strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0 ||
                 (inet_pton(AF_INET, host, a) == 1 && a[0] == 127);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(user);
    curl_url_cleanup(u);
    return ok;
}

/* Starts the fetcher with every signal blocked: the process's signals are
 * the main thread's (sigtimedwait), and one delivered to this thread would
 * take the default action, which ends the process. <mu> held. */
static int fetcher_start(void)
{
    sigset_t all, old;
    int err;

    if (fetcher_running)
        return 0;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    err = pthread_create(&fetcher, NULL, fetcher_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err == 0)
        fetcher_running = true;
    return -err;
}

int scope_source_get(const char *url, struct scope_source **ret, char *why, size_t whylen)
{
    struct scope_source *src;

    if (!url_allowed(url)) {
        snprintf(why, whylen,
                 "keys-url: '%s' is not an https:// URL without user info (http:// only to a "
                 "loopback address: keys fetched in clear could be anyone's)",
                 url);
        return -EINVAL;
    }
    pthread_mutex_lock(&mu);
    for (src = sources; src && strcmp(src->url, url) != 0; src = src->next)
        ;
    if (src) {
        src->refs++;
        pthread_mutex_unlock(&mu);
        *ret = src;
        return 0;
    }
    src = calloc(1, sizeof(*src));
    if (!src || !(src->url = strdup(url)) || fetcher_start() < 0) {
        pthread_mutex_unlock(&mu);
        if (src)
            free(src->url);
        free(src);
        return -ENOMEM;
    }
    src->refs = 2; /* the caller's, and the first fetch's below */
    src->next_ms = UINT64_MAX;
    src->next = sources;
    sources = src;
    pthread_mutex_unlock(&mu);
    refresh(src); /* at once: the first tokens find their keys */
    scope_source_unref(src);
    *ret = src;
    return 0;
}

void scope_source_unref(struct scope_source *src)
{
    struct scope_source **p;

    if (!src)
        return;
    pthread_mutex_lock(&mu);
    if (--src->refs > 0) {
        pthread_mutex_unlock(&mu);
        return;
    }
    for (p = &sources; *p != src; p = &(*p)->next)
        ;
    *p = src->next;
    pthread_mutex_unlock(&mu);
    scope_keyset_unref(src->keys);
    free(src->url);
    free(src);
}

struct scope_keyset *scope_source_keys(struct scope_source *src)
{
    struct scope_keyset *ks;

    pthread_mutex_lock(&mu);
    ks = scope_keyset_ref(src->keys);
    pthread_mutex_unlock(&mu);
    return ks;
}

void scope_source_kid_missed(struct scope_source *src, uint64_t now)
{
    pthread_mutex_lock(&mu);
    if (src->kid_miss_ms == 0 || now - src->kid_miss_ms >= SCOPE_KID_REFETCH_MS) {
        src->kid_miss_ms = now;
        src->want = true;
        pthread_cond_signal(&wake);
    }
    pthread_mutex_unlock(&mu);
}

int scope_source_wait(struct scope_source *src, struct scope_waiter *w)
{
    int err = -EALREADY;

    pthread_mutex_lock(&mu);
    if (src->want || src->fetching) {
        w->next = src->waiters;
        src->waiters = w;
        err = 0;
    }
    pthread_mutex_unlock(&mu);
    return err;
}

void scope_shutdown(void)
{
    struct scope_waiter *waiters = NULL;
    bool join;

    pthread_mutex_lock(&mu);
    for (struct scope_source *s = sources; s; s = s->next) {
        struct scope_waiter *w = take_waiters(s);

        while (w) { /* no fetch is coming any more */
            struct scope_waiter *next = w->next;

            w->next = waiters;
            waiters = w;
            w = next;
        }
    }
    join = fetcher_running;
    stopping = true;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
    if (join)
        pthread_join(fetcher, NULL);
    pthread_mutex_lock(&mu);
    fetcher_running = false;
    stopping = false;
    pthread_mutex_unlock(&mu);
    run_waiters(waiters);
}
