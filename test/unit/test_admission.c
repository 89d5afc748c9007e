/* SPDX-License-Identifier: MIT */
/* Admission (README.md, What it does with each request; doc/configuration.md,
 * Key sources; doc/guarantees.md, Threat model): what a request is, decided
 * from its head and its body through admission.h alone. Malformed heads first,
 * then passthrough or enforcement, the body limits and the streaming decision,
 * the key of each source (header, composite, JSON, fingerprint fallback) with
 * its store key and scope, the TTL header, and the absolute-form target. */
#include <unistd.h>

#include "check.h"
#include "idemproxy/admission.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"

#define PREFIX "test:"
#define DEFAULT_TTL_MS 600000u
#define MAX_TTL_MS 3600000u
#define MAX_BODY 16
#define MAX_PASSTHROUGH 100000

/* --max-body 16 (keyed), --max-passthrough-body 100000, two scope headers,
 * and a route for each key source and each way out of enforcement. */
static const char *const yaml =
    "upstream: http://127.0.0.1:1\n"
    "max-body: 16\n"
    "max-passthrough-body: 100000\n"
    "ttl: 600\n"
    "max-ttl: 3600\n"
    "scope-header: [Authorization, X-Tenant]\n"
    "routes:\n"
    "  - {name: json, match: {path: /json}, key: {json: /id}}\n"
    "  - {name: json-required, match: {path: /json-required}, key: {json: /id},\n"
    "     require-key: true}\n"
    "  - {name: json-fallback, match: {path: /json-fallback},\n"
    "     key: {json: /id, fallback: fingerprint}}\n"
    "  - {name: fallback, match: {path: /fallback},\n"
    "     key: {header: Idempotency-Key, fallback: fingerprint}}\n"
    "  - {name: events, match: {path: /events}, key: {headers: [ce-source, ce-id]}}\n"
    "  - {name: required, match: {path: /required}, require-key: true}\n"
    "  - {name: internal, match: {path: /internal/*}, enforce: false}\n"
    "  - {name: host, match: {path: /h, host: api.example}}\n"
    "  - {name: unlimited, match: {path: /unlimited}, max-passthrough-body: 0}\n"
    "  - {name: no-ttl-header, match: {path: /no-ttl-header}, ttl-header: \"\"}\n"
    "  - {name: puts, match: {path: /puts}, methods: [PUT]}\n";

static struct config cfg;
static struct route_table *routes;

/* Loads <yaml> into <cfg> and <routes>; down() frees them. */
static void up(void)
{
    char path[64] = "/tmp/test_admission_XXXXXX";
    char *argv[] = { "idemproxy", "--config", path, NULL };
    char *envp[] = { NULL };
    char err[1024] = "";
    int fd = mkstemp(path);

    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK_EQ_INT(write(fd, yaml, strlen(yaml)), (long long)strlen(yaml));
    close(fd);
    memset(&cfg, 0, sizeof(cfg));
    routes = NULL;
    CHECK_EQ_INT(config_file_load(&cfg, &routes, 3, argv, envp, err, sizeof(err)), 0);
    CHECK_EQ_STR(err, "");
    unlink(path);
}

static void down(void)
{
    route_table_unref(routes);
    routes = NULL;
    config_done(&cfg);
}

/* A request as the front end builds it: HTTP/1.1, "Host: api.test" unless
 * <host> is false, then <headers>, "Name: value" strings, NULL-terminated. */
static struct request *request_host(const char *method, const char *target, bool host,
                                    const char *const *headers)
{
    struct request *rq = request_new(target);

    CHECK(rq != NULL);
    if (!rq)
        abort();
    rq->method = span_from_cstr(method);
    rq->http11 = true;
    if (host)
        CHECK_EQ_INT(request_add_header(rq, SPAN_LIT("Host"), SPAN_LIT("api.test")), 0);
    for (; headers && *headers; headers++) {
        const char *colon = strchr(*headers, ':');
        struct span name = { *headers, (size_t)(colon - *headers) };

        CHECK_EQ_INT(request_add_header(rq, name, span_from_cstr(colon + 2)), 0);
    }
    return rq;
}

static struct request *request(const char *method, const char *target, const char *const *headers)
{
    return request_host(method, target, true, headers);
}

#define H(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* admission_head() of <rq> on a zeroed <a>, with a reference of <routes>;
 * <ref> starts poisoned (its <why> too), so that a refusal must fill it. */
