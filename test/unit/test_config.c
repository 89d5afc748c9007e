/* SPDX-License-Identifier: MIT */
/* The option table: defaults, flag > env > default, value parsers, error lines,
 * --help. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"

#define UPSTREAM "http://127.0.0.1:3000"
#define REDIS "redis://127.0.0.1:6379"
#define MAX_ARGS 32

static char err[512];

/* Loads argv "idemproxy" <args...> (NULL-terminated) with environment <env>. */
static int load_v(struct config *cfg, char *const env[], bool base, va_list ap)
{
    char *argv[MAX_ARGS];
    int argc = 0;
    char *a;

    argv[argc++] = "idemproxy";
    if (base) {
        argv[argc++] = "--upstream";
        argv[argc++] = UPSTREAM;
        argv[argc++] = "--redis";
        argv[argc++] = REDIS;
    }
    while ((a = va_arg(ap, char *)) && argc < MAX_ARGS - 1)
        argv[argc++] = a;
    argv[argc] = NULL;
    memset(cfg, 0, sizeof(*cfg));
    memset(err, 'X', sizeof(err));
    err[sizeof(err) - 1] = '\0';
    return config_file_load(cfg, NULL, argc, argv, env, err, sizeof(err));
}

/* With --upstream and --redis first, so the rest can be checked alone. */
static int load(struct config *cfg, char *const env[], ...)
{
    va_list ap;
    int r;

    va_start(ap, env);
    r = load_v(cfg, env, true, ap);
    va_end(ap);
    return r;
}

/* Exactly the arguments given. */
static int load_bare(struct config *cfg, char *const env[], ...)
{
    va_list ap;
    int r;

    va_start(ap, env);
    r = load_v(cfg, env, false, ap);
    va_end(ap);
    return r;
}

#define ENV(...) ((char *[]){ __VA_ARGS__, NULL })
#define NOENV ((char *[]){ NULL })

static uint16_t addr_port(const struct config_addr *a)
{
    if (a->sa.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)&a->sa)->sin_port);
    return ntohs(((const struct sockaddr_in6 *)(const void *)&a->sa)->sin6_port);
}

static void test_config_defaults(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, NULL), 0);
    CHECK_EQ_STR(err, "");
    CHECK_EQ_STR(c.listen.text, "127.0.0.1:8080");
    CHECK_EQ_INT(c.listen.sa.ss_family, AF_INET);
    CHECK_EQ_INT(c.listen.sa_len, sizeof(struct sockaddr_in));
    CHECK_EQ_INT(addr_port(&c.listen), 8080);
    CHECK_EQ_STR(c.admin_listen.text, "127.0.0.1:9090");
    CHECK_EQ_INT(addr_port(&c.admin_listen), 9090);
    CHECK_EQ_STR(c.upstream, UPSTREAM);
    CHECK_EQ_STR(c.redis_url, REDIS);
    CHECK_EQ_INT(c.route.nmethods, 3);
    CHECK_EQ_STR(c.route.methods[0], "POST");
    CHECK_EQ_STR(c.route.methods[1], "PUT");
    CHECK_EQ_STR(c.route.methods[2], "PATCH");
    CHECK_EQ_STR(c.key_header, "Idempotency-Key");
    CHECK_EQ_STR(c.route.replay_header, "X-Idempotency-Replayed");
    CHECK(!c.route.require_key);
    CHECK_EQ_INT(c.route.nscope_headers, 1);
    CHECK_EQ_STR(c.route.scope_headers[0], "Authorization");
    CHECK_EQ_STR(c.key_prefix, "idem:");
    CHECK_EQ_INT(c.route.ttl_ms, 86400000);
    CHECK_EQ_INT(c.route.max_ttl_ms, 604800000);
    CHECK_EQ_STR(c.route.ttl_header, "X-TTL");
    CHECK_EQ_INT(c.route.lock_ttl_ms, 30000);
    CHECK(c.route.no_cache[500] && c.route.no_cache[503] && c.route.no_cache[599] &&
          c.route.no_cache[429]);
    CHECK(!c.route.no_cache[200] && !c.route.no_cache[404] && !c.route.no_cache[428] &&
          !c.route.no_cache[499]);
    CHECK_EQ_INT(c.route.max_body_bytes, 1024 * 1024);
    CHECK_EQ_INT(c.route.max_response_bytes, 4 * 1024 * 1024);
    CHECK_EQ_INT(c.memory_max_bytes, 256 * 1024 * 1024);
    CHECK_EQ_INT(c.upstream_timeout_ms, 30000);
    CHECK_EQ_INT(c.client_timeout_ms, 30000);
    CHECK_EQ_INT(c.shutdown_timeout_ms, 10000);
    CHECK_EQ_INT(c.store_timeout_ms, 1000);
    CHECK_EQ_INT(c.route.wait_ms, 0);
    CHECK_EQ_INT(c.on_store_error, CONFIG_ON_STORE_ERROR_REJECT);
    CHECK_EQ_INT(c.max_connections, 4096);
    CHECK_EQ_INT(c.log_format, LOG_FORMAT_TEXT);
    CHECK_EQ_INT(c.log_level, LOG_LEVEL_INFO);
    CHECK(c.enabled);
    CHECK(!c.show_help && !c.show_version);
    config_done(&c);
}

static void test_config_flag_beats_env_beats_default(void)
{
    struct config c;
    char *env[] = { "IDEMPROXY_MAX_BODY=2M",
                    "IDEMPROXY_LOG_LEVEL=debug",
                    "IDEMPROXY_LISTEN=127.0.0.1:7000",
                    "IDEMPROXY_KEY_PREFIX=env:",
                    "IDEMPROXY_REQUIRE_KEY=yes",
                    "IDEMPROXY_LOG_FORMAT=json",
                    "IDEMPROXY_ON_STORE_ERROR=passthrough",
                    "IDEMPROXY_WAIT=2",
                    "IDEMPROXY_NO_CACHE_STATUS=",
                    "OTHER=1",
                    "IDEMPROXY_TEST_REDIS_URL=x",
                    NULL };

    CHECK_EQ_INT(load(&c, env, "--max-body", "3K", "--listen", "127.0.0.1:7001", NULL), 0);
    CHECK_EQ_INT(c.route.max_body_bytes, 3 * 1024); /* flag */
    CHECK_EQ_INT(c.listen.sa.ss_family, AF_INET);
    CHECK_EQ_INT(addr_port(&c.listen), 7001);    /* flag */
    CHECK_EQ_INT(c.log_level, LOG_LEVEL_DEBUG);  /* env */
    CHECK_EQ_INT(c.log_format, LOG_FORMAT_JSON); /* env */
    CHECK_EQ_INT(c.on_store_error, CONFIG_ON_STORE_ERROR_PASSTHROUGH);
    CHECK_EQ_STR(c.key_prefix, "env:");                        /* env */
    CHECK(c.route.require_key);                                /* env */
    CHECK_EQ_INT(c.route.wait_ms, 2000);                       /* env */
    CHECK(!c.route.no_cache[500] && !c.route.no_cache[429]);   /* env "": cache everything */
    CHECK_EQ_INT(c.route.max_response_bytes, 4 * 1024 * 1024); /* default */
    config_done(&c);

    /* The environment alone provides the required options. */
    CHECK_EQ_INT(load_bare(&c,
                           ENV("IDEMPROXY_UPSTREAM=https://api.example/v1/",
                               "IDEMPROXY_REDIS_URL=redis://h:1/2"),
                           NULL),
                 0);
    CHECK_EQ_STR(c.upstream, "https://api.example/v1");
    CHECK_EQ_STR(c.redis_url, "redis://h:1/2");
    config_done(&c);
}

