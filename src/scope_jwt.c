/* SPDX-License-Identifier: MIT */
/* A bearer token verified (doc/configuration.md, Scope): its header read
 * here first, so that the algorithm and the key are chosen by this proxy's
 * rules before libcjose checks the signature; then its time and its
 * claims. */
#include <stdlib.h>
#include <string.h>

#include "scope_impl.h"

#define TOKEN_MAX 16384 /* bytes of a token taken */

static int refuse(enum scope_failure f, enum scope_failure *why)
{
    *why = f;
    return 1;
}

/* A JWS in compact form: three parts of base64url characters, the first two
 * not empty. */
static bool is_compact(struct span t)
{
    size_t dots = 0, part = 0;

    if (t.len == 0 || t.len > TOKEN_MAX)
        return false;
    for (size_t i = 0; i < t.len; i++) {
        char c = t.base[i];

        if (c == '.') {
            if (part == 0 || ++dots > 2)
                return false;
            part = 0;
        } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_') {
            part++;
        } else {
            return false;
        }
    }
    return dots == 2;
}

/* The JOSE header of <t>, decoded: a JSON object with unique names, or NULL. */
static json_t *jose_header(struct span t)
{
    size_t n = (size_t)((const char *)memchr(t.base, '.', t.len) - t.base);
    uint8_t *raw = NULL;
    size_t rawlen = 0;
    cjose_err err;
    json_t *h = NULL;

    if (cjose_base64url_decode(t.base, n, &raw, &rawlen, &err))
        h = json_loadb((const char *)raw, rawlen, JSON_REJECT_DUPLICATES, NULL);
    cjose_get_dealloc()(raw);
    if (h && !json_is_object(h)) {
        json_decref(h);
        h = NULL;
    }
    return h;
}

/* The kind of key algorithm <alg> verifies with, or -1: not one taken here
 * ("none" among them). */
static int alg_kind(const char *alg)
{
    if (strcmp(alg, "RS256") == 0 || strcmp(alg, "PS256") == 0)
        return SCOPE_KEY_RSA;
    if (strcmp(alg, "ES256") == 0)
        return SCOPE_KEY_EC256;
    if (strcmp(alg, "HS256") == 0)
        return SCOPE_KEY_OCT;
    return -1;
}

/* Verifies <jws> with the keys of <ks> (fetched from a keys-url when
 * <from_url>) that fit <alg> and <kid>. */
static int verify_with(struct scope_keyset *ks, bool from_url, cjose_jws_t *jws, const char *alg,
                       const char *kid, enum scope_failure *why)
{
    int kind = alg_kind(alg);
    bool named = false, fits = false;
    cjose_err err;

    for (size_t i = 0; kid && i < ks->n; i++)
        named |= ks->keys[i].kid && strcmp(ks->keys[i].kid, kid) == 0;
    for (size_t i = 0; i < ks->n; i++) {
        const struct scope_key *k = &ks->keys[i];

        /* A kid names its keys; keys without one are tried for any token. */
        if (named && !(k->kid && strcmp(k->kid, kid) == 0))
            continue;
        if (!named && kid && k->kid)
            continue;
        if ((int)k->kind != kind || (k->alg && strcmp(k->alg, alg) != 0))
            continue; /* never an HS256 token against a public key, nor RS256 against EC */
        fits = true;
        if (cjose_jws_verify(jws, k->jwk, &err))
            return 0;
    }
    /* A kid none of the keys has is unknown when no key without one is
     * there to try, and, from a keys-url, even when such a key was tried and
     * failed: the key may be new there (a refetch may bring it). */
    for (size_t i = 0; kid && !named && !from_url && i < ks->n; i++) {
        if (!ks->keys[i].kid)
            return refuse(fits ? SCOPE_FAILURE_SIGNATURE : SCOPE_FAILURE_ALGORITHM, why);
    }
    if (kid && !named)
        return refuse(SCOPE_FAILURE_UNKNOWN_KID, why);
    return refuse(fits ? SCOPE_FAILURE_SIGNATURE : SCOPE_FAILURE_ALGORITHM, why);
}

/* exp and nbf of <claims> against <now_s>, give or take <leeway>: a number
 * each, when present. */
