/* SPDX-License-Identifier: MIT */
/* Routes and the configuration file (doc/configuration.md, Configuration
 * file): matching, the file's schema, precedence, and every problem as
 * FILE:LINE:COLUMN. */
#include <stdarg.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/route.h"

static char path[64];
static char err[8192];

/* Writes <yaml> to a temporary file, whose name is in <path>. */
static void write_file(const char *yaml)
{
    int fd;

    snprintf(path, sizeof(path), "/tmp/test_route_XXXXXX");
    fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK_EQ_INT(write(fd, yaml, strlen(yaml)), (long long)strlen(yaml));
    close(fd);
}

/* The routes of the last load(). */
static struct route_table *routes;

/* config_file_load() with --config <path> and the extra flags
 * (NULL-terminated), an empty environment; the table in <routes>. */
static int load(struct config *cfg, ...)
{
    char *argv[32] = { "idemproxy", "--config", path };
    char *env[] = { NULL };
    int argc = 3;
    va_list ap;
    char *a;

    va_start(ap, cfg);
    while ((a = va_arg(ap, char *)) && argc < 31)
        argv[argc++] = a;
    va_end(ap);
    memset(cfg, 0, sizeof(*cfg));
    err[0] = '\0';
    routes = NULL;
    return config_file_load(cfg, &routes, argc, argv, env, err, sizeof(err));
}

/* Frees what load() made. */
static void unload(struct config *cfg)
{
    route_table_unref(routes);
    routes = NULL;
    config_done(cfg);
}

static const struct route *match(const struct config *cfg, const char *method, const char *p,
                                 const char *host)
{
    (void)cfg;
    return route_match(routes, span_from_cstr(method), span_from_cstr(p),
                       host ? span_from_cstr(host) : (struct span){ NULL, 0 });
}

static const char *const example = "upstream: http://127.0.0.1:3000\n"
                                   "max-body: 2M\n"
                                   "scope-header: [Authorization, Stripe-Account]\n"
                                   "routes:\n"
                                   "  - name: payments\n"
                                   "    match: {methods: [POST], path: /v1/payments}\n"
                                   "    require-key: true\n"
                                   "  - name: stripe-webhooks\n"
                                   "    match: {methods: [post], path: /webhooks/stripe}\n"
                                   "    key: {json: /id}\n"
                                   "    scope-header: []\n"
                                   "  - name: cloudevents\n"
                                   "    match: {path: /events/*}\n"
                                   "    key: {headers: [ce-source, ce-id]}\n"
                                   "  - name: legacy\n"
                                   "    match: {path: /v1/*, host: api.example.com}\n"
                                   "    key: {header: X-Idempotency, fallback: fingerprint}\n"
                                   "    errors: stripe\n"
                                   "    ttl: 60\n"
                                   "  - name: internal\n"
                                   "    match: {path: /internal/*}\n"
                                   "    enforce: false\n";