static void test_config_ttl_precedence(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 86400 * 1000ull);
    config_done(&c);

    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_DEFAULT_TTL_SEC=60"), NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 60000);
    config_done(&c);

    /* IDEMPROXY_TTL wins, whatever the order in the environment. */
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_TTL=120", "IDEMPOTENCY_DEFAULT_TTL_SEC=60"), NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 120000);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_DEFAULT_TTL_SEC=60", "IDEMPROXY_TTL=120"), NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 120000);
    config_done(&c);

    CHECK_EQ_INT(
        load(&c, ENV("IDEMPOTENCY_DEFAULT_TTL_SEC=60", "IDEMPROXY_TTL=120"), "--ttl", "1.5", NULL),
        0);
    CHECK_EQ_INT(c.route.ttl_ms, 1500);
    config_done(&c);

    /* The cap is checked on the result, not on each source. */
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_TTL=700000"), "--max-ttl", "800000", NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 700000000ull);
    config_done(&c);
}

static void test_config_enabled(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_ENABLED=false"), NULL), 0);
    CHECK(!c.enabled);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_ENABLED=Off"), NULL), 0);
    CHECK(!c.enabled);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_ENABLED=1"), NULL), 0);
    CHECK(c.enabled);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPOTENCY_ENABLED=nah"), NULL), -EINVAL);
    CHECK(strstr(err, "IDEMPOTENCY_ENABLED: 'nah' is not a boolean") == err);
    config_done(&c);
    /* There is no flag for it. */
    CHECK_EQ_INT(load(&c, NOENV, "--enabled", NULL), -EINVAL);
    config_done(&c);
}

static void test_config_parse_bytes(void)
{
    static const struct {
        const char *s;
        size_t v;
    } good[] = {
        { "0", 0 },
        { "1", 1 },
        { "1K", 1024 },
        { "1k", 1024 },
        { "2M", 2 * 1024 * 1024 },
        { "3G", 3ull * 1024 * 1024 * 1024 },
        { "007", 7 },
        { "18446744073709551615", SIZE_MAX },
        { "17179869183G", 17179869183ull << 30 },
    };
    static const char *const bad[] = {
        "",
        "abc",
        "-1",
        "+1",
        " 1",
        "1 ",
        "1KB",
        "1.5M",
        "K",
        "1T",
        "0x10",
        "18446744073709551616",
        "17179869184G",
        "18014398509481984K",
        "99999999999999999999999",
    };
    size_t v;

    for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
        v = 12345;
        CHECK_EQ_INT(config_parse_bytes(good[i].s, &v), 0);
        CHECK_EQ_INT(v, good[i].v);
    }
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        v = 12345;
        CHECK_EQ_INT(config_parse_bytes(bad[i], &v), -EINVAL);
        CHECK_EQ_INT(v, 12345);
        if (v != 12345 || config_parse_bytes(bad[i], &v) != -EINVAL)
            fprintf(stderr, "  bad bytes value accepted: '%s'\n", bad[i]);
    }
}

static void test_config_parse_seconds(void)
{
    static const struct {
        const char *s;
        uint64_t ms;
    } good[] = {
        { "30", 30000 },
        { "0.5", 500 },
        { ".5", 500 },
        { "1.", 1000 },
        { "1.25", 1250 },
        { "1.2345", 1235 },
        { "1.2344", 1234 },
        { "1.9996", 2000 },
        { "0.001", 1 },
        { "0.0001", 1 },
        { "0.0000001", 1 },
        { "0.0015", 2 },
        { "007", 7000 },
        { "1000000000", 1000000000000ull },
        { "1s", 1000 },
        { "2m", 120000 },
        { "1.5h", 5400000 },
        { "7d", 604800000 },
        { "0.5m", 30000 },
        { "0.0001m", 6 },
        { "11574d", 999993600000ull },
    };
    static const char *const bad[] = {
        "",       "0",   "0.0",   "00",  ".",          "-1",  "-0.5",
        "+1",     "inf", "nan",   "1e3", "0x10",       " 1",  "1 ",
        "1S",     "1..", "1.2.3", "1,5", "1000000001", "NaN", "99999999999999999999999",
        "1ms",    "1w",  "d",     "1 d", "1d ",        "0d",  "0.0m",
        "11575d", "1y",  "1sd",   ".s",
    };
    uint64_t v;

    for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
        v = 777;
        CHECK_EQ_INT(config_parse_seconds(good[i].s, &v), 0);
        CHECK_EQ_INT(v, good[i].ms);
    }
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        v = 777;
        CHECK_EQ_INT(config_parse_seconds(bad[i], &v), -EINVAL);
        CHECK_EQ_INT(v, 777);
    }
}

static void test_config_wait_allows_zero(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, "--wait", "0", NULL), 0);
    CHECK_EQ_INT(c.route.wait_ms, 0);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--wait=0.25", NULL), 0);
    CHECK_EQ_INT(c.route.wait_ms, 250);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--wait", "0.0001", NULL), 0);
    CHECK_EQ_INT(c.route.wait_ms, 1);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--wait", "-1", NULL), -EINVAL);
    CHECK(strstr(err, "--wait: '-1'") == err);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--wait", "nan", NULL), -EINVAL);
    config_done(&c);
}

