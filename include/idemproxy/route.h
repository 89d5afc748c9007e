/* SPDX-License-Identifier: MIT */
/* Routes (doc/configuration.md, The file): what a request is matched on (methods, raw path, host),
 * and the settings, key source and error dialect it then gets. A route table
 * is built once from the configuration (config_file.c), never changed, and
 * shared by reference: a reload swaps in a new table while the requests
 * that began under the old one keep it. Matching is pure and thread-safe. */
#ifndef IDEMPROXY_ROUTE_H
#define IDEMPROXY_ROUTE_H

#include <stdatomic.h>

#include "idemproxy/common.h"
#include "idemproxy/config.h"
#include "idemproxy/keysource.h"
#include "idemproxy/problem.h"

#define ROUTE_NAME_MAX 64
#define ROUTE_MAX 256           /* routes in one file */
#define ROUTE_DEFAULT "default" /* the route of a request that matches none */

struct reconcile_config;
struct record;
struct scope;

/* What a route's requests are fingerprinted by (doc/configuration.md,
 * Fingerprint), beyond the method and the target: the default (all zero) is
 * the body's bytes and the target as received. */
struct route_fingerprint {
    bool body_json;    /* body: json: the body's RFC 8785 form (canonjson.h), else its bytes */
    bool query_sorted; /* query: sorted: the target's parameters sorted, else as received */
    char *ignore[CONFIG_MAX_LIST]; /* owned: JSON pointers removed from a json body first */
    size_t nignore;
    char *headers[CONFIG_MAX_LIST]; /* owned: header names whose values join it */
    size_t nheaders;
};

struct route {
    char *name;          /* owned: [a-z0-9_-]{1,64}, or "default" */
    unsigned metrics_id; /* metrics_route_id() of <name> */
    /* match: an empty or NULL field matches anything */
    char *match_methods[CONFIG_MAX_LIST]; /* owned, upper case */
    size_t nmatch_methods;
    char *match_path; /* owned: an exact path, or the base of a prefix pattern */
    size_t match_path_len;
    bool match_prefix; /* the pattern was <base> + "/" + "*": <base> and everything below */
    char *match_host;  /* owned: compared case-insensitively with the Host value */
    /* what the route does */
    bool enforce;         /* false: every request of the route is passthrough */
    struct keysource key; /* owned: where its keys come from */
    /* resource (doc/configuration.md, Resource links): where a completed 2xx answer names what it
     * created, one of the two or none (NULL) */
    char *resource_header; /* owned: resource: {header: NAME} */
    char *resource_json;   /* owned: resource: {json: POINTER} (checked) */
    enum problem_dialect errors;
    struct route_fingerprint fingerprint;
    /* scope: jwt or a trusted header (doc/configuration.md, Scope), a
     * reference; NULL: the scope headers of <settings> */
    struct scope *scope;
    /* reconcile: how an unknown key is probed (doc/configuration.md,
     * Reconcile), owned; NULL: it is not */
    struct reconcile_config *reconcile;
    struct route_settings settings; /* owned: the top level's, with the route's own on top */
};

/* The routes, and the top-level settings that SIGHUP may change which the
 * pipeline reads per request: what a request runs under. */
struct route_table {
    atomic_int refs;
    size_t nroutes;       /* the file's routes, then "default": nroutes + 1 entries */
    struct route *routes; /* owned */
    enum config_on_store_error on_store_error; /* --on-store-error */
};

/* The route of a request: the first of <t> whose match accepts <method>, the
 * raw <path> (the target up to its '?', not decoded) and <host> (the Host
 * value, base NULL when absent), else the table's default. Never NULL. */
const struct route *route_match(const struct route_table *t, struct span method, struct span path,
                                struct span host);

/* Sets <rt>'s match.path from <pattern>: an exact path "/a/b", or a prefix
 * "/a/" + "*", which matches "/a" itself and every path under "/a/". Returns 0, -EINVAL (not
 * starting with '/', a '*' elsewhere, a byte outside 0x21-0x7E, a '?' or '#') or -ENOMEM. */
int route_set_path(struct route *rt, const char *pattern);

/* Checks a route name: [a-z0-9_-]{1,ROUTE_NAME_MAX}. */
bool route_name_is_valid(const char *name);

/* A new table of <n> routes plus a default, all zeroed but the refcount (1):
 * the builder fills them. Returns 0 or -ENOMEM. */
int route_table_new(size_t n, struct route_table **ret);

/* The default route of <t>: its last entry. */
static inline struct route *route_table_default(struct route_table *t)
{
    return &t->routes[t->nroutes];
}

/* The largest max-response, the longest wait and the shortest lock-ttl of
 * the routes of <t> (the default's included). */
size_t route_table_max_response(const struct route_table *t);
uint64_t route_table_max_wait(const struct route_table *t);
uint64_t route_table_min_lock_ttl(const struct route_table *t);

/* What a reload to <t> cannot give until a restart, one line a route into
 * <why> ("" for nothing): a wait when the process started without the
 * notifications --wait needs (<waits_subscribed> false, on a store), a
 * lock-ttl shorter than <min_lock_ttl_ms>, which the heartbeat was set up
 * for. Returns 1 when it wrote a line, else 0. */
int route_table_restart_notes(const struct route_table *t, bool waits_subscribed,
                              uint64_t min_lock_ttl_ms, char *why, size_t whylen);

struct route_table *route_table_ref(struct route_table *t);

/* Drops a reference; the last one frees the table and its routes. NULL-safe. */
void route_table_unref(struct route_table *t);

/* Frees what <rt> owns (not <rt>). NULL-safe, idempotent. */
void route_done(struct route *rt);

/* The resource that <rec>, a completed answer of <rt>, created, by the
 * route's resource: the value of its one header of that name, or the string
 * or integer its JSON body holds at the pointer; 1 to STORE_RESOURCE_MAX
 * bytes of 0x21-0x7E, into <ret> (256 bytes, NUL-terminated). Returns its
 * length, or 0 when the route names none, the answer is not 2xx, or it
 * holds no such value. */
size_t route_resource(const struct route *rt, const struct record *rec, char *ret);

#endif
