/* SPDX-License-Identifier: MIT */
/* Route matching (doc/configuration.md, The file): first match wins, on bytes as the client sent
 * them. A table is immutable once built, so any thread may match against
 * it while it holds a reference. */
#include "idemproxy/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/http.h"
#include "idemproxy/reconcile.h"
#include "idemproxy/record.h"
#include "idemproxy/scope.h"
#include "idemproxy/store.h"

static bool path_matches(const struct route *rt, struct span path)
{
    size_t n = rt->match_path_len;

    if (!rt->match_path)
        return true;
    if (path.len == n && memcmp(path.base, rt->match_path, n) == 0)
        return true; /* the exact path, or a prefix's base itself */
    return rt->match_prefix && path.len > n && memcmp(path.base, rt->match_path, n) == 0 &&
           path.base[n] == '/';
}

/* A pattern without a port ("api.example.com") matches the Host value with
 * or without one: clients leave the default port out, and the proxy's own
 * port is no part of a route's identity. */
static bool host_matches(const struct route *rt, struct span host)
{
    const char *want = rt->match_host;
    size_t n, len;

    if (!want)
        return true;
    if (!host.base)
        return false;
    n = strlen(want);
    len = host.len;
    if (!strchr(want, ':') || (want[0] == '[' && want[n - 1] == ']')) {
        /* drop ":port" from the value, and nothing from an IPv6 literal's inside */
        for (size_t i = len; i > 0; i--) {
            char c = host.base[i - 1];

            if (c == ':') {
                len = i - 1;
                break;
            }
            if (c < '0' || c > '9')
                break;
        }
    }
    return len == n && strncasecmp(host.base, want, n) == 0;
}

static bool method_in(char *const *list, size_t n, struct span method)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(list[i]) == method.len && memcmp(list[i], method.base, method.len) == 0)
            return true;
    }
    return false;
}

const struct route *route_match(const struct route_table *t, struct span method, struct span path,
                                struct span host)
{
    for (size_t i = 0; i < t->nroutes; i++) {
        const struct route *rt = &t->routes[i];

        if ((rt->nmatch_methods == 0 || method_in(rt->match_methods, rt->nmatch_methods, method)) &&
            path_matches(rt, path) && host_matches(rt, host))
            return rt;
    }
    return &t->routes[t->nroutes];
}

int route_set_path(struct route *rt, const char *pattern)
{
    size_t n = strlen(pattern);
    bool prefix = n >= 2 && pattern[n - 1] == '*' && pattern[n - 2] == '/';
    char *copy;

    if (n == 0 || pattern[0] != '/')
        return -EINVAL;
    if (prefix)
        n -= 2; /* "/v1/" + "*" keeps "/v1"; "/" + "*" keeps "" (every path) */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)pattern[i];

        if (c < 0x21 || c > 0x7e || c == '*' || c == '?' || c == '#')
            return -EINVAL;
    }
    copy = strndup(pattern, n);
    if (!copy)
        return -ENOMEM;
    free(rt->match_path);
    rt->match_path = copy;
    rt->match_path_len = n;
    rt->match_prefix = prefix;
    return 0;
}

bool route_name_is_valid(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > ROUTE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];

        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

int route_table_new(size_t n, struct route_table **ret)
{
    struct route_table *t = calloc(1, sizeof(*t));

    if (!t)
        return -ENOMEM;
    t->routes = calloc(n + 1, sizeof(*t->routes));
    if (!t->routes) {
        free(t);
        return -ENOMEM;
    }
    t->nroutes = n;
    atomic_init(&t->refs, 1);
    *ret = t;
    return 0;
}

size_t route_table_max_response(const struct route_table *t)
{
    size_t most = 0;

    for (size_t i = 0; i <= t->nroutes; i++) {
        if (t->routes[i].settings.max_response_bytes > most)
            most = t->routes[i].settings.max_response_bytes;
    }
    return most;
}

