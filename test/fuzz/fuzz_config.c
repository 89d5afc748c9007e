/* SPDX-License-Identifier: MIT */
/* Configuration values: each value parser, the Redis URL parser (its
 * redacted form hides the passwords), and
 * config_file_load() with flags and environment built from the input. Input: NUL
 * separated strings; the first goes to every value parser, all of them make
 * argv, except "IDEMPROXY_..."/"IDEMPOTENCY_..." ones holding '=', which make
 * the environment. */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dlfcn.h>
#include <math.h>
#include <netdb.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "fuzz.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/route.h"

#define MAX_PARTS 64

typedef int getaddrinfo_fn(const char *, const char *, const struct addrinfo *, struct addrinfo **);

/* Host names would reach the resolver, and through it the network: slow and
 * not reproducible. Every lookup is numeric here, a name fails as unknown. */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    static getaddrinfo_fn *real;
    struct addrinfo h = { .ai_family = AF_UNSPEC };

    if (!real)
        real = (getaddrinfo_fn *)dlsym(RTLD_NEXT, "getaddrinfo");
    FUZZ_CHECK(real != NULL);
    if (hints)
        h = *hints;
    h.ai_flags |= AI_NUMERICHOST;
    return real(node, service, &h, res);
}

static bool all_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
    }
    return n > 0;
}

static void check_bytes(const char *s)
{
    size_t v = 1234, n = strlen(s);

    if (config_parse_bytes(s, &v) < 0) {
        FUZZ_CHECK(v == 1234);
        return;
    }
    /* digits, then at most one of K, M, G in either case */
    FUZZ_CHECK(n > 0);
    if (!all_digits(s, n)) {
        FUZZ_CHECK(all_digits(s, n - 1) && strchr("kKmMgG", s[n - 1]));
        FUZZ_CHECK(v % 1024 == 0);
    } else {
        FUZZ_CHECK(v == strtoull(s, NULL, 10));
    }
}

static void check_seconds(const char *s)
{
    uint64_t ms = 0;
    const char *dot = strchr(s, '.');

    if (config_parse_seconds(s, &ms) < 0)
        return;
    FUZZ_CHECK(ms >= 1);
    if (!dot || dot - s < 9) {
        /* decimal, then at most a unit (s, m, h, d), and within what the
         * kept digits say: a millisecond, and the unit's share of the
         * fraction past four digits, which is dropped */
        size_t n = strlen(s);
        char last = n ? s[n - 1] : '\0';
        double unit = last == 'm' ? 60 : last == 'h' ? 3600 : last == 'd' ? 86400 : 1;
        double want;

        if (last && strchr("smhd", last))
            n--;
        want = strtod(s, NULL) * 1000.0 * unit;
        FUZZ_CHECK(strspn(s, "0123456789.") == n);
        FUZZ_CHECK(fabs((double)ms - want) <= 1.0 + 0.1 * unit || (want < 1.0 && ms == 1));
    }
}

static void check_addr(const char *s)
{
    struct config_addr a;

    if (config_parse_addr(s, &a) < 0)
        return;
    FUZZ_CHECK(strcmp(a.text, s) == 0);
    FUZZ_CHECK(a.sa_len > 0 && a.sa_len <= sizeof(a.sa));
    FUZZ_CHECK(a.sa.ss_family == AF_INET || a.sa.ss_family == AF_INET6);
}

static void check_status_list(const char *s)
{
    bool set[600];

    memset(set, 0xaa, sizeof(set));
    if (config_parse_status_list(s, set) < 0)
        return;
    for (size_t i = 0; i < 600; i++)
        FUZZ_CHECK(set[i] == false || set[i] == true);
    for (size_t i = 0; i < 100; i++)
        FUZZ_CHECK(!set[i]); /* statuses are 100-599 */
}