static void test_route_file_builds_the_spec_example(void)
{
    struct config cfg;
    const struct route *rt;

    write_file(example);
    CHECK_EQ_INT(load(&cfg, NULL), 0);
    CHECK_EQ_STR(err, "");
    if (!routes)
        goto out;
    CHECK_EQ_INT(routes->nroutes, 5);
    CHECK_EQ_INT(cfg.route.max_body_bytes, 2 << 20);
    CHECK_EQ_INT(cfg.route.nscope_headers, 2);

    rt = match(&cfg, "POST", "/v1/payments", NULL);
    CHECK_EQ_STR(rt->name, "payments");
    CHECK(rt->settings.require_key && !cfg.route.require_key);
    CHECK_EQ_INT(rt->settings.max_body_bytes, 2 << 20); /* from the top level */
    CHECK_EQ_INT(rt->settings.nscope_headers, 2);
    CHECK_EQ_INT(rt->errors, PROBLEM_DIALECT_PROBLEM);

    rt = match(&cfg, "POST", "/webhooks/stripe", NULL);
    CHECK_EQ_STR(rt->name, "stripe-webhooks");
    CHECK_EQ_STR(keysource_name(&rt->key), "json");
    CHECK_EQ_STR(rt->key.names[0], "/id");
    CHECK_EQ_INT(rt->settings.nscope_headers, 0);
    /* methods are matched as sent, upper case in the file or not */
    CHECK_EQ_STR(match(&cfg, "GET", "/webhooks/stripe", NULL)->name, ROUTE_DEFAULT);

    rt = match(&cfg, "PUT", "/events/a/b", NULL);
    CHECK_EQ_STR(rt->name, "cloudevents");
    CHECK_EQ_STR(keysource_name(&rt->key), "headers");
    CHECK_EQ_INT(rt->key.nnames, 2);
    CHECK_EQ_STR(match(&cfg, "PUT", "/events", NULL)->name, "cloudevents");
    CHECK_EQ_STR(match(&cfg, "PUT", "/eventsx", NULL)->name, ROUTE_DEFAULT);

    /* first match wins: /v1/payments is payments, even on the legacy host */
    CHECK_EQ_STR(match(&cfg, "POST", "/v1/payments", "api.example.com")->name, "payments");
    rt = match(&cfg, "POST", "/v1/refunds", "API.Example.com:8080");
    CHECK_EQ_STR(rt->name, "legacy");
    CHECK(rt->key.fallback);
    CHECK_EQ_STR(rt->key.names[0], "X-Idempotency");
    CHECK_EQ_INT(rt->errors, PROBLEM_DIALECT_STRIPE);
    CHECK_EQ_INT(rt->settings.ttl_ms, 60000);
    CHECK_EQ_STR(match(&cfg, "POST", "/v1/refunds", "other.example.com")->name, ROUTE_DEFAULT);
    CHECK_EQ_STR(match(&cfg, "POST", "/v1/refunds", NULL)->name, ROUTE_DEFAULT);

    rt = match(&cfg, "POST", "/internal/x", NULL);
    CHECK_EQ_STR(rt->name, "internal");
    CHECK(!rt->enforce);

    rt = match(&cfg, "POST", "/v2/payments", NULL);
    CHECK_EQ_STR(rt->name, ROUTE_DEFAULT);
    CHECK(rt->enforce);
    CHECK_EQ_STR(keysource_name(&rt->key), "header");
    CHECK_EQ_STR(rt->key.names[0], "Idempotency-Key"); /* the top level's key-header */
out:
    unload(&cfg);
    unlink(path);
}

static void test_route_raw_path_is_compared_byte_for_byte(void)
{
    struct config cfg;

    write_file("upstream: http://127.0.0.1:3000\n"
               "routes:\n"
               "  - {name: a, match: {path: /v1/pay%20ments}}\n"
               "  - {name: all, match: {path: /*}}\n");
    CHECK_EQ_INT(load(&cfg, NULL), 0);
    if (routes) {
        CHECK_EQ_STR(match(&cfg, "POST", "/v1/pay%20ments", NULL)->name, "a");
        CHECK_EQ_STR(match(&cfg, "POST", "/v1/pay ments", NULL)->name, "all");
        CHECK_EQ_STR(match(&cfg, "POST", "/V1/pay%20ments", NULL)->name, "all");
        CHECK_EQ_STR(match(&cfg, "POST", "/", NULL)->name, "all");
        CHECK_EQ_STR(match(&cfg, "OPTIONS", "*", NULL)->name, ROUTE_DEFAULT);
    }
    unload(&cfg);
    unlink(path);
}

static void test_route_flags_and_environment_beat_the_file(void)
{
    struct config cfg;
    char *argv[] = { "idemproxy", NULL };
    char *env[] = { "IDEMPROXY_TTL=30", NULL, NULL };
    char envcfg[128];

    write_file("upstream: http://127.0.0.1:3000\nttl: 100\nlock-ttl: 5\nmax-ttl: 200\n"
               "routes:\n  - {name: r, match: {path: /r}, ttl: 150}\n");
    CHECK_EQ_INT(load(&cfg, "--lock-ttl", "7", NULL), 0);
    CHECK_EQ_INT(cfg.route.ttl_ms, 100000);
    CHECK_EQ_INT(cfg.route.lock_ttl_ms, 7000);
    CHECK_EQ_INT(cfg.route.max_ttl_ms, 200000);
    if (routes) {
        CHECK_EQ_INT(match(&cfg, "POST", "/r", NULL)->settings.ttl_ms, 150000);    /* its own */
        CHECK_EQ_INT(match(&cfg, "POST", "/r", NULL)->settings.lock_ttl_ms, 7000); /* the flag's */
    }
    unload(&cfg);

    /* IDEMPROXY_CONFIG names the file; the environment beats it */
    snprintf(envcfg, sizeof(envcfg), "IDEMPROXY_CONFIG=%s", path);
    env[1] = envcfg;
    memset(&cfg, 0, sizeof(cfg));
    CHECK_EQ_INT(config_file_load(&cfg, &routes, 1, argv, env, err, sizeof(err)), 0);
    CHECK_EQ_INT(cfg.route.ttl_ms, 30000);
    CHECK_EQ_INT(cfg.route.lock_ttl_ms, 5000);
    CHECK(routes && routes->nroutes == 1);
    unload(&cfg);
    unlink(path);
}

