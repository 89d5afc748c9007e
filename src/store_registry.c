/* SPDX-License-Identifier: MIT */
/* The stores by URL scheme: each line of the registry names the scheme of
 * one store's URLs, how such a URL is checked and shown without its
 * secrets, how the store is opened from the configuration, and how it is
 * described for the start-up line. */
#include "idemproxy/store_registry.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/pg_url.h"
#include "idemproxy/redis_url.h"
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

static int open_memory(const struct store_registry_opts *o, const struct threads *th,
                       struct store **ret, char *why, size_t whylen)
{
    (void)why, (void)whylen;
    return store_memory_new(o->memory_max_bytes, MEMORY_REAP_INTERVAL_MS, th->pool, ret);
}

static void describe_memory(const struct store_registry_opts *o, char *out, size_t outlen)
{
    bool mib = o->memory_max_bytes >= (1u << 20);

    snprintf(out, outlen,
             "memory (%zu %s budget; a restart forgets every key, so a retry after it runs "
             "again: use --store (Redis or PostgreSQL) for keys that must outlive the process, or "
             "to share one store between instances)",
             o->memory_max_bytes >> (mib ? 20 : 10), mib ? "MiB" : "KiB");
}

static int open_redis(const struct store_registry_opts *o, const struct threads *th,
                      struct store **ret, char *why, size_t whylen)
{
    struct store_redis_opts r = {
        .url = o->url,
        .password = o->password,
        .tls = o->redis_tls,
        .tls_server_name = o->redis_tls_server_name,
        .timeout_ms = o->timeout_ms,
        .wait_replicas = o->redis_wait_replicas,
        .wait_timeout_ms = o->redis_wait_timeout_ms,
    };

    return store_redis_new(&r, th->pool, th->loops, th->nloops, ret, why, whylen);
}

static int check_redis(const char *url, char *why, size_t whylen)
{
    struct redis_url u;
    int err = redis_url_parse(url, &u, why, whylen);

    if (err == 0)
        redis_url_done(&u);
    return err;
}

static void describe_url(const char *store, const struct store_registry_opts *o, char *out,
                         size_t outlen);

static void describe_redis(const struct store_registry_opts *o, char *out, size_t outlen)
{
    describe_url("redis", o, out, outlen);
}

static int open_pg(const struct store_registry_opts *o, const struct threads *th,
                   struct store **ret, char *why, size_t whylen)
{
    struct store_pg_opts p = { .url = o->url,
                               .password = o->password,
                               .timeout_ms = o->timeout_ms };

    return store_pg_new(&p, th->pool, th->loops, th->nloops, ret, why, whylen);
}

static void describe_pg(const struct store_registry_opts *o, char *out, size_t outlen)
{
    describe_url("postgresql", o, out, outlen);
}

typedef int store_open_fn(const struct store_registry_opts *o, const struct threads *th,
                          struct store **ret, char *why, size_t whylen);
typedef void store_describe_fn(const struct store_registry_opts *o, char *out, size_t outlen);
typedef int store_check_fn(const char *url, char *why, size_t whylen);
typedef void store_redact_fn(const char *url, char *out, size_t outlen);

#define REDIS_FORM                                                                                 \
    "redis://[[user]:password@]host[:port][/db], rediss:// for TLS, or "                           \
    "redis-sentinel://host[:port][,...]?master=NAME"

static const struct {
    const char *scheme; /* before "://"; NULL: no store URL */
    store_check_fn *check;
    store_redact_fn *redact;
    const char *form; /* its URLs' form, in the messages; NULL: said by an earlier line */
    store_open_fn *open;
    store_describe_fn *describe;
} registry[] = {
    { NULL, NULL, NULL, NULL, open_memory, describe_memory },
    { "postgresql", pg_url_check, pg_url_redact,
      "postgresql://[user[:password]@]host[:port][,host[:port]...]/db[?params] (libpq's URI)",
      open_pg, describe_pg },
    { "postgres", pg_url_check, pg_url_redact, NULL, open_pg, describe_pg },
    { "redis", check_redis, redis_url_redact, "a Redis URL: " REDIS_FORM, open_redis,
      describe_redis },
    { "rediss", check_redis, redis_url_redact, NULL, open_redis, describe_redis },
    { "redis-sentinel", check_redis, redis_url_redact, NULL, open_redis, describe_redis },
    { "rediss-sentinel", check_redis, redis_url_redact, NULL, open_redis, describe_redis },
};