static void test_config_redis_wait(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, "--redis", "redis://h", NULL), 0);
    CHECK_EQ_INT(c.redis_wait_replicas, 0); /* off by default */
    CHECK_EQ_INT(c.redis_wait_timeout_ms, 100);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_REDIS_WAIT_REPLICAS=2"), "--redis", "redis://h",
                      "--redis-wait-timeout", "0.25", NULL),
                 0);
    CHECK_EQ_INT(c.redis_wait_replicas, 2);
    CHECK_EQ_INT(c.redis_wait_timeout_ms, 250);
    config_done(&c);
    /* the memory store has no replicas to wait for */
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", "http://127.0.0.1:3000",
                           "--redis-wait-replicas", "1", NULL),
                 -EINVAL);
    CHECK(strstr(err, "--redis-wait-replicas: needs a Redis URL") == err);
    config_done(&c);
    /* a WAIT holds the ops behind it: its timeout must leave room in --store-timeout */
    CHECK_EQ_INT(load(&c, NOENV, "--redis", "redis://h", "--redis-wait-replicas", "1",
                      "--redis-wait-timeout", "1", NULL),
                 -EINVAL);
    CHECK(strstr(err, "--redis-wait-timeout: 1 s must be shorter than --store-timeout (1 s)") ==
          err);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--redis", "redis://h", "--redis-wait-replicas", "1",
                      "--redis-wait-timeout", "1", "--store-timeout", "1.5", NULL),
                 0);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--redis-wait-replicas", "-1", NULL), -EINVAL);
    CHECK(strstr(err, "--redis-wait-replicas: '-1'") == err);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--redis-wait-timeout", "0", NULL), -EINVAL);
    config_done(&c);
}

static void test_config_parse_bool(void)
{
    static const char *const yes[] = { "true", "TRUE", "True", "1", "yes", "Yes", "on", "ON" };
    static const char *const no[] = { "false", "FALSE", "0", "no", "NO", "off", "Off" };
    static const char *const bad[] = { "", "maybe", "2", "y", "n", "truee", " true", "t" };
    bool b;

    for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
        b = false;
        CHECK_EQ_INT(config_parse_bool(yes[i], &b), 0);
        CHECK(b);
    }
    for (size_t i = 0; i < ARRAY_SIZE(no); i++) {
        b = true;
        CHECK_EQ_INT(config_parse_bool(no[i], &b), 0);
        CHECK(!b);
    }
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        b = true;
        CHECK_EQ_INT(config_parse_bool(bad[i], &b), -EINVAL);
        CHECK(b);
    }
}

static void test_config_parse_addr(void)
{
    static const char *const bad[] = {
        "",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "1.2.3.4:99999",
        "127.0.0.1:abc",
        "127.0.0.1:-1",
        "127.0.0.1:+80",
        ":8080",
        "::1:8080",
        "[::1]8080",
        "[::1]",
        "[::1:8080",
        "[]:8080",
        "[127.0.0.1]:80",
        "[localhost]:80",
        "256.1.1.1:80",
        "127.0.0.1:80x",
        "[::1]:0",
    };
    struct config_addr a, keep;
    const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)&a.sa;
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)&a.sa;
    char text[64];

    CHECK_EQ_INT(config_parse_addr("127.0.0.1:8080", &a), 0);
    CHECK_EQ_STR(a.text, "127.0.0.1:8080");
    CHECK_EQ_INT(a.sa.ss_family, AF_INET);
    CHECK_EQ_INT(a.sa_len, sizeof(struct sockaddr_in));
    CHECK_EQ_INT(ntohs(in->sin_port), 8080);
    CHECK_EQ_STR(inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)), "127.0.0.1");

    CHECK_EQ_INT(config_parse_addr("0.0.0.0:65535", &a), 0);
    CHECK_EQ_INT(ntohs(in->sin_port), 65535);

    CHECK_EQ_INT(config_parse_addr("[::1]:9090", &a), 0);
    CHECK_EQ_STR(a.text, "[::1]:9090");
    CHECK_EQ_INT(a.sa.ss_family, AF_INET6);
    CHECK_EQ_INT(a.sa_len, sizeof(struct sockaddr_in6));
    CHECK_EQ_INT(ntohs(in6->sin6_port), 9090);
    CHECK_EQ_STR(inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)), "::1");

    CHECK_EQ_INT(config_parse_addr("[::]:1", &a), 0);
    CHECK_EQ_INT(a.sa.ss_family, AF_INET6);
    CHECK_EQ_INT(ntohs(in6->sin6_port), 1);

    /* A name resolves (localhost is in /etc/hosts). */
    CHECK_EQ_INT(config_parse_addr("localhost:80", &a), 0);
    CHECK_EQ_STR(a.text, "localhost:80");
    CHECK(a.sa.ss_family == AF_INET || a.sa.ss_family == AF_INET6);
    CHECK(a.sa_len > 0);

    CHECK_EQ_INT(config_parse_addr("127.0.0.1:1", &keep), 0);
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        a = keep;
        CHECK_EQ_INT(config_parse_addr(bad[i], &a), -EINVAL);
        CHECK_EQ_MEM(&a, &keep, sizeof(a));
    }
    /* Longer than text[] holds. */
    {
        char big[400];

        memset(big, 'a', sizeof(big));
        memcpy(big + sizeof(big) - 4, ":80", 4);
        a = keep;
        CHECK_EQ_INT(config_parse_addr(big, &a), -EINVAL);
        CHECK_EQ_MEM(&a, &keep, sizeof(a));
    }
}

static void test_config_parse_status_list(void)
{
    static const char *const bad[] = {
        "600", "99", "099",  "abc",  "5xx,,429", ",",   "5xx,", "6xx",
        "0xx", "5x", "5xxx", "1000", "42",       "4x9", "-500", "500;502",
    };
    bool s[600], keep[600];

    CHECK_EQ_INT(config_parse_status_list("5xx,429", s), 0);
    for (int i = 0; i < 600; i++)
        CHECK_EQ_INT(s[i], (i >= 500 && i <= 599) || i == 429);

    memset(s, 1, sizeof(s));
    CHECK_EQ_INT(config_parse_status_list("", s), 0);
    for (int i = 0; i < 600; i++)
        CHECK(!s[i]);

    CHECK_EQ_INT(config_parse_status_list("4XX", s), 0);
    for (int i = 0; i < 600; i++)
        CHECK_EQ_INT(s[i], i >= 400 && i <= 499);

    CHECK_EQ_INT(config_parse_status_list(" 500 , 502,100,599", s), 0);
    CHECK(s[500] && s[502] && s[100] && s[599]);
    CHECK(!s[501] && !s[200] && !s[429]);

    for (int i = 0; i < 600; i++)
        keep[i] = i % 3 == 0;
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        memcpy(s, keep, sizeof(s));
        CHECK_EQ_INT(config_parse_status_list(bad[i], s), -EINVAL);
        CHECK_EQ_MEM(s, keep, sizeof(s));
    }
}

