/* SPDX-License-Identifier: MIT */
/* Opening a store from its URL (SPEC §2, §3): the one place that knows every
 * store, each by the schemes of its URLs, and the bridge between the
 * configuration and each store's own options. Adding a store is its files,
 * one line of the registry (store_registry.c) and its options. Main thread,
 * at start. */
#ifndef IDEMPROXY_STORE_REGISTRY_H
#define IDEMPROXY_STORE_REGISTRY_H

#include "idemproxy/common.h"

struct config;
struct loop;
struct store;
struct worker_pool;

/* Opens the store the configuration <cfg> names (by the scheme of its URL:
 * redis, rediss, redis-sentinel, rediss-sentinel; none: the memory store),
 * with the options of SPEC §3 it reads, on <pool> and <loops> (borrowed,
 * created and not started yet: they must outlive the store). Returns 0 with
 * the store in <ret>; -EINVAL with why in <why> for a URL or option the store
 * cannot use (an unknown scheme, TLS files that cannot be read); another
 * negative errno (-ENOMEM, -EAGAIN...), <why> empty. */
int store_registry_open(const struct config *cfg, struct worker_pool *pool,
                        struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                        size_t whylen);

/* Describes the store <cfg> names for the start-up line, without a secret:
 * "memory (…)" or "redis redis://host:6379" (the password masked). */
void store_registry_describe(const struct config *cfg, char *out, size_t outlen);

#endif