/* The registry line of the scheme of <url> (NULL: the store without one), or -1. */
static int lookup_url(const char *url)
{
    const char *sep = url ? strstr(url, "://") : NULL;

    for (size_t i = 0; i < ARRAY_SIZE(registry); i++) {
        const char *s = registry[i].scheme;

        if (!url ? !s
                 : s && sep && (size_t)(sep - url) == strlen(s) &&
                       strncasecmp(url, s, strlen(s)) == 0)
            return (int)i;
    }
    return -1;
}

/* Writes the schemes of the registry, "a://, b:// or c://", into <out>. */
static void schemes_text(char *out, size_t outlen)
{
    size_t n = 0, left = 0;

    for (size_t i = 0; i < ARRAY_SIZE(registry); i++)
        left += registry[i].scheme != NULL;
    out[0] = '\0';
    for (size_t i = 0; i < ARRAY_SIZE(registry) && n < outlen; i++) {
        if (!registry[i].scheme)
            continue;
        left--;
        n += (size_t)snprintf(out + n, outlen - n, "%s://%s", registry[i].scheme,
                              left > 1    ? ", "
                              : left == 1 ? " or "
                                          : "");
    }
}

int store_registry_check_url(const char *url, char *why, size_t whylen)
{
    int i = lookup_url(url);
    char schemes[256];

    if (whylen)
        why[0] = '\0';
    if (i >= 0 && registry[i].check)
        return registry[i].check(url, why, whylen);
    schemes_text(schemes, sizeof(schemes));
    snprintf(why, whylen, "no store has URLs of this scheme (the schemes: %s)", schemes);
    return -EINVAL;
}

/* A URL of no store's scheme (a misspelt one's, maybe): nobody's parser
 * says where its secrets are (a password may hold '/', '?', '@'), so one
 * that could hold any (user info, a query) is shown as its scheme, when it
 * looks like one, and three stars for the rest. */
static void redact_any(const char *url, char *out, size_t outlen)
{
    size_t n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");

    if (!strpbrk(url, "@?#"))
        snprintf(out, outlen, "%s", url);
    else if (n > 0 && n <= 32 && strncmp(url + n, "://", 3) == 0)
        snprintf(out, outlen, "%.*s://***", (int)n, url);
    else
        snprintf(out, outlen, "***");
}

void store_registry_redact_url(const char *url, char *out, size_t outlen)
{
    int i = lookup_url(url);

    if (i >= 0 && registry[i].redact) {
        registry[i].redact(url, out, outlen);
        return;
    }
    redact_any(url, out, outlen);
}

size_t store_registry_schemes(const char **out, size_t max)
{
    size_t n = 0;

    for (size_t i = 0; i < ARRAY_SIZE(registry) && n < max; i++)
        if (registry[i].scheme)
            out[n++] = registry[i].scheme;
    return n;
}

void store_registry_form(const char *scheme, char *out, size_t outlen)
{
    const char *form = NULL;

    /* a line without a form is said by the line before it */
    for (size_t i = 0; i < ARRAY_SIZE(registry); i++) {
        form = registry[i].form ? registry[i].form : form;
        if (registry[i].scheme && strcmp(registry[i].scheme, scheme) == 0)
            break;
    }
    snprintf(out, outlen, "use %s", form ? form : "");
}

void store_registry_forms(char *out, size_t outlen)
{
    size_t n = (size_t)snprintf(out, outlen, "use ");

    for (size_t i = 0, k = 0; i < ARRAY_SIZE(registry) && n < outlen; i++) {
        if (registry[i].form)
            n +=
                (size_t)snprintf(out + n, outlen - n, "%s%s", k++ ? ", or " : "", registry[i].form);
    }
}

/* "<store> <URL, its passwords hidden>". */
static void describe_url(const char *store, const struct store_registry_opts *o, char *out,
                         size_t outlen)
{
    size_t n = (size_t)snprintf(out, outlen, "%s ", store);

    if (n < outlen)
        store_registry_redact_url(o->url, out + n, outlen - n);
}

int store_registry_open(const struct store_registry_opts *o, struct worker_pool *pool,
                        struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                        size_t whylen)
{
    const struct threads th = { .pool = pool, .loops = loops, .nloops = nloops };
    int i = lookup_url(o->url);

    if (whylen)
        why[0] = '\0';
    if (i < 0)
        return store_registry_check_url(o->url, why, whylen);
    return registry[i].open(o, &th, ret, why, whylen);
}

void store_registry_describe(const struct store_registry_opts *o, char *out, size_t outlen)
{
    int i = lookup_url(o->url);

    if (i < 0)
        snprintf(out, outlen, "none");
    else
        registry[i].describe(o, out, outlen);
}