static void test_config_equals_form(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, "--max-body=2K", "--ttl=10", "--key-prefix=", "--ttl-header=",
                      "--listen=[::1]:8081", "--no-cache-status=", "--log-level=error",
                      "--max-connections=10", "--methods=post,delete", NULL),
                 0);
    CHECK_EQ_INT(c.route.max_body_bytes, 2048);
    CHECK_EQ_INT(c.route.ttl_ms, 10000);
    CHECK_EQ_STR(c.key_prefix, "");
    CHECK_EQ_STR(c.route.ttl_header, "");
    CHECK_EQ_INT(c.listen.sa.ss_family, AF_INET6);
    CHECK_EQ_INT(addr_port(&c.listen), 8081);
    CHECK(!c.route.no_cache[500]);
    CHECK_EQ_INT(c.log_level, LOG_LEVEL_ERROR);
    CHECK_EQ_INT(c.max_connections, 10);
    CHECK_EQ_INT(c.route.nmethods, 2);
    CHECK_EQ_STR(c.route.methods[0], "POST");
    CHECK_EQ_STR(c.route.methods[1], "DELETE");
    config_done(&c);

    /* The last of a repeated single-value flag wins. */
    CHECK_EQ_INT(load(&c, NOENV, "--ttl", "10", "--ttl=20", NULL), 0);
    CHECK_EQ_INT(c.route.ttl_ms, 20000);
    config_done(&c);
}

static void test_config_require_key_forms(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, NOENV, "--require-key", NULL), 0);
    CHECK(c.route.require_key);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--require-key=true", NULL), 0);
    CHECK(c.route.require_key);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_REQUIRE_KEY=true"), "--require-key=false", NULL), 0);
    CHECK(!c.route.require_key);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_REQUIRE_KEY=on"), NULL), 0);
    CHECK(c.route.require_key);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--require-key=maybe", NULL), -EINVAL);
    CHECK(strstr(err, "--require-key: 'maybe' is not a boolean") == err);
    config_done(&c);
    /* A flag without value does not eat the next argument. */
    CHECK_EQ_INT(load(&c, NOENV, "--require-key", "--ttl", "5", NULL), 0);
    CHECK(c.route.require_key);
    CHECK_EQ_INT(c.route.ttl_ms, 5000);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--require-key", "false", NULL), -EINVAL);
    CHECK(strstr(err, "'false'") != NULL);
    config_done(&c);
}

static void test_config_scope_headers(void)
{
    struct config c;

    CHECK_EQ_INT(
        load(&c, NOENV, "--scope-header", "Authorization", "--scope-header=X-Tenant", NULL), 0);
    CHECK_EQ_INT(c.route.nscope_headers, 2);
    CHECK_EQ_STR(c.route.scope_headers[0], "Authorization");
    CHECK_EQ_STR(c.route.scope_headers[1], "X-Tenant");
    config_done(&c);

    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_SCOPE_HEADER=X-Api-Key, X-Org"), NULL), 0);
    CHECK_EQ_INT(c.route.nscope_headers, 2);
    CHECK_EQ_STR(c.route.scope_headers[0], "X-Api-Key");
    CHECK_EQ_STR(c.route.scope_headers[1], "X-Org");
    config_done(&c);

    /* Flags replace the environment's list as a whole, then accumulate. */
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_SCOPE_HEADER=X-Api-Key,X-Org"), "--scope-header", "A",
                      "--scope-header", "B", "--scope-header", "C", NULL),
                 0);
    CHECK_EQ_INT(c.route.nscope_headers, 3);
    CHECK_EQ_STR(c.route.scope_headers[0], "A");
    CHECK_EQ_STR(c.route.scope_headers[1], "B");
    CHECK_EQ_STR(c.route.scope_headers[2], "C");
    CHECK(c.route.scope_headers[3] == NULL);
    config_done(&c);

    /* "": no scope header at all (a webhook sender's deliveries share one scope) */
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_SCOPE_HEADER=A"), "--scope-header", "", NULL), 0);
    CHECK_EQ_INT(c.route.nscope_headers, 0);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--scope-header", "A", "--scope-header", "", NULL), 0);
    CHECK_EQ_INT(c.route.nscope_headers, 1);
    config_done(&c);
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_SCOPE_HEADER=A,,B"), NULL), -EINVAL);
    CHECK(strstr(err, "IDEMPROXY_SCOPE_HEADER (--scope-header):") == err);
    config_done(&c);

    /* At most CONFIG_MAX_LIST entries. */
    {
        char list[CONFIG_MAX_LIST * 4 + 8] = "", item[8];

        for (int i = 0; i <= CONFIG_MAX_LIST; i++) {
            snprintf(item, sizeof(item), "%sH%d", i ? "," : "", i);
            strcat(list, item);
        }
        CHECK_EQ_INT(load(&c, NOENV, "--scope-header", list, NULL), -EINVAL);
        CHECK(strstr(err, "--scope-header: too many") == err);
        config_done(&c);
        *strrchr(list, ',') = '\0';
        CHECK_EQ_INT(load(&c, NOENV, "--scope-header", list, NULL), 0);
        CHECK_EQ_INT(c.route.nscope_headers, CONFIG_MAX_LIST);
        config_done(&c);
    }
}

static void test_config_methods(void)
{
    struct config c;

    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_METHODS=post, delete ,Patch"), NULL), 0);
    CHECK_EQ_INT(c.route.nmethods, 3);
    CHECK_EQ_STR(c.route.methods[0], "POST");
    CHECK_EQ_STR(c.route.methods[1], "DELETE");
    CHECK_EQ_STR(c.route.methods[2], "PATCH");
    CHECK(config_is_enforced(&c.route, SPAN_LIT("DELETE")));
    CHECK(config_is_enforced(&c.route, SPAN_LIT("POST")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("PUT")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("post")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("POS")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("POSTS")));
    config_done(&c);

    /* A flag replaces the environment's list. */
    CHECK_EQ_INT(load(&c, ENV("IDEMPROXY_METHODS=post,delete"), "--methods", "PUT", NULL), 0);
    CHECK_EQ_INT(c.route.nmethods, 1);
    CHECK_EQ_STR(c.route.methods[0], "PUT");
    CHECK(c.route.methods[1] == NULL);
    config_done(&c);

    CHECK_EQ_INT(load(&c, NOENV, NULL), 0);
    CHECK(config_is_enforced(&c.route, SPAN_LIT("PATCH")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("GET")));
    CHECK(!config_is_enforced(&c.route, SPAN_LIT("")));
    config_done(&c);
}