static int head_with(struct admission *a, const struct request *rq, bool enabled,
                     struct admission_refusal *ref)
{
    memset(a, 0, sizeof(*a));
    memset(ref, 0x5a, sizeof(*ref));
    ref->detail[0] = '\0';
    ref->why = "poison";
    return admission_head(a, route_table_ref(routes), rq, PREFIX, enabled, ref);
}

static int head(struct admission *a, const struct request *rq, struct admission_refusal *ref)
{
    return head_with(a, rq, true, ref);
}

/* Feeds <body> in one chunk. */
static int body(struct admission *a, const char *p, struct admission_refusal *ref)
{
    return admission_body(a, p, strlen(p), ref);
}

static bool span_is(struct span s, const char *str)
{
    return s.base && s.len == strlen(str) && memcmp(s.base, str, s.len) == 0;
}

static struct span opt(const char *s) { return s ? span_from_cstr(s) : (struct span){ NULL, 0 }; }

/* The store key of <key> under PREFIX, in the scope of the --scope-header
 * values <auth> and <tenant> (NULL: absent) and the source's <tag> (base
 * NULL: none, the key header's). The caller frees it. */
static char *store_key_of(const char *auth, const char *tenant, struct span tag, const char *key)
{
    struct span v[3] = { opt(auth), opt(tenant), tag };
    char scope[IDEMKEY_SCOPE_HEX + 1];
    char *sk = NULL;

    CHECK_EQ_INT(idemkey_scope(v, tag.base ? 3 : 2, scope), 0);
    CHECK_EQ_INT(idemkey_store_key(SPAN_LIT(PREFIX), scope, span_from_cstr(key), &sk), 0);
    return sk;
}

/* Whether <a>'s store key is that of store_key_of(). */
static bool has_store_key(const struct admission *a, const char *auth, const char *tenant,
                          struct span tag, const char *key)
{
    char *want = store_key_of(auth, tenant, tag, key);
    bool eq = want && a->store_key && strcmp(a->store_key, want) == 0;

    if (!eq)
        fprintf(stderr, "  store key %s, want %s\n", a->store_key ? a->store_key : "(null)",
                want ? want : "(null)");
    free(want);
    return eq;
}

/* The fingerprint of <method>, <target> and <b>, made apart from admission. */
static void digest_of(const char *method, const char *target, const char *b,
                      uint8_t ret[FINGERPRINT_LEN])
{
    struct fingerprint fp = { 0 };

    CHECK_EQ_INT(fingerprint_init(&fp, span_from_cstr(method), span_from_cstr(target)), 0);
    CHECK_EQ_INT(fingerprint_update(&fp, b, strlen(b)), 0);
    CHECK_EQ_INT(fingerprint_final(&fp, ret), 0);
    fingerprint_done(&fp);
}

static bool is_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i])
            return false;
    }
    return true;
}

/* Checks a refusal of a malformed request: <status>, its problem, <why>. */
static void check_bad_request(const struct admission_refusal *ref, unsigned status, const char *why)
{
    char detail[256];

    CHECK_EQ_INT(ref->outcome, OUTCOME_BAD_REQUEST);
    CHECK_EQ_INT(ref->status, status);
    CHECK_EQ_INT(ref->problem, status == 501 ? PROBLEM_NOT_IMPLEMENTED : PROBLEM_BAD_REQUEST);
    CHECK(ref->why != NULL);
    if (why && ref->why)
        CHECK_EQ_STR(ref->why, why);
    snprintf(detail, sizeof(detail), "The request is malformed: %s.", ref->why ? ref->why : "");
    CHECK_EQ_STR(ref->detail, detail);
}

/* ---- the head ---- */

static void test_admission_refuses_a_malformed_head_first(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;

    up();
    /* hidden bytes: refused before its (valid) key is read, in its route's dialect */
    rq = request("POST", "/json?x=1", H("Idempotency-Key: k"));
    rq->head_error = "a NUL the HTTP layer hid";
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 400, "a NUL the HTTP layer hid");
    CHECK(a.route && strcmp(a.route->name, "json") == 0); /* matched up to the '?' */
    CHECK(!a.enforced && a.store_key == NULL);
    admission_done(&a);
    request_free(rq);

    rq = request("POST", "/pay", H("Idempotency-Key: k", "X: a\rb"));
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 400, NULL);
    CHECK(a.store_key == NULL && a.key.key.base == NULL);
    admission_done(&a);
    request_free(rq);

    /* a malformed request with a bad key is a bad request, not a bad key */
    rq = request("POST", "/pay", H("Idempotency-Key: \"a b\"", "Content-Length: +5"));
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 400, NULL);
    admission_done(&a);
    request_free(rq);

    rq = request("POST", "/pay", H("Content-Length: 3", "Transfer-Encoding: chunked"));
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 400, NULL);
    admission_done(&a);
    request_free(rq);

    rq = request("POST", "/pay", H("Transfer-Encoding: gzip"));
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 501, NULL);
    admission_done(&a);
    request_free(rq);

    rq = request("CONNECT", "127.0.0.1:443", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 501, NULL);
    CHECK(a.route && strcmp(a.route->name, ROUTE_DEFAULT) == 0);
    admission_done(&a);
    request_free(rq);

    /* HTTP/1.1 needs a Host, HTTP/1.0 does not */
    rq = request_host("GET", "/pay", false, NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    check_bad_request(&ref, 400, NULL);
    admission_done(&a);
    rq->http11 = false;
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    admission_done(&a);
    request_free(rq);
    down();
}

