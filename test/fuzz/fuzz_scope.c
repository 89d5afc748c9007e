/* SPDX-License-Identifier: MIT */
/* A bearer token (scope_eval, doc/configuration.md, Scope): every byte of it
 * comes from a client, and reaches jansson and libcjose. Nothing crashes,
 * the answer is one of the documented ones, and a token verifies only when
 * its MAC is the secret's (checked here with OpenSSL, apart from the code
 * under test). */
#include <cjose/cjose.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "idemproxy/request.h"
#include "idemproxy/scope.h"

#define SECRET "fuzzing secret, thirty-two bytes or more"

static struct scope *the_scope(void)
{
    static struct scope *s;
    char path[64], why[256];
    FILE *f;

    if (s)
        return s;
    snprintf(path, sizeof(path), "/tmp/idem-fuzz-scope-%d", (int)getpid());
    f = fopen(path, "w");
    FUZZ_CHECK(f && fputs(SECRET "\n", f) >= 0 && fclose(f) == 0);
    FUZZ_CHECK(scope_jwt_new(&(struct scope_jwt_config){ .secret_file = path, .issuer = "i" }, &s,
                             why, sizeof(why)) == 0);
    unlink(path);
    return s;
}

/* Whether <tok>'s third part is the HMAC-SHA256 of its first two under SECRET. */
static bool mac_is_right(struct span tok)
{
    const char *dot = memchr(tok.base, '.', tok.len);
    const char *dot2 = dot ? memchr(dot + 1, '.', (size_t)(tok.base + tok.len - dot - 1)) : NULL;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned maclen = 0;
    uint8_t *sig = NULL;
    size_t siglen = 0;
    cjose_err err;
    bool ok;

    if (!dot2)
        return false;
    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (const unsigned char *)tok.base,
         (size_t)(dot2 - tok.base), mac, &maclen);
    if (!cjose_base64url_decode(dot2 + 1, (size_t)(tok.base + tok.len - dot2 - 1), &sig, &siglen,
                                &err))
        return false;
    ok = siglen == maclen && memcmp(sig, mac, maclen) == 0;
    cjose_get_dealloc()(sig);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct request *rq = request_new("/");
    struct scope_principal p;
    enum scope_failure why = SCOPE_FAILURE_MAX;
    struct span tok = { .base = (const char *)data, .len = size };
    char *value = malloc(size + 8);
    int r;

    FUZZ_CHECK(rq && value);
    memcpy(value, "Bearer ", 7);
    memcpy(value + 7, data, size);
    FUZZ_CHECK(request_add_header(rq, SPAN_LIT("Authorization"),
                                  (struct span){ .base = value, .len = size + 7 }) == 0);
    r = scope_eval(the_scope(), rq, 1800000000u, &p, &why);
    FUZZ_CHECK(r == 0 || r == 1 || r == -ENOMEM);
    FUZZ_CHECK(r != 1 || (unsigned)why < SCOPE_FAILURE_MAX);
    while (tok.len && tok.base[0] == ' ') /* "Bearer" and its spaces */
        tok.base++, tok.len--;
    if (r == 0 && p.n > 0) /* a principal only from a token the secret signed */
        FUZZ_CHECK(mac_is_right(tok));
    if (r == 0)
        scope_principal_done(&p);
    request_free(rq);
    free(value);
    return 0;
}