static void test_config_upstream_normalized(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "http://127.0.0.1:3000/", "http://127.0.0.1:3000" },
        { "http://127.0.0.1:3000", "http://127.0.0.1:3000" },
        { "https://api.example/v1/", "https://api.example/v1" },
        { "https://api.example/v1", "https://api.example/v1" },
        { "HTTP://h//", "HTTP://h/" },
    };
    struct config c;

    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        CHECK_EQ_INT(load(&c, NOENV, "--upstream", cases[i].in, NULL), 0);
        CHECK_EQ_STR(c.upstream, cases[i].out);
        config_done(&c);
    }
}

static void test_config_errors_name_the_option(void)
{
    static const struct {
        const char *args[3];
        char *env;
        const char *want; /* must start the message */
        const char *also; /* must appear in it too */
    } cases[] = {
        { { "--foo" }, NULL, "unknown option '--foo' (see --help)", NULL },
        { { "--foo=1" }, NULL, "unknown option '--foo'", NULL },
        { { "-x" }, NULL, "unknown option '-x'", NULL },
        { { "stray" }, NULL, "unexpected argument 'stray'", NULL },
        { { "--ttl" }, NULL, "--ttl: missing value", "S" },
        { { "--ttl", "--max-ttl", "5" }, NULL, "--ttl: missing value", NULL },
        { { "--on-store-error" }, NULL, "--on-store-error: missing value", "passthrough" },
        { { "--max-body", "abc" },
          NULL,
          "--max-body: 'abc' is not a size (use BYTES, optionally K, M or G)",
          NULL },
        { { "--max-response", "99999999999999999999G" }, NULL, "--max-response:", NULL },
        { { "--memory-max-bytes", "-1" }, NULL, "--memory-max-bytes:", NULL },
        { { "--ttl", "0" }, NULL, "--ttl: '0' is not a positive number of seconds", NULL },
        { { "--max-ttl", "-5" }, NULL, "--max-ttl:", NULL },
        { { "--lock-ttl", "0" }, NULL, "--lock-ttl:", NULL },
        { { "--upstream-timeout", "-1" }, NULL, "--upstream-timeout:", NULL },
        { { "--client-timeout", "0" }, NULL, "--client-timeout:", NULL },
        { { "--shutdown-timeout", "inf" }, NULL, "--shutdown-timeout:", NULL },
        { { "--store-timeout", "nan" }, NULL, "--store-timeout:", NULL },
        { { "--ttl", "700000" }, NULL, "--ttl: 700000 s is above --max-ttl (604800 s)", NULL },
        { { "--max-ttl", "60" }, NULL, "--ttl:", "--max-ttl" },
        { { "--on-store-error", "maybe" },
          NULL,
          "--on-store-error: 'maybe'",
          "reject or passthrough" },
        { { "--log-format", "xml" }, NULL, "--log-format: 'xml'", "text or json" },
        { { "--log-level", "trace" }, NULL, "--log-level: 'trace'", "error, warn, info or debug" },
        { { "--listen", "nope" }, NULL, "--listen: 'nope' is not an address", "HOST:PORT" },
        { { "--admin-listen", "127.0.0.1:0" }, NULL, "--admin-listen:", NULL },
        { { "--upstream", "ftp://x" }, NULL, "--upstream: 'ftp://x'", "http://" },
        { { "--upstream", "http://x/?a=1" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http://x/#f" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http://x/#" }, NULL, "--upstream:", NULL }, /* curl drops an empty one */
        { { "--upstream", "http://x/?" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http:/e://t\xa0#" }, NULL, "--upstream:", NULL }, /* fuzz_config */
        { { "--upstream", "http://" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http://:3000" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http:///api" }, NULL, "--upstream:", NULL },
        { { "--upstream", "http://a b" }, NULL, "--upstream:", NULL },
        { { "--upstream", "127.0.0.1:3000" }, NULL, "--upstream:", NULL },
        { { "--redis", "http://x" }, NULL, "--redis: 'http://x'", "redis://" },
        /* the parser's reason, and never the password */
        { { "--redis", "redis://u:hunter2@h:0" },
          NULL,
          "--redis: 'redis://u:***@h:0'",
          "1 to 65535" },
        { { "--redis", "redis-sentinel://s1" }, NULL, "--redis:", "needs ?master=NAME" },
        { { "--methods", "" }, NULL, "--methods: ''", "POST,PUT,PATCH" },
        { { "--methods", "PO ST" }, NULL, "--methods:", NULL },
        { { "--methods", "POST," }, NULL, "--methods:", NULL },
        { { "--no-cache-status", "600" }, NULL, "--no-cache-status: '600'", NULL },
        { { "--key-header", "" }, NULL, "--key-header: '' is not a header name", NULL },
        { { "--key-header", "a b" }, NULL, "--key-header:", NULL },
        { { "--replay-header", "X:Y" }, NULL, "--replay-header:", NULL },
        { { "--ttl-header", "X TTL" }, NULL, "--ttl-header:", NULL },
        { { "--max-connections", "0" }, NULL, "--max-connections:", NULL },
        { { "--max-connections", "5000000" }, NULL, "--max-connections:", NULL },
        { { "--wait", "x" }, NULL, "--wait:", NULL },
        { { "--help=1" }, NULL, "--help:", NULL },
        { { NULL }, "IDEMPROXY_TTL=abc", "IDEMPROXY_TTL (--ttl): 'abc' is not a positive", NULL },
        { { NULL }, "IDEMPOTENCY_DEFAULT_TTL_SEC=0", "IDEMPOTENCY_DEFAULT_TTL_SEC (--ttl):", NULL },
        { { NULL }, "IDEMPROXY_MAX_BODY=1Q", "IDEMPROXY_MAX_BODY (--max-body):", NULL },
        { { NULL }, "IDEMPROXY_METHODS=", "IDEMPROXY_METHODS (--methods):", NULL },
        { { NULL }, "IDEMPROXY_LISTEN=x:1", "IDEMPROXY_LISTEN (--listen):", NULL },
        { { NULL }, "IDEMPROXY_REDIS_URL=tcp://x", "IDEMPROXY_REDIS_URL (--redis):", NULL },
        { { NULL }, "IDEMPROXY_LOG_LEVEL=loud", "IDEMPROXY_LOG_LEVEL (--log-level):", NULL },
    };
    struct config c;

    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        char *env[] = { cases[i].env, NULL };
        int r;

        r = load(&c, env, cases[i].args[0], cases[i].args[1], cases[i].args[2], NULL);
        CHECK_EQ_INT(r, -EINVAL);
        CHECK(strstr(err, cases[i].want) == err);
        CHECK(!cases[i].also || strstr(err, cases[i].also));
        CHECK(strchr(err, '\n') == NULL);
        if (r != -EINVAL || strstr(err, cases[i].want) != err ||
            (cases[i].also && !strstr(err, cases[i].also)))
            fprintf(stderr, "  case %zu: got %d \"%s\"\n", i, r, err);
        config_done(&c);
    }
}

static void test_config_required_options(void)
{
    struct config c;

    CHECK_EQ_INT(load_bare(&c, NOENV, "--redis", REDIS, NULL), -EINVAL);
    CHECK_EQ_STR(err, "--upstream: required (the URL of the API to protect, e.g. --upstream "
                      "http://127.0.0.1:3000)");
    config_done(&c);

    /* Without a Redis URL the memory store is used. */
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, NULL), 0);
    CHECK(c.enabled);
    CHECK(c.redis_url == NULL);
    config_done(&c);

    /* An empty Redis URL is no Redis URL. */
    CHECK_EQ_INT(load_bare(&c, ENV("IDEMPROXY_REDIS_URL="), "--upstream", UPSTREAM, NULL), 0);
    CHECK(c.redis_url == NULL);
    config_done(&c);
}

static void test_config_memory_budget_holds_two_responses(void)
{
    struct config c;

    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--memory-max-bytes", "8M",
                           "--max-response", "4M", NULL),
                 0);
    config_done(&c);
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--memory-max-bytes", "7M", NULL),
                 -EINVAL);
    CHECK_EQ_STR(err, "--memory-max-bytes: 7 MiB cannot hold two responses of --max-response (4 "
                      "MiB); raise it or lower --max-response");
    config_done(&c);
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--memory-max-bytes", "64K",
                           "--max-response", "40000", NULL),
                 -EINVAL);
    CHECK_EQ_STR(err, "--memory-max-bytes: 64 KiB cannot hold two responses of --max-response "
                      "(40000 bytes); raise it or lower --max-response");
    config_done(&c);
    /* The budget is not used with Redis or without enforcement: no check then. */
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--redis", REDIS,
                           "--memory-max-bytes", "1K", NULL),
                 0);
    config_done(&c);
    CHECK_EQ_INT(load_bare(&c, ENV("IDEMPOTENCY_ENABLED=false"), "--upstream", UPSTREAM,
                           "--memory-max-bytes", "1K", NULL),
                 0);
    config_done(&c);
}