/* ---- passthrough ---- */

static void test_admission_passes_through_a_request_without_a_key(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    char big[MAX_BODY * 2 + 1];

    up();
    rq = request("POST", "/pay", H("Content-Length: 32"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(!a.enforced && !a.key_deferred);
    CHECK(a.store_key == NULL && a.key.key.base == NULL);
    CHECK_EQ_INT(a.body_length, 32);
    CHECK(!a.streams);
    CHECK_EQ_INT(a.ttl_ms, 0);
    CHECK(a.fwd_target.base == rq->target.base && a.fwd_host.base == NULL);
    /* --max-body is a keyed request's: a passthrough body may pass it */
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK_EQ_INT(body(&a, big, &ref), 0);
    CHECK_EQ_INT(a.body.len, sizeof(big) - 1);
    CHECK(a.fp.md == NULL); /* nothing is hashed */
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    CHECK(!a.enforced && a.store_key == NULL);
    CHECK(is_zero(a.digest, FINGERPRINT_LEN));
    admission_done(&a);
    request_free(rq);

    /* no body at all */
    rq = request("POST", "/pay", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(!a.enforced);
    CHECK(a.body_length == UINT64_MAX && !a.streams);
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    admission_done(&a);
    request_free(rq);
    down();
}

/* Admission of <method> <target> with <headers> is passthrough, its key unread. */
static void check_passthrough(const char *method, const char *target, const char *const *headers,
                              bool enabled)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq = request(method, target, headers);

    CHECK_EQ_INT(head_with(&a, rq, enabled, &ref), 0);
    CHECK(!a.enforced && !a.key_deferred);
    CHECK(a.store_key == NULL && a.key.key.base == NULL);
    CHECK(a.fp.md == NULL);
    CHECK_EQ_INT(body(&a, "{\"id\":\"x\"}", &ref), 0);
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    CHECK(!a.enforced && a.store_key == NULL);
    admission_done(&a);
    request_free(rq);
}

static void test_admission_passes_through_where_the_rules_do_not_apply(void)
{
    up();
    /* the proxy's rules off (enabled false): even a bad key is not read */
    check_passthrough("POST", "/pay", H("Idempotency-Key: k"), false);
    check_passthrough("POST", "/pay", H("Idempotency-Key: \"a b\""), false);
    check_passthrough("POST", "/fallback", NULL, false);
    check_passthrough("POST", "/json", NULL, false);
    /* a route with enforce: false */
    check_passthrough("POST", "/internal/x", H("Idempotency-Key: k"), true);
    check_passthrough("POST", "/internal/x", H("Idempotency-Key: \"a b\""), true);
    /* a method outside the route's methods, compared as sent */
    check_passthrough("GET", "/pay", H("Idempotency-Key: k"), true);
    check_passthrough("DELETE", "/pay", H("Idempotency-Key: \"a b\""), true);
    check_passthrough("post", "/pay", H("Idempotency-Key: k"), true);
    check_passthrough("POST", "/puts", H("Idempotency-Key: k"), true);
    check_passthrough("GET", "/json", NULL, true);
    /* no key, and none required */
    check_passthrough("POST", "/pay", NULL, true);
    check_passthrough("POST", "/events", H("ce-source: s"), true); /* one of two */
    check_passthrough("POST", "/events", H("ce-source: s", "ce-id: 1", "ce-id: 2"), true);
    down();
}

/* The passthrough decided from the head of POST <target> with <headers>:
 * its body length and whether it streams. */
static void check_stream(const char *target, const char *const *headers, uint64_t length,
                         bool streams)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq = request("POST", target, headers);

    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(!a.enforced);
    CHECK(a.body_length == length);
    CHECK_EQ_INT(a.streams, streams);
    if (a.body_length != length || a.streams != streams)
        fprintf(stderr, "  %s %s: body_length %llu\n", target, headers ? headers[0] : "",
                (unsigned long long)a.body_length);
    CHECK(a.body.limit == SIZE_MAX);
    admission_done(&a);
    request_free(rq);
}

static void test_admission_streams_a_large_or_unknown_passthrough_body(void)
{
    up();
    CHECK_EQ_INT(ADMISSION_STREAM_MIN, 65536);
    check_stream("/pay", H("Content-Length: 0"), 0, false);
    check_stream("/pay", H("Content-Length: 65536"), 65536, false);
    check_stream("/pay", H("Content-Length: 65537"), 65537, true);
    check_stream("/pay", H("Content-Length: 100000"), MAX_PASSTHROUGH, true); /* at the limit */
    check_stream("/pay", H("Content-Length: 7", "Content-Length: 7"), 7, false);
    check_stream("/pay", H("Transfer-Encoding: chunked"), UINT64_MAX, true);
    check_stream("/pay", NULL, UINT64_MAX, false);
    /* max-passthrough-body 0: no limit */
    check_stream("/unlimited", H("Content-Length: 1000000000000"), 1000000000000ull, true);
    check_stream("/unlimited", H("Content-Length: 99999999999999999999999"), UINT64_MAX, true);
    down();
}

/* Admission of POST <target> with <headers> is refused at its head with 413
 * and <detail>. */
static void check_too_large(const char *method, const char *target, const char *const *headers,
                            const char *detail)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq = request(method, target, headers);

    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    CHECK_EQ_INT(ref.problem, PROBLEM_PAYLOAD_TOO_LARGE);
    CHECK_EQ_INT(ref.outcome, OUTCOME_TOO_LARGE);
    CHECK_EQ_STR(ref.detail, detail);
    CHECK(ref.why == NULL);
    CHECK(a.route != NULL);
    admission_done(&a);
    request_free(rq);
}