/* Every problem of <yaml> is reported, each as PATH:LINE:COLUMN: ... */
static void check_problems(const char *yaml, const char *const *want, size_t n)
{
    struct config cfg;
    char line[1024];
    const char *p;
    size_t lines = 0;

    write_file(yaml);
    CHECK_EQ_INT(load(&cfg, NULL), -EINVAL);
    for (p = err; *p; lines++) {
        size_t len = strcspn(p, "\n");

        p += len + (p[len] == '\n');
    }
    CHECK_EQ_INT(lines, n);
    for (size_t i = 0; i < n; i++) {
        snprintf(line, sizeof(line), "%s:%s", path, want[i]);
        if (!strstr(err, line)) {
            CHECK(!"a problem is missing");
            fprintf(stderr, "  want: %s\n  got:\n%s\n", line, err);
        }
    }
    unload(&cfg);
    unlink(path);
}

static void test_route_file_problems_have_positions(void)
{
    static const char *const bad_values[] = {
        "2:11: max-body: '2X' is not a size",
        "3:1: unknown key 'colour'",
        "4:6: ttl: '0' is not a positive number of seconds",
        "5:10: methods: 'PO ST' is not a method list",
    };
    static const char *const bad_routes[] = {
        "5:5: route 1: name is required",
        "7:19: match.path: 'v1' is not a path",
        "8:5: duplicate key 'match' (first at line 7)",
        "9:11: name: 'pay' is already the name of route",
        "10:5: route: unknown key 'colour'",
        "11:17: key.json: 'id' is not a JSON pointer",
        "12:13: errors: 'soap' is not an error dialect",
        "14:11: name: 'default' is the route of requests",
        "15:5: route: unknown key 'upstream'",
        "16:5: route 'ttl': --ttl: 100 s is above --max-ttl (50 s)",
    };

    check_problems("upstream: http://127.0.0.1:3000\n"
                   "max-body: 2X\n"
                   "colour: blue\n"
                   "ttl: 0\n"
                   "methods: [\"PO ST\"]\n",
                   bad_values, ARRAY_SIZE(bad_values));
    check_problems("upstream: http://127.0.0.1:3000\n"
                   "max-ttl: 50\nttl: 10\n"
                   "routes:\n"
                   "  - match: {path: /a}\n"
                   "  - name: pay\n"
                   "    match: {path: v1}\n"
                   "    match: {path: /b}\n"
                   "  - name: pay\n"
                   "    colour: red\n"
                   "    key: {json: id}\n"
                   "    errors: soap\n"
                   "  - name: ok\n"
                   "  - name: default\n"
                   "    upstream: http://x\n"
                   "  - name: ttl\n"
                   "    ttl: 100\n",
                   bad_routes, ARRAY_SIZE(bad_routes));
}

static void test_route_file_syntax_and_shape(void)
{
    static const char *const syntax[] = { "3:1: did not find expected node content" };
    static const char *const not_map[] = { "1:1: the file must be a mapping" };
    static const char *const two_docs[] = { "2:1: a second YAML document" };
    static const char *const list_for_value[] = { "2:6: ttl: takes one value, not a list" };
    static const char *const null_value[] = { "2:7: redis: needs a value" };
    struct config cfg;

    check_problems("upstream: http://127.0.0.1:3000\nroutes: [\n", syntax, 1);
    check_problems("- a\n- b\n", not_map, 1);
    check_problems("upstream: http://127.0.0.1:3000\n---\nttl: 5\n", two_docs, 1);
    check_problems("upstream: http://127.0.0.1:3000\nttl: [1, 2]\n", list_for_value, 1);
    check_problems("upstream: http://127.0.0.1:3000\nredis:\n", null_value, 1);

    /* a file that cannot be read: its path and why */
    snprintf(path, sizeof(path), "/nonexistent/idemproxy.yaml");
    CHECK_EQ_INT(load(&cfg, NULL), -EINVAL);
    CHECK(strstr(err, "/nonexistent/idemproxy.yaml: cannot read the configuration file") != NULL);
    unload(&cfg);

    /* an empty file sets nothing: the flags still do */
    write_file("");
    CHECK_EQ_INT(load(&cfg, "--upstream", "http://127.0.0.1:1", NULL), 0);
    CHECK(routes && routes->nroutes == 0);
    unload(&cfg);
    unlink(path);
}