static void test_config_help_and_version(void)
{
    struct config c;

    CHECK_EQ_INT(load_bare(&c, NOENV, "--help", NULL), 0);
    CHECK(c.show_help);
    CHECK(!c.show_version);
    config_done(&c);

    /* Neither a bad environment, a bad flag nor a missing --upstream stops it. */
    CHECK_EQ_INT(load_bare(&c, ENV("IDEMPROXY_TTL=abc"), "--bogus", "-h", NULL), 0);
    CHECK(c.show_help);
    config_done(&c);

    CHECK_EQ_INT(load_bare(&c, NOENV, "--version", NULL), 0);
    CHECK(c.show_version);
    CHECK(!c.show_help);
    config_done(&c);

    /* A value that merely looks like it is not the flag. */
    CHECK_EQ_INT(load(&c, NOENV, "--key-prefix", "-h", NULL), 0);
    CHECK(!c.show_help);
    CHECK_EQ_STR(c.key_prefix, "-h");
    config_done(&c);
}

static void test_config_print_help(void)
{
    static const char *const want[] = {
        "idemproxy --upstream URL [options]",
        "--listen HOST:PORT",
        "IDEMPROXY_LISTEN",
        "127.0.0.1:8080",
        "--upstream URL",
        "--redis URL",
        "IDEMPROXY_REDIS_URL",
        "--admin-listen HOST:PORT",
        "--methods LIST",
        "POST,PUT,PATCH",
        "--key-header NAME",
        "--replay-header NAME",
        "--require-key\n",
        "IDEMPROXY_REQUIRE_KEY",
        "--scope-header NAME",
        "IDEMPROXY_SCOPE_HEADER",
        "--key-prefix STR",
        "--ttl S",
        "IDEMPROXY_TTL,",
        "default 86400",
        "--max-ttl S",
        "--ttl-header NAME",
        "--lock-ttl S",
        "--no-cache-status LIST",
        "default 5xx,408,409,429",
        "--max-body BYTES",
        "IDEMPROXY_MAX_BODY",
        "default 1M",
        "--max-response BYTES",
        "--memory-max-bytes BYTES",
        "--upstream-timeout S",
        "--client-timeout S",
        "--shutdown-timeout S",
        "--store-timeout S",
        "--wait S",
        "--on-store-error reject|passthrough",
        "--max-connections N",
        "--log-format json|text",
        "--log-level error|warn|info|debug",
        "--help",
        "--version",
        "IDEMPOTENCY_ENABLED",
        "IDEMPOTENCY_DEFAULT_TTL_SEC",
    };
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    CHECK(f != NULL);
    if (!f)
        return;
    config_print_help(f);
    fclose(f);
    for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
        CHECK(strstr(text, want[i]) != NULL);
        if (!strstr(text, want[i]))
            fprintf(stderr, "  help lacks \"%s\"\n", want[i]);
    }
    free(text);
}

/* Writes <n> bytes to a new temporary file; its path in <path>. */
static void secret_file(char *path, size_t len, const char *bytes, size_t n)
{
    int fd;

    snprintf(path, len, "/tmp/idemproxy-test-secret-XXXXXX");
    fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK_EQ_INT((int)write(fd, bytes, n), (int)n);
    close(fd);
}

/* The token and password files: the first line, the token trimmed and
 * visible ASCII, the password as written; a NUL in the line is refused, not
 * an early end of the secret. */
static void test_config_secret_files(void)
{
    static const struct {
        bool token;
        const char *bytes;
        size_t n;
        const char *want; /* NULL: refused */
    } cases[] = {
        { true, "  t0ken \nnext\n", 15, "t0ken" },
        { true, "a b\n", 4, NULL },
        { true, "ab\0cd\n", 6, NULL },
        { true, "\n", 1, NULL },
        { false, " pass word \r\nnext", 18, " pass word " },
        { false, "pw\0rest\n", 8, NULL },
        { false, "p\tw\n", 4, NULL },
        { false, "", 0, NULL },
    };
    struct config c;
    char path[64];

    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        const char *flag = cases[i].token ? "--admin-token-file" : "--redis-password-file";
        int r;

        secret_file(path, sizeof(path), cases[i].bytes, cases[i].n);
        r = load(&c, NOENV, flag, path, NULL);
        if (cases[i].want) {
            CHECK_EQ_INT(r, 0);
            CHECK_EQ_STR(cases[i].token ? c.admin_token : c.redis_password, cases[i].want);
        } else {
            CHECK_EQ_INT(r, -EINVAL);
            CHECK(strstr(err, flag) != NULL);
        }
        config_done(&c);
        unlink(path);
    }
}

