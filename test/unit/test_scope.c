/* SPDX-License-Identifier: MIT */
/* The principal of a request (scope.h, doc/configuration.md, Scope): HS256
 * tokens minted here with libcjose's signer, verified or refused for each
 * reason; same principal exactly when issuer and claims are equal; trusted
 * networks. */
#include "idemproxy/scope.h"

#include <cjose/cjose.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/request.h"

#define SECRET "0123456789abcdef0123456789abcdef-unit"
#define ISS "https://issuer.test/"
#define NOW 1800000000u

static char secret_path[64];

/* The secret file, written once (test_scope_cleanup() removes it). */
static const char *secret_file(void)
{
    FILE *f;

    if (secret_path[0])
        return secret_path;
    snprintf(secret_path, sizeof(secret_path), "/tmp/idem-test-scope-%d", (int)getpid());
    f = fopen(secret_path, "w");
    CHECK(f != NULL);
    if (f) {
        CHECK(fputs(SECRET "\n", f) >= 0);
        CHECK(fclose(f) == 0);
    }
    return secret_path;
}

/* A compact JWS of <claims> (JSON text) with header <hdr>, MACed with <key>. */
static char *mint(const char *hdr, const char *claims, const char *key)
{
    cjose_err err;
    cjose_jwk_t *jwk = cjose_jwk_create_oct_spec((const uint8_t *)key, strlen(key), &err);
    cjose_header_t *h = cjose_header_new(&err);
    json_t *hj = json_loads(hdr, 0, NULL);
    const char *name, *ser = NULL;
    json_t *v;
    cjose_jws_t *jws;
    char *out;

    json_object_foreach(hj, name, v) cjose_header_set(h, name, json_string_value(v), &err);
    jws = cjose_jws_sign(jwk, h, (const uint8_t *)claims, strlen(claims), &err);
    CHECK(jws != NULL);
    CHECK(cjose_jws_export(jws, &ser, &err));
    out = strdup(ser);
    cjose_jws_release(jws);
    cjose_header_release(h);
    cjose_jwk_release(jwk);
    json_decref(hj);
    return out;
}

static struct scope *hs_scope(const char *const *claims, size_t n)
{
    struct scope_jwt_config c = { .secret_file = secret_file(),
                                  .issuer = ISS,
                                  .audience = "api",
                                  .claims = claims,
                                  .nclaims = n,
                                  .leeway_s = 30 };
    struct scope *s = NULL;
    char why[256] = "";

    CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), 0);
    return s;
}

/* scope_eval() of a request whose Authorization is "Bearer <tok>". */
static int eval(struct scope *s, const char *tok, struct scope_principal *p,
                enum scope_failure *why)
{
    struct request *rq = request_new("/");
    char value[4096];
    int r;

    snprintf(value, sizeof(value), "Bearer %s", tok);
    CHECK_EQ_INT(request_add_header(rq, SPAN_LIT("Authorization"), span_from_cstr(value)), 0);
    r = scope_eval(s, rq, NOW, p, why);
    request_free(rq);
    return r;
}

static enum scope_failure refused(struct scope *s, const char *tok)
{
    struct scope_principal p;
    enum scope_failure why = SCOPE_FAILURE_MAX;

    CHECK_EQ_INT(eval(s, tok, &p, &why), 1);
    CHECK_EQ_INT(p.n, 0);
    return why;
}

static void test_scope_verifies_and_names_the_principal(void)
{
    struct scope *s = hs_scope(NULL, 0);
    char *tok = mint("{\"alg\":\"HS256\"}",
                     "{\"iss\":\"" ISS "\",\"aud\":[\"x\",\"api\"],\"sub\":\"alice\","
                     "\"exp\":1800000010}",
                     SECRET);
    struct scope_principal p;
    enum scope_failure why;

    CHECK_EQ_INT(eval(s, tok, &p, &why), 0);
    CHECK_EQ_INT(p.n, 4); /* its kind, iss, then the claim's name and value */
    CHECK(span_eq(p.values[0], SPAN_LIT("\0jwt")));
    CHECK(span_eq(p.values[1], SPAN_LIT(ISS)));
    CHECK(span_eq(p.values[2], SPAN_LIT("sub")));
    CHECK(span_eq(p.values[3], SPAN_LIT("\"alice\"")));
    scope_principal_done(&p);
    free(tok);
    scope_unref(s);
}

