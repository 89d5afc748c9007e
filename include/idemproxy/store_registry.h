/* SPDX-License-Identifier: MIT */
/* Opening a store from its URL (doc/stores.md, Choosing a store;
 * doc/configuration.md, Options): the one place that knows every store, each
 * by the schemes of its URLs (how such a URL is checked and shown without its
 * secrets, and the store opened from it). Adding a store is its files, one
 * line of the registry (store_registry.c) and its options (config.c's table,
 * the fields of struct store_registry_opts that carry them). Main thread, at
 * start; the URL functions are pure, any thread. */
#ifndef IDEMPROXY_STORE_REGISTRY_H
#define IDEMPROXY_STORE_REGISTRY_H

#include "idemproxy/common.h"
#include "idemproxy/redis_conn.h"

struct loop;
struct store;
struct worker_pool;

/* The options of every store, as the configuration gives them (borrowed
 * strings); each store reads its own. */
struct store_registry_opts {
    const char *url;                   /* --store / --redis; NULL: the memory store */
    const char *password;              /* from a password file, beats the URL's; NULL: none */
    uint64_t timeout_ms;               /* --store-timeout */
    size_t memory_max_bytes;           /* --memory-max-bytes */
    struct redis_tls_opts redis_tls;   /* --redis-tls-*, for rediss:// */
    const char *redis_tls_server_name; /* NULL: the URL's host */
    unsigned redis_wait_replicas;      /* --redis-wait-replicas; 0: none */
    uint64_t redis_wait_timeout_ms;    /* --redis-wait-timeout */
};

/* Opens the store <o> names (by the scheme of its URL, each line of the
 * registry one; no URL: the memory store), on <pool> and <loops> (borrowed,
 * created and not started yet: they must outlive the store). Returns 0 with
 * the store in <ret>; -EINVAL with why in <why> for a URL or option the store
 * cannot use (an unknown scheme, TLS files that cannot be read); another
 * negative errno (-ENOMEM, -EAGAIN...), <why> empty. */
int store_registry_open(const struct store_registry_opts *o, struct worker_pool *pool,
                        struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                        size_t whylen);

/* Checks the store URL <url> as the store of its scheme reads it. Returns 0,
 * -ENOMEM, or -EINVAL with why in <why> (<whylen> bytes, may be 0): no store
 * has URLs of its scheme (the schemes listed), or its store's reason. */
int store_registry_check_url(const char *url, char *why, size_t whylen);

/* Writes the store URL <url> into <out> (<outlen> bytes, at least 1) with its
 * secrets shown as "***" by its store; a URL of no store's scheme as its
 * scheme only (its rest shown as three stars) when it has user info or a
 * query, where a secret could hide. */
void store_registry_redact_url(const char *url, char *out, size_t outlen);

/* Writes "use <form>, or <form>...", the forms of every store's URLs, into
 * <out> (<outlen> bytes, at least 1): what a bad store URL is told. */
void store_registry_forms(char *out, size_t outlen);

/* Puts up to <max> of the stores' URL schemes ("postgresql", "redis"...,
 * static strings) in <out>; returns how many. */
size_t store_registry_schemes(const char **out, size_t max);

/* Writes "use <form>", the form of the URLs of <scheme> (one of
 * store_registry_schemes()), into <out>. */
void store_registry_form(const char *scheme, char *out, size_t outlen);

/* Describes the store <o> names for the start-up line, without a secret:
 * "memory (…)" or "redis redis://host:6379" (the password masked). */
void store_registry_describe(const struct store_registry_opts *o, char *out, size_t outlen);

#endif