static void test_config_done_is_idempotent(void)
{
    struct config c;

    config_done(NULL);
    CHECK_EQ_INT(load(&c, NOENV, "--scope-header", "A", "--scope-header", "B", NULL), 0);
    config_done(&c);
    CHECK(c.upstream == NULL && c.redis_url == NULL && c.key_header == NULL);
    CHECK(c.route.replay_header == NULL && c.key_prefix == NULL && c.route.ttl_header == NULL);
    CHECK(c.route.methods[0] == NULL && c.route.nmethods == 0);
    CHECK(c.route.scope_headers[0] == NULL && c.route.scope_headers[1] == NULL &&
          c.route.nscope_headers == 0);
    config_done(&c);
    CHECK(c.upstream == NULL);
}

/* What config_diff() reports, name by name. */
struct diffs {
    char names[1024];
    unsigned restart; /* how many of them need a restart */
};

static void on_diff(void *ctx, const char *name, unsigned traits)
{
    struct diffs *d = ctx;
    size_t used = strlen(d->names);

    snprintf(d->names + used, sizeof(d->names) - used, "%s%s", used ? " " : "", name);
    d->restart += (traits & CONFIG_RESTART) != 0;
}

static void test_config_diff_names_each_change_with_its_traits(void)
{
    struct config a, b;
    struct diffs d = { "", 0 };
    char path[64], path2[64];

    secret_file(path, sizeof(path), "s3cret\n", 7);
    secret_file(path2, sizeof(path2), "s3cret\n", 7);
    CHECK_EQ_INT(load(&a, NOENV, "--admin-token-file", path, NULL), 0);
    CHECK_EQ_INT(load(&b, NOENV, "--admin-token-file", path, NULL), 0);
    CHECK_EQ_INT(config_diff(&a, &b, on_diff, &d), 0); /* the same: nothing differs */
    config_done(&b);

    CHECK_EQ_INT(load(&b, ENV("IDEMPOTENCY_ENABLED=false"), "--listen", "127.0.0.1:8081", "--ttl",
                      "60", "--scope-header", "Authorization", "--scope-header", "X-Tenant",
                      "--log-level", "debug", "--admin-token-file", path2, NULL),
                 0);
    CHECK_EQ_INT(config_diff(&a, &b, on_diff, &d), 6);
    CHECK_EQ_STR(d.names, "listen scope-header ttl log-level IDEMPOTENCY_ENABLED "
                          "admin-token-file");
    CHECK_EQ_INT(d.restart, 3); /* listen, IDEMPOTENCY_ENABLED, admin-token-file */
    config_done(&b);

    /* A secret is compared by its content too: the same file, rewritten. */
    unlink(path2);
    FILE *f = fopen(path, "w");

    CHECK(f != NULL);
    if (f) {
        fputs("other\n", f);
        fclose(f);
    }
    memset(&d, 0, sizeof(d));
    CHECK_EQ_INT(load(&b, NOENV, "--admin-token-file", path, NULL), 0);
    CHECK_EQ_STR(b.admin_token, "other");
    CHECK_EQ_INT(config_diff(&a, &b, on_diff, &d), 1);
    CHECK_EQ_STR(d.names, "admin-token-file");
    config_done(&a);
    config_done(&b);
    unlink(path);
}

static void test_config_swap_takes_only_what_sighup_may_change(void)
{
    struct config run, next;

    CHECK_EQ_INT(load(&run, NOENV, "--ttl", "60", "--key-header", "K1", NULL), 0);
    CHECK_EQ_INT(load(&next, NOENV, "--ttl", "90", "--key-header", "K2", "--listen",
                      "127.0.0.1:8081", "--key-prefix", "other:", "--methods", "PUT",
                      "--shutdown-timeout", "3", "--log-format", "json", NULL),
                 0);
    config_swap_reloadable(&run, &next);
    /* taken: route settings, the key header, the shutdown timeout, the log format */
    CHECK_EQ_INT(run.route.ttl_ms, 90000);
    CHECK_EQ_STR(run.key_header, "K2");
    CHECK_EQ_INT(run.route.nmethods, 1);
    CHECK_EQ_STR(run.route.methods[0], "PUT");
    CHECK_EQ_INT(run.shutdown_timeout_ms, 3000);
    CHECK_EQ_INT(run.log_format, LOG_FORMAT_JSON);
    /* kept: what needs a restart */
    CHECK_EQ_STR(run.listen.text, "127.0.0.1:8080");
    CHECK_EQ_STR(run.key_prefix, "idem:");
    /* and <next> holds the old values, which it frees */
    CHECK_EQ_INT(next.route.ttl_ms, 60000);
    CHECK_EQ_STR(next.key_header, "K1");
    CHECK_EQ_INT(next.route.nmethods, 3);
    config_done(&next);
    config_done(&run);
}

static void test_config_route_settings_copy_and_options(void)
{
    struct route_settings copy = { 0 };
    struct config c;
    char names[512], why[256];
    const char *items[] = { "Idem-A", "Idem-B" };

    CHECK_EQ_INT(load(&c, NOENV, "--scope-header", "X-Tenant", NULL), 0);
    CHECK_EQ_INT(config_route_copy(&copy, &c.route), 0);
    CHECK(copy.replay_header != c.route.replay_header); /* its own */
    CHECK_EQ_STR(copy.replay_header, c.route.replay_header);
    CHECK_EQ_INT(copy.nscope_headers, 1);
    CHECK(copy.scope_headers[0] != c.route.scope_headers[0]);
    CHECK_EQ_INT(config_set_route_option(&copy, "scope-header", items, 2, true, why, sizeof(why)),
                 0);
    CHECK_EQ_INT(copy.nscope_headers, 2);
    CHECK_EQ_INT(c.route.nscope_headers, 1); /* the original is untouched */
    CHECK_EQ_INT(config_set_route_option(&copy, "listen", items, 1, false, why, sizeof(why)),
                 -ENOENT);
    CHECK(config_is_route_option("max-body") && config_is_route_option("on-unknown-outcome"));
    CHECK(!config_is_route_option("listen") && !config_is_route_option("key-header"));
    config_route_option_names(names, sizeof(names));
    CHECK_EQ_STR(names, "methods, replay-header, require-key, scope-header, require-scope, "
                        "on-unverified, ttl, max-ttl, min-ttl, tombstone-ttl, "
                        "ttl-header, lock-ttl, no-cache-status, max-body, max-passthrough-body, "
                        "max-response, on-unknown-outcome, wait");
    config_route_done(&copy);
    config_route_done(&copy); /* idempotent */
    config_done(&c);
}