uint64_t route_table_max_wait(const struct route_table *t)
{
    uint64_t most = 0;

    for (size_t i = 0; i <= t->nroutes; i++) {
        if (t->routes[i].settings.wait_ms > most)
            most = t->routes[i].settings.wait_ms;
    }
    return most;
}

uint64_t route_table_min_lock_ttl(const struct route_table *t)
{
    uint64_t least = UINT64_MAX;

    for (size_t i = 0; i <= t->nroutes; i++) {
        if (t->routes[i].settings.lock_ttl_ms < least)
            least = t->routes[i].settings.lock_ttl_ms;
    }
    return least;
}

int route_table_restart_notes(const struct route_table *t, bool waits_subscribed,
                              uint64_t min_lock_ttl_ms, char *why, size_t whylen)
{
    size_t used = 0;

    why[0] = '\0';
    for (size_t i = 0; i <= t->nroutes && used < whylen; i++) {
        const struct route *rt = &t->routes[i];
        const char *sep = used ? "\n" : "";

        if (rt->settings.wait_ms > 0 && !waits_subscribed)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: wait needs a restart (no route waited at start, "
                                     "so the notifications of --wait are not subscribed to); it "
                                     "answers 409 at once until then",
                                     sep, rt->name);
        else if (rt->settings.lock_ttl_ms < min_lock_ttl_ms)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: a lock-ttl shorter than at start (%llu ms) needs "
                                     "a restart for the heartbeat to keep up; the lock may lapse "
                                     "under a long request until then",
                                     sep, rt->name, (unsigned long long)min_lock_ttl_ms);
    }
    return why[0] ? 1 : 0;
}

struct route_table *route_table_ref(struct route_table *t)
{
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

static void list_free(char **list, size_t *n)
{
    for (size_t i = 0; i < *n; i++) {
        free(list[i]);
        list[i] = NULL;
    }
    *n = 0;
}

void route_done(struct route *rt)
{
    if (!rt)
        return;
    free(rt->name);
    rt->name = NULL;
    list_free(rt->match_methods, &rt->nmatch_methods);
    free(rt->match_path);
    rt->match_path = NULL;
    free(rt->match_host);
    rt->match_host = NULL;
    free(rt->resource_header);
    free(rt->resource_json);
    rt->resource_header = rt->resource_json = NULL;
    list_free(rt->fingerprint.ignore, &rt->fingerprint.nignore);
    list_free(rt->fingerprint.headers, &rt->fingerprint.nheaders);
    keysource_done(&rt->key);
    scope_unref(rt->scope);
    rt->scope = NULL;
    reconcile_config_done(rt->reconcile);
    free(rt->reconcile);
    rt->reconcile = NULL;
    config_route_done(&rt->settings);
}

void route_table_unref(struct route_table *t)
{
    if (!t || atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i <= t->nroutes; i++)
        route_done(&t->routes[i]);
    free(t->routes);
    free(t);
}

size_t route_resource(const struct route *rt, const struct record *rec, char *ret)
{
    struct idemkey k;
    const char *v = NULL;
    size_t n = 0, len;

    if ((!rt->resource_header && !rt->resource_json) || rec->too_large || rec->status < 200 ||
        rec->status > 299)
        return 0;
    if (rt->resource_json) {
        if (keysource_json(buf_span(&rec->body), rt->resource_json, &k) < 0)
            return 0;
        memcpy(ret, k.buf, k.len);
        ret[k.len] = '\0';
        return k.len;
    }
    for (size_t i = 0; i < rec->nheaders; i++) {
        if (strcasecmp(rec->headers[i].name, rt->resource_header) == 0) {
            v = rec->headers[i].value;
            n++;
        }
    }
    len = v ? strlen(v) : 0;
    if (n != 1 || !http_is_visible((struct span){ v, len }, STORE_RESOURCE_MAX))
        return 0;
    memcpy(ret, v, len + 1);
    return len;
}