static void test_route_top_level_key_and_errors_are_the_default_route(void)
{
    struct config cfg;
    const struct route *rt;

    write_file("upstream: http://127.0.0.1:3000\n"
               "errors: stripe\n"
               "key: {headers: [a, b], fallback: fingerprint}\n"
               "routes:\n  - {name: p, match: {path: /p}, errors: problem, key: {json: /id}}\n"
               "  - {name: q, match: {path: /q}}\n");
    CHECK_EQ_INT(load(&cfg, NULL), 0);
    if (routes) {
        rt = match(&cfg, "POST", "/x", NULL);
        CHECK_EQ_INT(rt->errors, PROBLEM_DIALECT_STRIPE);
        CHECK_EQ_STR(keysource_name(&rt->key), "headers");
        CHECK(rt->key.fallback);
        CHECK_EQ_INT(match(&cfg, "POST", "/p", NULL)->errors, PROBLEM_DIALECT_PROBLEM);
        CHECK_EQ_INT(match(&cfg, "POST", "/q", NULL)->errors, PROBLEM_DIALECT_STRIPE);
        /* a route without a key of its own takes the top level's; one with its own keeps it */
        rt = match(&cfg, "POST", "/q", NULL);
        CHECK_EQ_STR(keysource_name(&rt->key), "headers");
        CHECK(rt->key.nnames == 2 && rt->key.fallback);
        CHECK_EQ_STR(rt->key.names[1], "b");
        rt = match(&cfg, "POST", "/p", NULL);
        CHECK_EQ_STR(keysource_name(&rt->key), "json");
        CHECK_EQ_STR(rt->key.names[0], "/id");
        CHECK(!rt->key.fallback);
    }
    unload(&cfg);
    unlink(path);
}

static void test_route_set_path_and_names(void)
{
    struct route rt = { 0 };

    CHECK_EQ_INT(route_set_path(&rt, "/a/b"), 0);
    CHECK(!rt.match_prefix && rt.match_path_len == 4);
    CHECK_EQ_INT(route_set_path(&rt, "/a/*"), 0);
    CHECK(rt.match_prefix && rt.match_path_len == 2);
    CHECK_EQ_STR(rt.match_path, "/a");
    CHECK_EQ_INT(route_set_path(&rt, "a"), -EINVAL);
    CHECK_EQ_INT(route_set_path(&rt, "/a*"), -EINVAL);
    CHECK_EQ_INT(route_set_path(&rt, "/a?b"), -EINVAL);
    CHECK_EQ_INT(route_set_path(&rt, "/a b"), -EINVAL);
    CHECK_EQ_INT(route_set_path(&rt, ""), -EINVAL);
    CHECK_EQ_STR(rt.match_path, "/a"); /* untouched on failure */
    route_done(&rt);
    route_done(&rt); /* idempotent */

    CHECK(route_name_is_valid("payments_v2-x"));
    CHECK(!route_name_is_valid(""));
    CHECK(!route_name_is_valid("Payments"));
    CHECK(!route_name_is_valid("a b"));
    CHECK(
        !route_name_is_valid("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
}

static void test_route_without_file_is_the_default_alone(void)
{
    struct config cfg = { 0 };
    char *argv[] = { "idemproxy", "--upstream", "http://127.0.0.1:1", "--ttl", "9", NULL };
    char *env[] = { NULL };

    CHECK_EQ_INT(config_file_load(&cfg, &routes, 5, argv, env, err, sizeof(err)), 0);
    CHECK(routes && routes->nroutes == 0);
    if (routes) {
        CHECK_EQ_STR(routes->routes[0].name, ROUTE_DEFAULT);
        CHECK_EQ_INT(routes->routes[0].settings.ttl_ms, 9000);
        CHECK_EQ_STR(routes->routes[0].key.names[0], "Idempotency-Key"); /* the top level's */
    }
    unload(&cfg);
}

TEST_MAIN(test_route_file_builds_the_spec_example, test_route_raw_path_is_compared_byte_for_byte,
          test_route_flags_and_environment_beat_the_file, test_route_file_problems_have_positions,
          test_route_file_syntax_and_shape,
          test_route_top_level_key_and_errors_are_the_default_route, test_route_set_path_and_names,
          test_route_without_file_is_the_default_alone)
