/* SPDX-License-Identifier: MIT */
/* The stores by URL scheme: each line of the registry opens one store from
 * the configuration, and describes it for the start-up line. */
#include "idemproxy/store_registry.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/config.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/store_pg.h"
#include "idemproxy/store_redis.h"

#define MEMORY_REAP_INTERVAL_MS 1000 /* the memory store reclaims expired records this often */

/* Where a store runs: borrowed for the call. */
struct threads {
    struct worker_pool *pool;
    struct loop *const *loops;
    unsigned nloops;
};

static int open_memory(const struct config *cfg, const struct threads *th, struct store **ret,
                       char *why, size_t whylen)
{
    (void)why, (void)whylen;
    return store_memory_new(cfg->memory_max_bytes, MEMORY_REAP_INTERVAL_MS, th->pool, ret);
}

static void describe_memory(const struct config *cfg, char *out, size_t outlen)
{
    bool mib = cfg->memory_max_bytes >= (1u << 20);

    snprintf(out, outlen,
             "memory (%zu %s budget; a restart forgets every key, so a retry after it runs "
             "again: use --store (Redis or PostgreSQL) for keys that must outlive the process, or "
             "to share one store between instances)",
             cfg->memory_max_bytes >> (mib ? 20 : 10), mib ? "MiB" : "KiB");
}

static int open_redis(const struct config *cfg, const struct threads *th, struct store **ret,
                      char *why, size_t whylen)
{
    struct store_redis_opts o = {
        .url = config_store_url(cfg),
        .password = config_store_password(cfg),
        .tls = { .ca_file = cfg->redis_tls_ca_file,
                 .cert_file = cfg->redis_tls_cert_file,
                 .key_file = cfg->redis_tls_key_file,
                 .insecure = cfg->redis_tls_insecure },
        .tls_server_name = cfg->redis_tls_server_name,
        .timeout_ms = cfg->store_timeout_ms,
        .wait_replicas = cfg->redis_wait_replicas,
        .wait_timeout_ms = cfg->redis_wait_timeout_ms,
    };

    return store_redis_new(&o, th->pool, th->loops, th->nloops, ret, why, whylen);
}

/* "<store> <URL, its passwords hidden>". */
static void describe_url(const char *store, const struct config *cfg, char *out, size_t outlen)
{
    size_t n = (size_t)snprintf(out, outlen, "%s ", store);

    if (n < outlen)
        config_store_url_redact(config_store_url(cfg), out + n, outlen - n);
}

static void describe_redis(const struct config *cfg, char *out, size_t outlen)
{
    describe_url("redis", cfg, out, outlen);
}

static int open_pg(const struct config *cfg, const struct threads *th, struct store **ret,
                   char *why, size_t whylen)
{
    struct store_pg_opts o = {
        .url = config_store_url(cfg),
        .password = config_store_password(cfg),
        .timeout_ms = cfg->store_timeout_ms,
    };

    return store_pg_new(&o, th->pool, th->loops, th->nloops, ret, why, whylen);
}

static void describe_pg(const struct config *cfg, char *out, size_t outlen)
{
    describe_url("postgresql", cfg, out, outlen);
}

typedef int store_open_fn(const struct config *cfg, const struct threads *th, struct store **ret,
                          char *why, size_t whylen);
typedef void store_describe_fn(const struct config *cfg, char *out, size_t outlen);

static const struct {
    const char *scheme; /* before "://"; NULL: no store URL */
    store_open_fn *open;
    store_describe_fn *describe;
} registry[] = {
    { NULL, open_memory, describe_memory },
    { "redis", open_redis, describe_redis },
    { "rediss", open_redis, describe_redis },
    { "redis-sentinel", open_redis, describe_redis },
    { "rediss-sentinel", open_redis, describe_redis },
    { "postgresql", open_pg, describe_pg },
    { "postgres", open_pg, describe_pg },
};

/* The registry line of the store <cfg> names, or -1. */
static int lookup(const struct config *cfg)
{
    const char *url = config_store_url(cfg), *sep = url ? strstr(url, "://") : NULL;

    for (size_t i = 0; i < ARRAY_SIZE(registry); i++) {
        const char *s = registry[i].scheme;

        if (!url ? !s
                 : s && sep && (size_t)(sep - url) == strlen(s) &&
                       strncasecmp(url, s, strlen(s)) == 0)
            return (int)i;
    }
    return -1;
}

int store_registry_open(const struct config *cfg, struct worker_pool *pool,
                        struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                        size_t whylen)
{
    const struct threads th = { .pool = pool, .loops = loops, .nloops = nloops };
    int i = lookup(cfg);

    if (whylen)
        why[0] = '\0';
    if (i < 0) {
        snprintf(why, whylen,
                 "no store has URLs of this scheme (use postgresql://, redis://, rediss://, "
                 "redis-sentinel:// or rediss-sentinel://)");
        return -EINVAL;
    }
    return registry[i].open(cfg, &th, ret, why, whylen);
}

void store_registry_describe(const struct config *cfg, char *out, size_t outlen)
{
    int i = lookup(cfg);

    if (i < 0)
        snprintf(out, outlen, "none");
    else
        registry[i].describe(cfg, out, outlen);
}