#define KEYED_TOO_LARGE "The request body is larger than this proxy accepts (--max-body)."

static void test_admission_refuses_an_announced_body_over_its_limit(void)
{
    up();
    /* passthrough: --max-passthrough-body */
    check_too_large("POST", "/pay", H("Content-Length: 100001"), ADMISSION_PASSTHROUGH_TOO_LARGE);
    check_too_large("GET", "/pay", H("Idempotency-Key: k", "Content-Length: 100001"),
                    ADMISSION_PASSTHROUGH_TOO_LARGE);
    check_too_large("POST", "/pay", H("Content-Length: 99999999999999999999999"),
                    ADMISSION_PASSTHROUGH_TOO_LARGE); /* past UINT64_MAX is still large */
    /* keyed, or keyed once the body is in: --max-body */
    check_too_large("POST", "/pay", H("Idempotency-Key: k", "Content-Length: 17"), KEYED_TOO_LARGE);
    check_too_large("POST", "/pay", H("Idempotency-Key: k", "Content-Length: 99999999999999999999"),
                    KEYED_TOO_LARGE);
    check_too_large("POST", "/json", H("Content-Length: 17"), KEYED_TOO_LARGE);
    check_too_large("POST", "/fallback", H("Content-Length: 17"), KEYED_TOO_LARGE);
    check_too_large("POST", "/unlimited", H("Idempotency-Key: k", "Content-Length: 17"),
                    KEYED_TOO_LARGE);
    down();
}

/* ---- keyed by a header ---- */