static void test_config_listen_and_admin_listen_need_their_own_ports(void)
{
    struct config c;

    CHECK_EQ_INT(
        load(&c, NOENV, "--listen", "127.0.0.1:8080", "--admin-listen", "127.0.0.1:8080", NULL),
        -EINVAL);
    CHECK(strstr(err, "--admin-listen: 127.0.0.1:8080 is where --listen") == err);
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--listen", "[::]:8080", "--admin-listen", "127.0.0.1:8080", NULL),
                 -EINVAL);
    config_done(&c);
    CHECK_EQ_INT(
        load(&c, NOENV, "--listen", "127.0.0.1:8080", "--admin-listen", "127.0.0.2:8080", NULL), 0);
    config_done(&c);
    CHECK_EQ_INT(
        load(&c, NOENV, "--listen", "[::1]:8080", "--admin-listen", "127.0.0.1:8080", NULL), 0);
    config_done(&c);
}

static void record_env(void *ctx, const char *name, const char *near)
{
    char *out = ctx;
    size_t n = strlen(out);

    snprintf(out + n, 256 - n, "%s>%s;", name, near ? near : "-");
}

static void test_config_names_the_nearest_option(void)
{
    static const char *const names[] = { "redis", "upstream", NULL, "ttl" };
    char seen[256] = "";
    struct config c;

    CHECK_EQ_STR(config_nearest("redsi", 5, names, 4), "redis"); /* a swap is one edit */
    CHECK_EQ_STR(config_nearest("upstrem", 7, names, 4), "upstream");
    CHECK(config_nearest("foo", 3, names, 4) == NULL);   /* three edits from ttl: too far */
    CHECK(config_nearest("redis", 5, names, 4) == NULL); /* a known name is not misspelt */
    CHECK_EQ_INT(load(&c, NOENV, "--requrie-key", NULL), -EINVAL);
    CHECK_EQ_STR(err, "unknown option '--requrie-key' (did you mean --require-key? see --help)");
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--zzz", NULL), -EINVAL);
    CHECK_EQ_STR(err, "unknown option '--zzz' (see --help)");
    config_done(&c);
    CHECK_EQ_INT(config_each_unknown_env(ENV("IDEMPROXY_UPSTRAEM=x", "IDEMPROXY_TTL=5",
                                             "IDEMPROXY_FOO=1", "OTHER=1", "IDEMPROXY_CONFIG=f"),
                                         record_env, seen),
                 2);
    CHECK_EQ_STR(seen, "IDEMPROXY_UPSTRAEM>IDEMPROXY_UPSTREAM;IDEMPROXY_FOO>-;");
}

static void test_config_store_url_and_password(void)
{
    struct config c;
    char dir[] = "/tmp/idemproxy-test-store-XXXXXX", pw1[64], pw2[64];
    FILE *f;

    CHECK(mkdtemp(dir) != NULL);
    snprintf(pw1, sizeof(pw1), "%s/store", dir);
    snprintf(pw2, sizeof(pw2), "%s/redis", dir);
    f = fopen(pw1, "w");
    fputs("from-store\n", f);
    fclose(f);
    f = fopen(pw2, "w");
    fputs("from-redis\n", f);
    fclose(f);
    /* --store takes PostgreSQL's URLs and Redis's; --redis, Redis's only */
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--store",
                           "postgresql://app@h1,h2/pay?target_session_attrs=read-write", NULL),
                 0);
    CHECK_EQ_STR(config_store_url(&c),
                 "postgresql://app@h1,h2/pay?target_session_attrs=read-write");
    CHECK(config_store_password(&c) == NULL);
    config_done(&c);
    CHECK_EQ_INT(
        load_bare(&c, ENV("IDEMPROXY_STORE_URL=redis://h:1"), "--upstream", UPSTREAM, NULL), 0);
    CHECK_EQ_STR(config_store_url(&c), "redis://h:1");
    config_done(&c);
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--redis", "redis://h", NULL), 0);
    CHECK_EQ_STR(config_store_url(&c), "redis://h");
    config_done(&c);
    CHECK_EQ_INT(load_bare(&c, NOENV, "--upstream", UPSTREAM, "--redis", "postgresql://h/db", NULL),
                 -EINVAL);
    CHECK(strstr(err, "a PostgreSQL URL goes in --store") != NULL);
    config_done(&c);
    CHECK_EQ_INT(
        load_bare(&c, NOENV, "--upstream", UPSTREAM, "--store", "postgresql://h/db?x=1", NULL),
        -EINVAL);
    CHECK(strstr(err, "--store: ") == err && strstr(err, "\"x\"") != NULL);
    config_done(&c);
    /* one store URL */
    CHECK_EQ_INT(load(&c, NOENV, "--store", "postgresql://h/db", NULL), -EINVAL);
    CHECK(strstr(err, "--store: give the store's URL once") == err);
    config_done(&c);
    /* the password: --store-password-file's beats --redis-password-file's */
    CHECK_EQ_INT(load(&c, NOENV, "--redis-password-file", pw2, NULL), 0);
    CHECK_EQ_STR(config_store_password(&c), "from-redis");
    config_done(&c);
    CHECK_EQ_INT(load(&c, NOENV, "--redis-password-file", pw2, "--store-password-file", pw1, NULL),
                 0);
    CHECK_EQ_STR(config_store_password(&c), "from-store");
    config_done(&c);
    unlink(pw1);
    unlink(pw2);
    rmdir(dir);
}

TEST_MAIN(test_config_memory_budget_holds_two_responses, test_config_defaults,
          test_config_flag_beats_env_beats_default, test_config_ttl_precedence, test_config_enabled,
          test_config_parse_bytes, test_config_parse_seconds, test_config_wait_allows_zero,
          test_config_redis_wait, test_config_parse_bool, test_config_parse_addr,
          test_config_parse_status_list, test_config_equals_form, test_config_require_key_forms,
          test_config_scope_headers, test_config_methods, test_config_upstream_normalized,
          test_config_errors_name_the_option, test_config_required_options,
          test_config_help_and_version, test_config_print_help, test_config_secret_files,
          test_config_done_is_idempotent, test_config_diff_names_each_change_with_its_traits,
          test_config_swap_takes_only_what_sighup_may_change,
          test_config_route_settings_copy_and_options, test_config_store_url_and_password,
          test_config_listen_and_admin_listen_need_their_own_ports,
          test_config_names_the_nearest_option)