static void check_redis_url(const char *s)
{
    struct redis_url u;
    char why[200], redacted[8192];

    /* the redacted form ends (even when the URL is refused) and is terminated */
    redis_url_redact(s, redacted, sizeof(redacted));
    FUZZ_CHECK(strlen(redacted) < sizeof(redacted));
    if (redis_url_parse(s, &u, why, sizeof(why)) < 0) {
        FUZZ_CHECK(why[0] != '\0'); /* a refusal always says why */
        return;
    }
    FUZZ_CHECK(u.nhosts >= 1 && u.nhosts <= REDIS_URL_MAX_HOSTS);
    for (unsigned i = 0; i < u.nhosts; i++) {
        FUZZ_CHECK(u.hosts[i].port >= 1 && u.hosts[i].port <= 65535);
        FUZZ_CHECK(u.hosts[i].host[0] != '\0');
    }
    FUZZ_CHECK(u.db <= 2147483647u);
    FUZZ_CHECK((u.kind == REDIS_URL_SENTINEL) == (u.master != NULL));
    /* Redacting changes the passwords and nothing else: the redacted URL
     * reads the same, with "***" where each password was. */
    if (strlen(s) < sizeof(redacted) - 64) { /* not truncated */
        struct redis_url r;

        FUZZ_CHECK(redis_url_parse(redacted, &r, why, sizeof(why)) == 0);
        FUZZ_CHECK(r.kind == u.kind && r.tls == u.tls && r.nhosts == u.nhosts && r.db == u.db);
        for (unsigned i = 0; i < u.nhosts; i++)
            FUZZ_CHECK(strcmp(r.hosts[i].host, u.hosts[i].host) == 0 &&
                       r.hosts[i].port == u.hosts[i].port);
        FUZZ_CHECK(!u.password || (r.password && strcmp(r.password, "***") == 0));
        FUZZ_CHECK(!u.sentinel_password ||
                   (r.sentinel_password && strcmp(r.sentinel_password, "***") == 0));
        FUZZ_CHECK(!u.master == !r.master && (!u.master || strcmp(u.master, r.master) == 0));
        redis_url_done(&r);
    }
    redis_url_done(&u);
}

static void check_load(char **parts, size_t n)
{
    char *argv[MAX_PARTS + 2], *envp[MAX_PARTS + 1], err[256];
    int argc = 0, nenv = 0, r;
    struct config cfg;
    struct route_table *routes;

    argv[argc++] = "idemproxy";
    for (size_t i = 0; i < n; i++) {
        /* A file the input names would be read from this machine's disk (a
         * FIFO or /dev/stdin would block): the file is test_route's. */
        if (strncmp(parts[i], "--config", 8) == 0 || strncmp(parts[i], "IDEMPROXY_CONFIG", 16) == 0)
            return;
    }
    for (size_t i = 0; i < n; i++) {
        bool env = (strncmp(parts[i], "IDEMPROXY_", 10) == 0 ||
                    strncmp(parts[i], "IDEMPOTENCY_", 12) == 0) &&
                   strchr(parts[i], '=');

        if (env)
            envp[nenv++] = parts[i];
        else
            argv[argc++] = parts[i];
    }
    argv[argc] = NULL;
    envp[nenv] = NULL;

    memset(&cfg, 0, sizeof(cfg));
    memset(err, 'x', sizeof(err));
    routes = NULL;
    r = config_file_load(&cfg, &routes, argc, argv, envp, err, sizeof(err));
    FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL);
    if (r < 0) {
        FUZZ_CHECK(r == -EINVAL || r == -ENOMEM);
        FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n')); /* one line naming the option */
    } else if (!cfg.show_help && !cfg.show_version) {
        FUZZ_CHECK(cfg.upstream != NULL && cfg.route.ttl_ms <= cfg.route.max_ttl_ms);
        FUZZ_CHECK(strncasecmp(cfg.upstream, "http", 4) == 0 && !strpbrk(cfg.upstream, "?#"));
        FUZZ_CHECK(cfg.route.nmethods <= CONFIG_MAX_LIST &&
                   cfg.route.nscope_headers <= CONFIG_MAX_LIST);
        FUZZ_CHECK(cfg.key_header && cfg.route.replay_header && cfg.key_prefix &&
                   cfg.route.ttl_header);
        FUZZ_CHECK(cfg.listen.sa_len > 0 && cfg.admin_listen.sa_len > 0);
        /* no file: the default route alone, with the top-level settings */
        FUZZ_CHECK(routes && routes->nroutes == 0);
        FUZZ_CHECK(strcmp(routes->routes[0].name, "default") == 0);
        FUZZ_CHECK(routes->routes[0].settings.ttl_ms == cfg.route.ttl_ms);
    }
    route_table_unref(routes);
    config_done(&cfg);
    config_done(&cfg); /* idempotent */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { .base = (const char *)data, .len = size };
    struct span spans[MAX_PARTS];
    char *parts[MAX_PARTS];
    size_t n = fuzz_split(in, '\0', spans, ARRAY_SIZE(spans));

    /* The last part may hold NULs (more than MAX_PARTS): it ends at the first. */
    for (size_t i = 0; i < n; i++)
        parts[i] = fuzz_strdup(spans[i]);
    check_bytes(parts[0]);
    check_seconds(parts[0]);
    {
        bool b;

        (void)config_parse_bool(parts[0], &b);
    }
    check_addr(parts[0]);
    check_status_list(parts[0]);
    check_redis_url(parts[0]);
    check_load(parts, n);
    for (size_t i = 0; i < n; i++)
        free(parts[i]);
    return 0;
}