static void test_admission_keys_a_request_by_its_header(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    uint8_t want[FINGERPRINT_LEN];

    up();
    rq = request("POST", "/pay?x=1",
                 H("Idempotency-Key: k1", "Authorization: Bearer a", "Content-Length: 16"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_STR(a.route->name, ROUTE_DEFAULT);
    CHECK(a.enforced && !a.key_deferred && !a.streams);
    CHECK(span_is(a.key.key, "k1"));
    CHECK(has_store_key(&a, "Bearer a", NULL, (struct span){ NULL, 0 }, "k1"));
    CHECK(strncmp(a.store_key, PREFIX, strlen(PREFIX)) == 0);
    CHECK_EQ_INT(a.ttl_ms, DEFAULT_TTL_MS);
    CHECK_EQ_INT(a.body.limit, MAX_BODY);
    CHECK(a.fp.md != NULL);
    /* the body is kept and hashed, chunk by chunk */
    CHECK_EQ_INT(body(&a, "0123456789", &ref), 0);
    CHECK_EQ_INT(body(&a, "abcdef", &ref), 0);
    CHECK_EQ_INT(a.body.len, 16);
    CHECK(a.body.data && memcmp(a.body.data, "0123456789abcdef", 16) == 0);
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    CHECK(a.enforced && !a.key_deferred);
    digest_of("POST", "/pay?x=1", "0123456789abcdef", want);
    CHECK_EQ_MEM(a.digest, want, FINGERPRINT_LEN);
    admission_done(&a);
    request_free(rq);

    /* the sf-string form is the same key; a required key that is there */
    rq = request("PUT", "/required", H("Idempotency-Key: \"k1\"", "Authorization: Bearer a"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && span_is(a.key.key, "k1"));
    CHECK(has_store_key(&a, "Bearer a", NULL, (struct span){ NULL, 0 }, "k1"));
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    digest_of("PUT", "/required", "", want);
    CHECK_EQ_MEM(a.digest, want, FINGERPRINT_LEN);
    admission_done(&a);
    request_free(rq);

    /* a body of unknown length is read whole: it never streams */
    rq = request("PUT", "/puts", H("Idempotency-Key: k", "Transfer-Encoding: chunked"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && !a.streams);
    admission_done(&a);
    request_free(rq);
    down();
}

static void test_admission_refuses_a_body_over_max_body(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;

    up();
    rq = request("POST", "/pay", H("Idempotency-Key: k", "Transfer-Encoding: chunked"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_INT(body(&a, "0123456789", &ref), 0);
    CHECK_EQ_INT(body(&a, "abcdefg", &ref), 1); /* 17 bytes */
    CHECK_EQ_INT(ref.problem, PROBLEM_PAYLOAD_TOO_LARGE);
    CHECK_EQ_INT(ref.outcome, OUTCOME_TOO_LARGE);
    CHECK_EQ_STR(ref.detail, KEYED_TOO_LARGE);
    CHECK(a.body.data == NULL && a.body.len == 0); /* dropped */
    admission_done(&a);
    request_free(rq);

    /* a body whose key it holds has the same limit */
    rq = request("POST", "/json", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_INT(body(&a, "{\"id\":\"0123456789\"}", &ref), 1);
    CHECK_EQ_INT(ref.outcome, OUTCOME_TOO_LARGE);
    admission_done(&a);
    request_free(rq);
    down();
}

/* Admission of <method> <target> with <headers> refuses its key: <problem>,
 * <outcome>, and a detail holding <detail>. */
static void check_key_refused(const char *method, const char *target, const char *const *headers,
                              enum problem problem, enum outcome outcome, const char *detail)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq = request(method, target, headers);

    CHECK_EQ_INT(head(&a, rq, &ref), 1);
    CHECK_EQ_INT(ref.problem, problem);
    CHECK_EQ_INT(ref.outcome, outcome);
    CHECK(strstr(ref.detail, detail) != NULL);
    if (!strstr(ref.detail, detail))
        fprintf(stderr, "  detail \"%s\", want \"%s\"\n", ref.detail, detail);
    CHECK(ref.why == NULL);
    CHECK(a.store_key == NULL);
    CHECK(a.route != NULL);
    admission_done(&a);
    request_free(rq);
}

static void test_admission_refuses_a_missing_or_bad_key(void)
{
    up();
    check_key_refused("POST", "/pay", H("Idempotency-Key: \"a b\""), PROBLEM_KEY_INVALID,
                      OUTCOME_INVALID_KEY, "The key of the Idempotency-Key header is 1-255");
    check_key_refused("POST", "/pay", H("Idempotency-Key: a,b"), PROBLEM_KEY_INVALID,
                      OUTCOME_INVALID_KEY, "Idempotency-Key");
    check_key_refused("PATCH", "/pay", H("Idempotency-Key: a", "idempotency-key: a"),
                      PROBLEM_KEY_INVALID, OUTCOME_INVALID_KEY,
                      "Send exactly one Idempotency-Key header.");
    check_key_refused("POST", "/required", NULL, PROBLEM_KEY_MISSING, OUTCOME_MISSING_KEY,
                      "This request must carry an Idempotency-Key header.");
    check_key_refused("POST", "/events", H("ce-source: s", "ce-id: a b"), PROBLEM_KEY_INVALID,
                      OUTCOME_INVALID_KEY, "Each key header's value is 1-255");
    down();
}

/* ---- the store key and its scope ---- */

/* The store key admission makes for POST /pay with <headers>; the caller frees it. */
static char *store_key(const char *const *headers)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq = request("POST", "/pay", headers);
    char *sk = NULL;

    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && a.store_key != NULL);
    if (a.store_key)
        sk = strdup(a.store_key);
    admission_done(&a);
    request_free(rq);
    return sk;
}

static bool same(char *x, char *y)
{
    bool eq = x && y && strcmp(x, y) == 0;

    free(x);
    free(y);
    return eq;
}

static void test_admission_scopes_the_store_key(void)
{
    up();
    CHECK(same(store_key(H("Idempotency-Key: k", "Authorization: A", "X-Tenant: T")),
               store_key_of("A", "T", (struct span){ NULL, 0 }, "k")));
    CHECK(same(store_key(H("Idempotency-Key: k")),
               store_key_of(NULL, NULL, (struct span){ 0 }, "k")));
    /* the same key under another client is another store key */
    CHECK(!same(store_key(H("Idempotency-Key: k", "Authorization: A")),
                store_key(H("Idempotency-Key: k", "Authorization: B"))));
    CHECK(!same(store_key(H("Idempotency-Key: k", "X-Tenant: T")),
                store_key(H("Idempotency-Key: k", "X-Tenant: U"))));
    /* absent differs from empty, and each header keeps its place */
    CHECK(!same(store_key(H("Idempotency-Key: k")),
                store_key(H("Idempotency-Key: k", "Authorization: "))));
    CHECK(!same(store_key(H("Idempotency-Key: k", "Authorization: A")),
                store_key(H("Idempotency-Key: k", "X-Tenant: A"))));
    /* several empty instances are present, though empty */
    CHECK(!same(store_key(H("Idempotency-Key: k")),
                store_key(H("Idempotency-Key: k", "X-Tenant: ", "X-Tenant: "))));
    /* several instances of a scope header are one list */
    CHECK(same(
        store_key(H("Idempotency-Key: k", "Authorization: a", "X-Tenant: T", "authorization: b")),
        store_key_of("a,b", "T", (struct span){ NULL, 0 }, "k")));
    down();
}

/* ---- the TTL a request asks for ---- */

/* The TTL admission keeps for POST <target> with "X-TTL: <ttl>" (NULL: none). */
static uint64_t ttl_of(const char *target, const char *ttl)
{
    struct admission a;
    struct admission_refusal ref;
    char field[128];
    struct request *rq;
    uint64_t ms;

    snprintf(field, sizeof(field), "X-TTL: %s", ttl ? ttl : "");
    rq = request("POST", target, ttl ? H("Idempotency-Key: k", field) : H("Idempotency-Key: k"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced);
    ms = a.ttl_ms;
    admission_done(&a);
    request_free(rq);
    return ms;
}

static void test_admission_takes_the_ttl_a_request_asks_for(void)
{
    up();
    CHECK_EQ_INT(ttl_of("/pay", NULL), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "60"), 60000);
    CHECK_EQ_INT(ttl_of("/pay", "1"), 1000);
    CHECK_EQ_INT(ttl_of("/pay", "3600"), MAX_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "3601"), MAX_TTL_MS); /* capped at --max-ttl */
    CHECK_EQ_INT(ttl_of("/pay", "99999999999999999999999"), MAX_TTL_MS);
    /* not a positive integer: --ttl */
    CHECK_EQ_INT(ttl_of("/pay", "0"), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", ""), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "-5"), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "+5"), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "5s"), DEFAULT_TTL_MS);
    CHECK_EQ_INT(ttl_of("/pay", "1.5"), DEFAULT_TTL_MS);
    /* ttl-header: "" turns the header off */
    CHECK_EQ_INT(ttl_of("/no-ttl-header", "60"), DEFAULT_TTL_MS);
    down();
}

/* ---- keys the body gives ---- */

/* Admits POST <target> with <headers> and <b>: head, body, end. Returns what
 * admission_end() returned (or 2 when the head or the body refused it). */
static int admit(struct admission *a, const char *target, const char *const *headers, const char *b,
                 struct admission_refusal *ref, struct request **ret_rq)
{
    struct request *rq = request("POST", target, headers);

    *ret_rq = rq;
    if (head(a, rq, ref) || body(a, b, ref))
        return 2;
    return admission_end(a, rq, ref);
}

static void test_admission_reads_a_key_from_a_json_body(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    uint8_t want[FINGERPRINT_LEN];
    char *header_keyed;

    up();
    rq = request("POST", "/json", H("Idempotency-Key: ignored"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && a.key_deferred && a.store_key == NULL); /* decided by the body */
    CHECK(!a.streams);
    CHECK_EQ_INT(a.ttl_ms, DEFAULT_TTL_MS);
    CHECK_EQ_INT(body(&a, "{\"id\":\"abc\"}", &ref), 0);
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    CHECK(a.enforced && !a.key_deferred && !a.key.fingerprint);
    CHECK(span_is(a.key.key, "abc"));
    CHECK(has_store_key(&a, NULL, NULL, keysource_tag(&a.route->key, &a.key), "abc"));
    /* a JSON key never shares a store key with the same header key */
    header_keyed = store_key_of(NULL, NULL, (struct span){ NULL, 0 }, "abc");
    CHECK(a.store_key && header_keyed && strcmp(a.store_key, header_keyed) != 0);
    free(header_keyed);
    digest_of("POST", "/json", "{\"id\":\"abc\"}", want);
    CHECK_EQ_MEM(a.digest, want, FINGERPRINT_LEN);
    admission_done(&a);
    request_free(rq);

    CHECK_EQ_INT(admit(&a, "/json", NULL, "{\"id\":7}", &ref, &rq), 0);
    CHECK(a.enforced && span_is(a.key.key, "7") && a.store_key != NULL);
    admission_done(&a);
    request_free(rq);

    /* nothing at the pointer, or no JSON: passthrough, unless a key is required */
    CHECK_EQ_INT(admit(&a, "/json", NULL, "{\"x\":1}", &ref, &rq), 0);
    CHECK(!a.enforced && !a.key_deferred && a.store_key == NULL);
    admission_done(&a);
    request_free(rq);
    CHECK_EQ_INT(admit(&a, "/json", NULL, "not json", &ref, &rq), 0);
    CHECK(!a.enforced && a.store_key == NULL);
    admission_done(&a);
    request_free(rq);
    CHECK_EQ_INT(admit(&a, "/json-required", NULL, "{\"x\":1}", &ref, &rq), 1);
    CHECK_EQ_INT(ref.problem, PROBLEM_KEY_MISSING);
    CHECK_EQ_INT(ref.outcome, OUTCOME_MISSING_KEY);
    CHECK(strstr(ref.detail, "JSON body with its idempotency key at /id") != NULL);
    admission_done(&a);
    request_free(rq);

    /* a value that is no key */
    CHECK_EQ_INT(admit(&a, "/json", NULL, "{\"id\":true}", &ref, &rq), 1);
    CHECK_EQ_INT(ref.problem, PROBLEM_KEY_INVALID);
    CHECK_EQ_INT(ref.outcome, OUTCOME_INVALID_KEY);
    CHECK(strstr(ref.detail, "The key in the JSON body") != NULL);
    CHECK(a.store_key == NULL);
    admission_done(&a);
    request_free(rq);
    down();
}

/* The key admission makes for POST <target> with <b> and no key header: its
 * store key (the caller frees it); whether the fingerprint stands for it in
 * <ret_fp>. */
static char *body_keyed(const char *target, const char *b, bool *ret_fp)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    char *sk = NULL;

    CHECK_EQ_INT(admit(&a, target, NULL, b, &ref, &rq), 0);
    CHECK(a.enforced && !a.key_deferred && a.store_key != NULL);
    *ret_fp = a.key.fingerprint;
    if (a.store_key)
        sk = strdup(a.store_key);
    admission_done(&a);
    request_free(rq);
    return sk;
}

static void test_admission_keys_by_the_fingerprint_without_a_key(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    uint8_t want[FINGERPRINT_LEN];
    char hex[FINGERPRINT_HEX + 1];
    bool fp;

    up();
    rq = request("POST", "/fallback", H("Authorization: A"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && a.key_deferred && a.store_key == NULL);
    CHECK_EQ_INT(a.ttl_ms, DEFAULT_TTL_MS);
    CHECK_EQ_INT(body(&a, "x=1", &ref), 0);
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    CHECK(a.enforced && !a.key_deferred && a.key.fingerprint);
    digest_of("POST", "/fallback", "x=1", want);
    CHECK_EQ_MEM(a.digest, want, FINGERPRINT_LEN);
    fingerprint_hex(want, hex);
    CHECK(span_is(a.key.key, hex));
    CHECK(has_store_key(&a, "A", NULL, keysource_tag(&a.route->key, &a.key), hex));
    admission_done(&a);
    request_free(rq);

    /* a key header, when there is one, is the key */
    CHECK_EQ_INT(admit(&a, "/fallback", H("Idempotency-Key: k"), "x=1", &ref, &rq), 0);
    CHECK(a.enforced && !a.key.fingerprint && span_is(a.key.key, "k"));
    CHECK(has_store_key(&a, NULL, NULL, (struct span){ NULL, 0 }, "k"));
    admission_done(&a);
    request_free(rq);

    /* the same request is the same key, another is another */
    CHECK(same(body_keyed("/fallback", "x=1", &fp), body_keyed("/fallback", "x=1", &fp)));
    CHECK(fp);
    CHECK(!same(body_keyed("/fallback", "x=1", &fp), body_keyed("/fallback", "x=2", &fp)));
    /* JSON first, then the fingerprint */
    free(body_keyed("/json-fallback", "{\"id\":\"j\"}", &fp));
    CHECK(!fp);
    free(body_keyed("/json-fallback", "{\"x\":1}", &fp));
    CHECK(fp);
    free(body_keyed("/json-fallback", "not json", &fp));
    CHECK(fp);
    down();
}

static void test_admission_keys_a_request_by_several_headers(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;

    up();
    rq = request("POST", "/events", H("ce-source: src", "ce-id: 42", "X-Tenant: T"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(a.enforced && !a.key_deferred);
    CHECK(span_is(a.key.key, "src 42"));
    CHECK(has_store_key(&a, NULL, "T", keysource_tag(&a.route->key, &a.key), "src 42"));
    CHECK(keysource_tag(&a.route->key, &a.key).base != NULL);
    admission_done(&a);
    request_free(rq);
    down();
}

/* ---- what is forwarded ---- */

static void test_admission_forwards_an_absolute_form_target_as_origin_form(void)
{
    struct admission a;
    struct admission_refusal ref;
    struct request *rq;
    uint8_t want[FINGERPRINT_LEN];

    up();
    /* no path: "/" goes first, and that is what is fingerprinted */
    rq = request("POST", "http://api.example:8443?q=1", H("Idempotency-Key: k"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(span_is(a.fwd_target, "/?q=1"));
    CHECK(a.fwd_target_buf != NULL && a.fwd_target.base == a.fwd_target_buf);
    CHECK(span_is(a.fwd_host, "api.example:8443"));
    CHECK_EQ_INT(admission_end(&a, rq, &ref), 0);
    digest_of("POST", "/?q=1", "", want);
    CHECK_EQ_MEM(a.digest, want, FINGERPRINT_LEN);
    admission_done(&a);
    request_free(rq);

    /* routed on the target's path and host, not the client's Host */
    rq = request("POST", "http://api.example/h?x=1", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_STR(a.route->name, "host");
    CHECK(span_is(a.fwd_target, "/h?x=1"));
    CHECK(a.fwd_target_buf == NULL); /* borrowed from the target */
    CHECK(a.fwd_target.base > rq->target.base &&
          a.fwd_target.base < rq->target.base + rq->target.len);
    CHECK(span_is(a.fwd_host, "api.example"));
    admission_done(&a);
    request_free(rq);
    rq = request("POST", "http://other.example/h", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_STR(a.route->name, ROUTE_DEFAULT);
    admission_done(&a);
    request_free(rq);

    /* origin-form: the target as sent and the client's Host */
    rq = request_host("POST", "/h", false, H("Host: api.example"));
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK_EQ_STR(a.route->name, "host");
    CHECK(a.fwd_target.base == rq->target.base && a.fwd_target.len == rq->target.len);
    CHECK(a.fwd_host.base == NULL && a.fwd_target_buf == NULL);
    admission_done(&a);
    request_free(rq);
    rq = request("OPTIONS", "*", NULL);
    CHECK_EQ_INT(head(&a, rq, &ref), 0);
    CHECK(span_is(a.fwd_target, "*"));
    admission_done(&a);
    request_free(rq);
    down();
}

TEST_MAIN(test_admission_refuses_a_malformed_head_first,
          test_admission_passes_through_a_request_without_a_key,
          test_admission_passes_through_where_the_rules_do_not_apply,
          test_admission_streams_a_large_or_unknown_passthrough_body,
          test_admission_refuses_an_announced_body_over_its_limit,
          test_admission_keys_a_request_by_its_header, test_admission_refuses_a_body_over_max_body,
          test_admission_refuses_a_missing_or_bad_key, test_admission_scopes_the_store_key,
          test_admission_takes_the_ttl_a_request_asks_for,
          test_admission_reads_a_key_from_a_json_body,
          test_admission_keys_by_the_fingerprint_without_a_key,
          test_admission_keys_a_request_by_several_headers,
          test_admission_forwards_an_absolute_form_target_as_origin_form)
