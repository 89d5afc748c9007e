/* SPDX-License-Identifier: MIT */
/* Measures what a route's `scope: {jwt}` costs a keyed request: scope_eval()
 * of a realistic bearer token (iss, aud, sub, a tenant, iat, exp, jti) signed
 * RS256 (2048 bits), PS256, ES256 (P-256) and HS256, the keys from a JWKS
 * file, beside the header scope's SHA-256 that every keyed request pays
 * anyway. Not a test: Performance's figures come from it.
 *   build/test/measure_scope [seconds per algorithm=1] */
#include <cjose/cjose.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idemproxy/idemkey.h"
#include "idemproxy/request.h"
#include "idemproxy/scope.h"

#define ISS "https://login.example.com/"

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A token of <alg> signed with <jwk> (kid "k1"). */
static char *mint(cjose_jwk_t *jwk, const char *alg)
{
    char claims[512];
    cjose_err err;
    cjose_header_t *h = cjose_header_new(&err);
    const char *ser;
    cjose_jws_t *jws;
    char *out;
    long now = (long)time(NULL);

    snprintf(claims, sizeof(claims),
             "{\"iss\":\"" ISS
             "\",\"aud\":\"payments-api\",\"sub\":\"auth0|5f7c8ec7c33c6c004bbafe82\","
             "\"tenant_id\":\"t_4821\",\"iat\":%ld,\"exp\":%ld,\"jti\":\"b1f0c7e2-6d1b\","
             "\"scope\":\"payments:write payments:read\"}",
             now, now + 3600);
    cjose_header_set(h, CJOSE_HDR_ALG, alg, &err);
    cjose_header_set(h, CJOSE_HDR_KID, "k1", &err);
    jws = cjose_jws_sign(jwk, h, (const uint8_t *)claims, strlen(claims), &err);
    if (!jws || !cjose_jws_export(jws, &ser, &err)) {
        fprintf(stderr, "cannot sign %s: %s\n", alg, err.message);
        exit(1);
    }
    out = strdup(ser);
    cjose_jws_release(jws);
    cjose_header_release(h);
    return out;
}

/* A scope whose keys are <jwk>'s public half, in a JWKS file (or, for an
 * octet key, its secret in a secret file). */
static struct scope *scope_of(cjose_jwk_t *jwk, bool secret)
{
    static const char *const claims[] = { "sub", "tenant_id" };
    char path[64], why[256];
    cjose_err err;
    struct scope_jwt_config c = {
        .issuer = ISS, .audience = "payments-api", .claims = claims, .nclaims = 2, .leeway_s = 60
    };
    struct scope *s = NULL;
    FILE *f;

    snprintf(path, sizeof(path), "/tmp/idem-measure-scope-%d", (int)getpid());
    f = fopen(path, "w");
    if (secret) {
        fwrite(cjose_jwk_get_keydata(jwk, &err), 1, cjose_jwk_get_keysize(jwk, &err) / 8, f);
        fputc('\n', f);
        c.secret_file = path;
    } else {
        char *pub = cjose_jwk_to_json(jwk, false, &err);
        json_t *k = json_loads(pub, 0, NULL), *set = json_pack("{s:[o]}", "keys", k);

        json_dumpf(set, f, JSON_COMPACT);
        json_decref(set);
        free(pub);
        c.keys_file = path;
    }
    fclose(f);
    if (scope_jwt_new(&c, &s, why, sizeof(why)) < 0) {
        fprintf(stderr, "scope: %s\n", why);
        exit(1);
    }
    unlink(path);
    return s;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    static const uint8_t e[] = { 1, 0, 1 };
    cjose_err err;
    cjose_jwk_t *rsa = cjose_jwk_create_RSA_random(2048, e, sizeof(e), &err);
    cjose_jwk_t *ec = cjose_jwk_create_EC_random(CJOSE_JWK_EC_P_256, &err);
    uint8_t secret[32];
    struct {
        const char *alg;
        cjose_jwk_t *jwk;
    } cases[] = { { "RS256", rsa }, { "PS256", rsa }, { "ES256", ec }, { "HS256", NULL } };

    memset(secret, 'k', sizeof(secret));
    cases[3].jwk = cjose_jwk_create_oct_spec(secret, sizeof(secret), &err);
    cjose_jwk_set_kid(rsa, "k1", 2, &err);
    cjose_jwk_set_kid(ec, "k1", 2, &err);
    printf("%-6s %12s %8s\n", "alg", "us/token", "bytes");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct scope *s = scope_of(cases[i].jwk, i == 3);
        char *tok = mint(cases[i].jwk, cases[i].alg), value[2048];
        struct request *rq = request_new("/");
        size_t n = 0;
        double t0, t;

        snprintf(value, sizeof(value), "Bearer %s", tok);
        request_add_header(rq, SPAN_LIT("Authorization"), span_from_cstr(value));
        t0 = now_s();
        do {
            struct scope_principal p;
            enum scope_failure why;

            if (scope_eval(s, rq, (uint64_t)time(NULL), &p, &why) != 0 || p.n != 6) {
                fprintf(stderr, "%s: does not verify (%s)\n", cases[i].alg,
                        scope_failure_label(why));
                return 1;
            }
            scope_principal_done(&p);
            n++;
        } while ((t = now_s() - t0) < secs);
        printf("%-6s %12.1f %8zu\n", cases[i].alg, t / (double)n * 1e6, strlen(tok));
        request_free(rq);
        free(tok);
        scope_unref(s);
    }
    {
        struct span v = SPAN_LIT("Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.e30.c2ln");
        char scope[IDEMKEY_SCOPE_HEX + 1];
        size_t n = 0;
        double t0 = now_s(), t;

        do {
            idemkey_scope(&v, 1, scope);
            n++;
        } while ((t = now_s() - t0) < secs);
        printf("%-6s %12.2f\n", "header", t / (double)n * 1e6);
    }
    scope_shutdown();
    return 0;
}
