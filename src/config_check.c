/* SPDX-License-Identifier: MIT */
/* The options checked against each other once they are all set (doc/configuration.md, Options):
 * --upstream given, a TTL within max-ttl, a memory budget that holds two of
 * the largest answers, TLS options with a TLS URL, a WAIT that fits in
 * --store-timeout. Each problem is one line naming the option. */
#include "idemproxy/config_check.h"

#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/pg_url.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/seal.h"
#include "idemproxy/tls_files.h"

static void format_secs(uint64_t ms, char *out, size_t outlen)
{
    if (ms % 1000 == 0)
        snprintf(out, outlen, "%" PRIu64 " s", ms / 1000);
    else
        snprintf(out, outlen, "%" PRIu64 ".%03" PRIu64 " s", ms / 1000, ms % 1000);
}

static void format_bytes(size_t n, char *out, size_t outlen)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(out, outlen, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(out, outlen, "%zu KiB", n >> 10);
    else
        snprintf(out, outlen, "%zu bytes", n);
}

/* The memory store must hold at least two responses of the largest size it
 * stores, or a request could be executed and then have nowhere to go. */
static int check_memory_budget(const struct config *cfg, const struct route_settings *rs, char *err,
                               size_t errlen)
{
    char have[32], resp[32];

    if (config_store_url(cfg) || !cfg->enabled ||
        cfg->memory_max_bytes / 2 >= rs->max_response_bytes)
        return 0;
    format_bytes(cfg->memory_max_bytes, have, sizeof(have));
    format_bytes(rs->max_response_bytes, resp, sizeof(resp));
    snprintf(err, errlen,
             "--memory-max-bytes: %s cannot hold two responses of --max-response (%s); raise it "
             "or lower --max-response",
             have, resp);
    return -EINVAL;
}

/* TLS options without a TLS URL would be ignored: a user who gives them
 * expects TLS, so that is an error; so is half a client certificate. */
static int check_redis_tls(const struct config *cfg, char *err, size_t errlen)
{
    static const struct {
        const char *flag;
        size_t off;
    } tls_opts[] = {
        { "--redis-tls-ca-file", offsetof(struct config, redis_tls_ca_file) },
        { "--redis-tls-cert-file", offsetof(struct config, redis_tls_cert_file) },
        { "--redis-tls-key-file", offsetof(struct config, redis_tls_key_file) },
        { "--redis-tls-server-name", offsetof(struct config, redis_tls_server_name) },
    };
    struct redis_url u;
    bool tls = false;

    if (config_store_url(cfg) && redis_url_parse(config_store_url(cfg), &u, NULL, 0) == 0) {
        tls = u.tls;
        redis_url_done(&u);
    }
    for (size_t i = 0; i < ARRAY_SIZE(tls_opts); i++) {
        if (!tls && *(char *const *)(const void *)((const char *)cfg + tls_opts[i].off)) {
            snprintf(err, errlen, "%s: needs a rediss:// or rediss-sentinel:// --redis URL",
                     tls_opts[i].flag);
            return -EINVAL;
        }
    }
    if (!tls && cfg->redis_tls_insecure) {
        snprintf(err, errlen,
                 "--redis-tls-insecure: needs a rediss:// or rediss-sentinel:// "
                 "--redis URL");
        return -EINVAL;
    }
    if (!cfg->redis_tls_cert_file != !cfg->redis_tls_key_file) {
        snprintf(err, errlen,
                 "%s: a client certificate needs both --redis-tls-cert-file and "
                 "--redis-tls-key-file",
                 cfg->redis_tls_cert_file ? "--redis-tls-cert-file" : "--redis-tls-key-file");
        return -EINVAL;
    }
    return 0;
}

/* The upstream's TLS options need an https:// upstream (given with an
 * http:// one they would be ignored, and the user expects TLS); their files
 * are loaded as the upstream will load them. */
static int check_upstream_tls(const struct config *cfg, char *err, size_t errlen)
{
    const struct tls_files f = { .ca_file = cfg->upstream_tls_ca_file,
                                 .cert_file = cfg->upstream_tls_cert_file,
                                 .key_file = cfg->upstream_tls_key_file,
                                 .system_cas = !cfg->upstream_tls_insecure,
                                 .ca_opt = "--upstream-tls-ca-file",
                                 .cert_opt = "--upstream-tls-cert-file",
                                 .key_opt = "--upstream-tls-key-file" };
    const char *given = f.ca_file                       ? f.ca_opt
                        : f.cert_file                   ? f.cert_opt
                        : f.key_file                    ? f.key_opt
                        : cfg->upstream_tls_server_name ? "--upstream-tls-server-name"
                        : cfg->upstream_tls_insecure    ? "--upstream-tls-insecure"
                                                        : NULL;

    if (!given)
        return 0;
    if (strncasecmp(cfg->upstream, "https://", 8) != 0) {
        snprintf(err, errlen, "%s: needs an https:// --upstream (it is %s)", given, cfg->upstream);
        return -EINVAL;
    }
    return tls_files_check(&f, false, err, errlen);
}

/* --tls-cert-file and --tls-key-file: both or neither, and a pair that
 * loads (libmicrohttpd reads them again with GnuTLS when it starts). */
static int check_listen_tls(const struct config *cfg, char *err, size_t errlen)
{
    const struct tls_files f = { .cert_file = cfg->tls_cert_file,
                                 .key_file = cfg->tls_key_file,
                                 .cert_opt = "--tls-cert-file",
                                 .key_opt = "--tls-key-file" };

    if (!f.cert_file && !f.key_file)
        return 0;
    return tls_files_check(&f, true, err, errlen);
}