static void test_scope_refusals(void)
{
    struct scope *s = hs_scope(NULL, 0);
    static const struct {
        const char *hdr, *claims, *key;
        enum scope_failure why;
    } cases[] = {
        { "{\"alg\":\"HS256\"}", "{\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":\"a\"}",
          "another secret of 32 bytes or more!!", SCOPE_FAILURE_SIGNATURE },
        { "{\"alg\":\"HS256\"}", "{\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":\"a\",\"exp\":1}",
          SECRET, SCOPE_FAILURE_EXPIRED },
        { "{\"alg\":\"HS256\"}",
          "{\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":\"a\",\"nbf\":1800000031}", SECRET,
          SCOPE_FAILURE_EXPIRED },
        { "{\"alg\":\"HS256\"}", "{\"iss\":\"other\",\"aud\":\"api\",\"sub\":\"a\"}", SECRET,
          SCOPE_FAILURE_CLAIMS },
        { "{\"alg\":\"HS256\"}", "{\"iss\":\"" ISS "\",\"aud\":\"web\",\"sub\":\"a\"}", SECRET,
          SCOPE_FAILURE_CLAIMS },
        { "{\"alg\":\"HS256\"}", "{\"iss\":\"" ISS "\",\"aud\":\"api\"}", SECRET,
          SCOPE_FAILURE_CLAIMS },
        { "{\"alg\":\"HS256\"}",
          "{\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":\"a\",\"exp\":\"x\"}", SECRET,
          SCOPE_FAILURE_CLAIMS },
        { "{\"alg\":\"HS256\",\"kid\":\"k9\"}",
          "{\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":\"a\"}", SECRET,
          SCOPE_FAILURE_MAX /* the secret has no kid: tried, and verifies */ },
        { "{\"alg\":\"HS256\",\"crit\":\"x\"}", "{\"iss\":\"" ISS "\",\"sub\":\"a\"}", SECRET,
          SCOPE_FAILURE_MALFORMED },
        { "{\"alg\":\"HS256\"}", "[1]", SECRET, SCOPE_FAILURE_MALFORMED },
    };

    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        char *tok = mint(cases[i].hdr, cases[i].claims, cases[i].key);
        struct scope_principal p;
        enum scope_failure why = SCOPE_FAILURE_MAX;
        int r = eval(s, tok, &p, &why);

        CHECK_EQ_INT(r, cases[i].why == SCOPE_FAILURE_MAX ? 0 : 1);
        CHECK_EQ_INT(why, cases[i].why);
        scope_principal_done(&p);
        free(tok);
    }
    /* alg none, and algorithms not taken, are refused before any key */
    CHECK_EQ_INT(refused(s, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0."), SCOPE_FAILURE_ALGORITHM);
    CHECK_EQ_INT(refused(s, "eyJhbGciOiJIUzUxMiJ9.eyJzdWIiOiJhIn0.c2ln"), SCOPE_FAILURE_ALGORITHM);
    CHECK_EQ_INT(refused(s, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"), SCOPE_FAILURE_ALGORITHM);
    CHECK_EQ_INT(refused(s, "abc"), SCOPE_FAILURE_MALFORMED);
    CHECK_EQ_INT(refused(s, "a.b.c.d"), SCOPE_FAILURE_MALFORMED);
    CHECK_EQ_INT(refused(s, "a b.c.d"), SCOPE_FAILURE_MALFORMED);
    CHECK_EQ_INT(refused(s, "   "), SCOPE_FAILURE_MALFORMED);
    {
        /* "Bearer " and nothing, or another scheme: no token, no principal */
        struct request *rq = request_new("/");
        struct scope_principal p;
        enum scope_failure why;

        CHECK_EQ_INT(eval(s, "", &p, &why), 0);
        CHECK_EQ_INT(p.n, 0);
        CHECK_EQ_INT(request_add_header(rq, SPAN_LIT("Authorization"), SPAN_LIT("Basic YTpi")), 0);
        CHECK_EQ_INT(scope_eval(s, rq, NOW, &p, &why), 0);
        CHECK_EQ_INT(p.n, 0);
        request_free(rq);
    }
    CHECK_EQ_STR(scope_failure_label(SCOPE_FAILURE_UNKNOWN_KID), "unknown_kid");
    CHECK_EQ_STR(scope_failure_label(SCOPE_FAILURE_MAX), "unknown");
    scope_unref(s);
}

/* Over random pairs of claim sets, with random other members: the
 * principals are equal exactly when iss and the named claims are. */
static void test_scope_same_principal_iff_same_claims(void)
{
    static const char *const names[] = { "sub", "tenant" };
    static const char *const values[] = { "\"a\"", "\"b\"", "1", "\"1\"", "{\"x\":1}", "[1,2]" };
    struct scope *s = hs_scope(names, 2);

    srand(39);
    for (int i = 0; i < 300; i++) {
        char c[2][256], *tok[2];
        struct scope_principal p[2];
        enum scope_failure why;
        size_t pick[2][2];
        bool same_claims, same_principal;

        for (int t = 0; t < 2; t++) {
            for (int k = 0; k < 2; k++)
                pick[t][k] = (size_t)rand() % ARRAY_SIZE(values);
            snprintf(c[t], sizeof(c[t]),
                     "{\"jti\":\"%d\",\"iss\":\"" ISS "\",\"aud\":\"api\",\"sub\":%s,"
                     "\"tenant\":%s,\"iat\":%d}",
                     rand(), values[pick[t][0]], values[pick[t][1]], rand());
            tok[t] = mint("{\"alg\":\"HS256\"}", c[t], SECRET);
            CHECK_EQ_INT(eval(s, tok[t], &p[t], &why), 0);
        }
        same_claims = pick[0][0] == pick[1][0] && pick[0][1] == pick[1][1];
        same_principal = p[0].n == p[1].n;
        for (size_t v = 0; same_principal && v < p[0].n; v++)
            same_principal = span_eq(p[0].values[v], p[1].values[v]);
        CHECK_EQ_INT(same_principal, same_claims);
        for (int t = 0; t < 2; t++) {
            scope_principal_done(&p[t]);
            free(tok[t]);
        }
    }
    scope_unref(s);
}

static int trusted_eval(struct scope *s, const char *ip, const char *value, size_t *n)
{
    struct request *rq = request_new("/");
    struct scope_principal p;
    enum scope_failure why;
    int r;

    snprintf(rq->client_ip, sizeof(rq->client_ip), "%s", ip);
    if (value)
        CHECK_EQ_INT(request_add_header(rq, SPAN_LIT("X-Principal"), span_from_cstr(value)), 0);
    r = scope_eval(s, rq, NOW, &p, &why);
    *n = p.n;
    scope_principal_done(&p);
    request_free(rq);
    return r;
}

static void test_scope_trusted_networks(void)
{
    const char *nets[] = { "10.1.0.0/16", "fd00::/8", "192.0.2.7" };
    struct scope *s = NULL;
    char why[256];
    size_t n;

    CHECK_EQ_INT(scope_trusted_new("X-Principal", nets, 3, &s, why, sizeof(why)), 0);
    CHECK_EQ_INT(trusted_eval(s, "10.1.200.3", "alice", &n), 0);
    CHECK_EQ_INT(n, 3); /* its kind, the header's name, its value */
    CHECK_EQ_INT(trusted_eval(s, "::ffff:10.1.0.1", "alice", &n), 0);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(trusted_eval(s, "fd12::1", "alice", &n), 0);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(trusted_eval(s, "192.0.2.7", "alice", &n), 0);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(trusted_eval(s, "10.2.0.1", "alice", &n), 0); /* ignored: as if absent */
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(trusted_eval(s, "192.0.2.8", "alice", &n), 0);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(trusted_eval(s, "10.1.0.1", NULL, &n), 0);
    CHECK_EQ_INT(n, 0);
    scope_unref(s);
    for (size_t i = 0; i < 4; i++) {
        const char *bad[] = { "10.0.0.0/33", "10.0.0/8", "fd00::/129", "10.0.0.0/x" };

        CHECK_EQ_INT(scope_trusted_new("X-P", &bad[i], 1, &s, why, sizeof(why)), -EINVAL);
        CHECK(strstr(why, bad[i]) != NULL);
    }
}

static void test_scope_config_problems(void)
{
    struct scope_jwt_config c = { .issuer = ISS };
    struct scope *s = NULL;
    char why[256];

    CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), -EINVAL); /* no keys */
    c.secret_file = secret_file();
    c.keys_file = secret_file();
    CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), -EINVAL); /* two */
    c.keys_file = NULL;
    c.issuer = NULL;
    CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "issuer") != NULL);
    c.issuer = ISS;
    c.secret_file = NULL;
    c.keys_url = "http://example.com/jwks";
    CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "https://") != NULL);
    /* loopback in name only, user info, another scheme: refused before any fetch */
    static const char *const bad[] = { "http://127.0.0.1@evil.example/jwks",
                                       "http://127.evil.example/jwks",
                                       "https://user:pw@login.example.com/jwks",
                                       "ftp://127.0.0.1/jwks",
                                       "http://[::2]/jwks",
                                       "jwks.json" };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        c.keys_url = bad[i];
        CHECK_EQ_INT(scope_jwt_new(&c, &s, why, sizeof(why)), -EINVAL);
    }
}

static void test_scope_cleanup(void)
{
    CHECK(unlink(secret_file()) == 0);
    scope_shutdown();
}

TEST_MAIN(test_scope_verifies_and_names_the_principal, test_scope_refusals,
          test_scope_same_principal_iff_same_claims, test_scope_trusted_networks,
          test_scope_config_problems, test_scope_cleanup)