static int check_time(json_t *claims, uint64_t now_s, uint64_t leeway, enum scope_failure *why)
{
    json_t *exp = json_object_get(claims, "exp"), *nbf = json_object_get(claims, "nbf");
    double now = (double)now_s, lw = (double)leeway;

    if ((exp && !json_is_number(exp)) || (nbf && !json_is_number(nbf)))
        return refuse(SCOPE_FAILURE_CLAIMS, why);
    if (exp && now >= json_number_value(exp) + lw) /* valid before exp only (RFC 7519, 4.1.4) */
        return refuse(SCOPE_FAILURE_EXPIRED, why);
    if (nbf && now + lw < json_number_value(nbf))
        return refuse(SCOPE_FAILURE_EXPIRED, why);
    return 0;
}

/* Whether aud (a string, or an array of strings) names <audience>. */
static bool has_audience(json_t *aud, const char *audience)
{
    size_t i;
    json_t *v;

    if (json_is_string(aud))
        return strcmp(json_string_value(aud), audience) == 0;
    json_array_foreach(aud, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), audience) == 0)
            return true;
    }
    return false;
}

static int check_claims(const struct scope *s, json_t *claims, enum scope_failure *why)
{
    const char *iss = json_string_value(json_object_get(claims, "iss"));

    if (!iss || strcmp(iss, s->issuer) != 0)
        return refuse(SCOPE_FAILURE_CLAIMS, why);
    if (s->audience && !has_audience(json_object_get(claims, "aud"), s->audience))
        return refuse(SCOPE_FAILURE_CLAIMS, why);
    for (size_t i = 0; i < s->nclaims; i++) {
        json_t *v = json_object_get(claims, s->claims[i]);

        if (!v || json_is_null(v))
            return refuse(SCOPE_FAILURE_CLAIMS, why);
    }
    return 0;
}

/* The payload of verified <jws>: a JSON object with unique names, or NULL. */
static json_t *payload(cjose_jws_t *jws)
{
    uint8_t *p = NULL;
    size_t n = 0;
    cjose_err err;
    json_t *claims;

    if (!cjose_jws_get_plaintext(jws, &p, &n, &err))
        return NULL;
    claims = json_loadb((const char *)p, n, JSON_REJECT_DUPLICATES, NULL);
    if (claims && !json_is_object(claims)) {
        json_decref(claims);
        claims = NULL;
    }
    return claims;
}

int scope_jwt_verify(const struct scope *s, struct span token, uint64_t now_s, json_t **ret,
                     enum scope_failure *why)
{
    struct scope_keyset *ks = NULL;
    cjose_jws_t *jws = NULL;
    json_t *hdr, *claims = NULL;
    const char *alg, *kid;
    cjose_err err;
    int r;

    if (!is_compact(token) || !(hdr = jose_header(token)))
        return refuse(SCOPE_FAILURE_MALFORMED, why);
    alg = json_string_value(json_object_get(hdr, "alg"));
    kid = json_string_value(json_object_get(hdr, "kid"));
    if (!alg || (json_object_get(hdr, "kid") && !kid) || json_object_get(hdr, "crit"))
        r = refuse(SCOPE_FAILURE_MALFORMED, why);
    else if (alg_kind(alg) < 0)
        r = refuse(SCOPE_FAILURE_ALGORITHM, why); /* "none" among them */
    else if (!(ks = s->keys ? scope_keyset_ref(s->keys) : scope_source_keys(s->source)))
        r = refuse(SCOPE_FAILURE_KEYS_UNAVAILABLE, why);
    else if (!(jws = cjose_jws_import(token.base, token.len, &err)))
        r = err.code == CJOSE_ERR_NO_MEMORY ? -ENOMEM : refuse(SCOPE_FAILURE_MALFORMED, why);
    else
        r = verify_with(ks, s->source != NULL, jws, alg, kid, why);
    if (r == 1 && *why == SCOPE_FAILURE_UNKNOWN_KID && s->source)
        scope_source_kid_missed(s->source, now_ms());
    if (r == 0 && !(claims = payload(jws)))
        r = refuse(SCOPE_FAILURE_MALFORMED, why);
    if (r == 0)
        r = check_time(claims, now_s, s->leeway_s, why);
    if (r == 0)
        r = check_claims(s, claims, why);
    json_decref(hdr);
    cjose_jws_release(jws);
    scope_keyset_unref(ks);
    if (r != 0) {
        json_decref(claims);
        return r;
    }
    *ret = claims;
    return 0;
}