/* The key file of --store-encryption-key-file parses as the store will read it. */
static int check_encryption_keys(const struct config *cfg, char *err, size_t errlen)
{
    struct seal_keys *k = NULL;
    char why[512];
    int r;

    if (!cfg->store_encryption_key_file)
        return 0;
    r = seal_keys_load(cfg->store_encryption_key_file, &k, why, sizeof(why));
    seal_keys_free(k);
    if (r < 0)
        snprintf(err, errlen, "--store-encryption-key-file: %s",
                 r == -ENOMEM ? "out of memory" : why);
    return r;
}

/* WAIT is Redis's: without a Redis URL the option would be ignored. A
 * WAIT holds its connection, and the ops behind it, for up to its timeout,
 * so that timeout must leave room inside --store-timeout. */
static int check_redis_wait(const struct config *cfg, char *err, size_t errlen)
{
    char wait[32], store[32];

    if (cfg->redis_wait_replicas == 0)
        return 0;
    if (!config_store_url(cfg) || pg_url_is(config_store_url(cfg))) {
        snprintf(err, errlen,
                 "--redis-wait-replicas: needs a Redis URL (the memory store has no replicas; "
                 "PostgreSQL's are its server's: synchronous_standby_names)");
        return -EINVAL;
    }
    if (cfg->redis_wait_timeout_ms >= cfg->store_timeout_ms) {
        format_secs(cfg->redis_wait_timeout_ms, wait, sizeof(wait));
        format_secs(cfg->store_timeout_ms, store, sizeof(store));
        snprintf(err, errlen,
                 "--redis-wait-timeout: %s must be shorter than --store-timeout (%s): the ops "
                 "behind a WAIT wait for it",
                 wait, store);
        return -EINVAL;
    }
    return 0;
}

/* The port of <a>, and whether its address is the wildcard of its family. */
static unsigned addr_port(const struct config_addr *a, bool *any)
{
    if (a->sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)&a->sa;

        *any = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
        return ntohs(in6->sin6_port);
    }
    *any = ((const struct sockaddr_in *)(const void *)&a->sa)->sin_addr.s_addr == INADDR_ANY;
    return ntohs(((const struct sockaddr_in *)(const void *)&a->sa)->sin_port);
}

/* --listen and --admin-listen on one port of one address (a wildcard
 * overlaps every address): both would bind it (SO_REUSEPORT) and the
 * kernel would split the connections between the proxy and the admin
 * listener. */
static int check_addresses(const struct config *cfg, char *err, size_t errlen)
{
    const struct config_addr *a = &cfg->listen, *b = &cfg->admin_listen;
    bool any_a, any_b;
    unsigned pa = addr_port(a, &any_a), pb = addr_port(b, &any_b);
    bool same = a->sa_len == b->sa_len && memcmp(&a->sa, &b->sa, a->sa_len) == 0;

    if (pa != pb || !(same || any_a || any_b))
        return 0;
    snprintf(err, errlen,
             "--admin-listen: %s is where --listen (%s) takes clients too: the kernel would split "
             "the connections between them; give the admin listener a port of its own",
             b->text, a->text);
    return -EINVAL;
}

/* One store: --store, or --redis (an older name for a Redis one). */
static int check_one_store(const struct config *cfg, char *err, size_t errlen)
{
    if (cfg->store_url && cfg->redis_url) {
        snprintf(err, errlen,
                 "--store: give the store's URL once: --store and --redis both name one "
                 "(--store takes Redis URLs too)");
        return -EINVAL;
    }
    return 0;
}

int config_check_options(const struct config *cfg, char *err, size_t errlen)
{
    int r;

    if (!cfg->upstream) {
        snprintf(err, errlen,
                 "--upstream: required (the URL of the API to protect, e.g. "
                 "--upstream http://127.0.0.1:3000)");
        return -EINVAL;
    }
    r = config_check_route(cfg, &cfg->route, err, errlen);
    if (r == 0)
        r = check_addresses(cfg, err, errlen);
    if (r == 0)
        r = check_one_store(cfg, err, errlen);
    if (r == 0)
        r = check_redis_tls(cfg, err, errlen);
    if (r == 0)
        r = check_redis_wait(cfg, err, errlen);
    if (r == 0)
        r = check_upstream_tls(cfg, err, errlen);
    if (r == 0)
        r = check_listen_tls(cfg, err, errlen);
    if (r == 0)
        r = check_encryption_keys(cfg, err, errlen);
    return r;
}

int config_check_route(const struct config *cfg, const struct route_settings *rs, char *why,
                       size_t whylen)
{
    if (rs->ttl_ms > rs->max_ttl_ms) {
        char ttl[32], max[32];

        format_secs(rs->ttl_ms, ttl, sizeof(ttl));
        format_secs(rs->max_ttl_ms, max, sizeof(max));
        snprintf(why, whylen, "--ttl: %s is above --max-ttl (%s)", ttl, max);
        return -EINVAL;
    }
    if (rs->min_ttl_ms > rs->ttl_ms) {
        char min[32], ttl[32];

        format_secs(rs->min_ttl_ms, min, sizeof(min));
        format_secs(rs->ttl_ms, ttl, sizeof(ttl));
        snprintf(why, whylen,
                 "--min-ttl: %s is above --ttl (%s), the TTL of a request that asks "
                 "for none",
                 min, ttl);
        return -EINVAL;
    }
    return check_memory_budget(cfg, rs, why, whylen);
}
