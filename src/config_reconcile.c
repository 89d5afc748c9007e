/* SPDX-License-Identifier: MIT */
/* A route's reconcile: block of the configuration file (doc/configuration.md,
 * Reconcile), into a struct reconcile_config (reconcile.h). Main thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_file_impl.h"
#include "idemproxy/config_parse.h"
#include "idemproxy/http.h"
#include "idemproxy/keysource.h"
#include "idemproxy/reconcile.h"

/* A duration with an optional unit ms, s, m or h (seconds without one). */
static bool duration(struct errs *e, const char *what, yaml_node_t *v, bool zero_ok, uint64_t *ret)
{
    const char *s = cfile_scalar(v);
    size_t len = s ? strlen(s) : 0;
    unsigned ms;
    int err;

    if (s && len > 2 && strcmp(s + len - 2, "ms") == 0) {
        char num[24];

        snprintf(num, sizeof(num), "%.*s", (int)(len - 2), s);
        err = len - 2 < sizeof(num) ? config_parse_count(num, zero_ok, &ms) : -EINVAL;
        if (err == 0)
            *ret = ms;
    } else {
        err =
            s ? (zero_ok ? config_parse_seconds0(s, ret) : config_parse_seconds(s, ret)) : -EINVAL;
    }
    if (err < 0)
        cfile_errs_add(e, v, "%s: '%s' is not a duration (such as 500ms, 10s, 5m or 1h)", what,
                       s ? s : cfile_type_name(v));
    return err == 0;
}

/* A status list: one status or a list of them, each 100-599. */
static void statuses(struct errs *e, const char *what, yaml_node_t *v, struct reconcile_rule *r)
{
    const char *items[CONFIG_MAX_LIST];
    bool is_list;
    int n = cfile_items_of(e, what, v, items, &is_list);
    r->nstatus = 0;
    if (n > RECONCILE_STATUS_MAX) {
        cfile_errs_add(e, v, "%s: at most %d statuses", what, RECONCILE_STATUS_MAX);
        return;
    }
    for (int i = 0; i < n; i++) {
        unsigned st;

        if (config_parse_count(items[i], false, &st) < 0 || st < 100 || st > 599) {
            cfile_errs_add(e, v, "%s: '%s' is not an HTTP status (100-599)", what, items[i]);
            return;
        }
        r->status[r->nstatus++] = st;
    }
}

/* A JSON pointer (RFC 6901) into <slot>. */
static void pointer(struct errs *e, const char *what, yaml_node_t *v, char **slot)
{
    const char *s = cfile_scalar(v);

    if (!s || !s[0] || keysource_pointer_check(s) < 0) {
        cfile_errs_add(e, v, "%s: '%s' is not a JSON pointer (RFC 6901, such as /data/0)", what,
                       s ? s : cfile_type_name(v));
        return;
    }
    free(*slot);
    *slot = cfile_dup_or_oom(e, s);
}

struct rule_ctx {
    struct reconcile_rule *r;
    const char *what;    /* "reconcile.found" */
    const char *ptr_key; /* "json" or "json-missing" */
};

static void rule_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    const struct rule_ctx *c = ctx;
    const char *names[] = { "status", c->ptr_key };
    char what[64];

    snprintf(what, sizeof(what), "%s.%s", c->what, key);
    if (strcmp(key, "status") == 0)
        statuses(e, what, v, c->r);
    else if (strcmp(key, c->ptr_key) == 0)
        pointer(e, what, v, &c->r->pointer);
    else
        cfile_unknown_key(e, k, c->what, key, names, 2);
}

static void request_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    static const char *const names[] = { "method", "target", "headers" };
    struct reconcile_config *c = ctx;
    const char *s = cfile_scalar(v), *items[CONFIG_MAX_LIST];
    char why[400];
    bool is_list;
    int n;

    if (strcmp(key, "method") == 0) {
        if (!s || !http_is_token(span_from_cstr(s)))
            cfile_errs_add(e, v, "reconcile.request.method: '%s' is not a method (such as GET)",
                           s ? s : cfile_type_name(v));
        else {
            free(c->method);
            c->method = cfile_dup_or_oom(e, s);
        }
    } else if (strcmp(key, "target") == 0) {
        if (!s)
            cfile_errs_add(e, v, "reconcile.request.target: needs a value");
        else if (reconcile_target_check(s, why, sizeof(why)) < 0)
            cfile_errs_add(e, v, "reconcile.request.target: %s", why);
        else {
            free(c->target);
            c->target = cfile_dup_or_oom(e, s);
        }
    } else if (strcmp(key, "headers") == 0) {
        n = cfile_items_of(e, "reconcile.request.headers", v, items, &is_list);
        for (int i = 0; i < n; i++) {
            if (!http_is_token(span_from_cstr(items[i]))) {
                cfile_errs_add(e, v, "reconcile.request.headers: '%s' is not a header name",
                               items[i]);
                return;
            }
            c->headers[c->nheaders++] = cfile_dup_or_oom(e, items[i]);
        }
    } else {
        cfile_unknown_key(e, k, "reconcile.request", key, names, 3);
    }
}

static void answer_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    static const char *const names[] = { "status" };
    struct reconcile_config *c = ctx;
    const char *s = cfile_scalar(v);

    if (strcmp(key, "status") != 0) {
        cfile_unknown_key(e, k, "reconcile.answer", key, names, 1);
    } else if (!s || config_parse_count(s, false, &c->answer_status) < 0 ||
               c->answer_status < 200 || c->answer_status > 299) {
        cfile_errs_add(e, v, "reconcile.answer.status: '%s' is not a 2xx status",
                       s ? s : cfile_type_name(v));
        c->answer_status = 200;
    }
}

static void reconcile_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v,
                           void *ctx)
{
    static const char *const names[] = { "request", "found", "absent",  "answer",
                                         "settle",  "every", "attempts" };
    struct reconcile_config *c = ctx;
    const char *s = cfile_scalar(v);

    if (strcmp(key, "request") == 0) {
        cfile_each_pair(e, v, "reconcile.request", request_pair, c);
    } else if (strcmp(key, "found") == 0) {
        cfile_each_pair(e, v, "reconcile.found", rule_pair,
                        &(struct rule_ctx){ &c->found, "reconcile.found", "json" });
    } else if (strcmp(key, "absent") == 0) {
        cfile_each_pair(e, v, "reconcile.absent", rule_pair,
                        &(struct rule_ctx){ &c->absent, "reconcile.absent", "json-missing" });
    } else if (strcmp(key, "answer") == 0) {
        cfile_each_pair(e, v, "reconcile.answer", answer_pair, c);
    } else if (strcmp(key, "settle") == 0) {
        duration(e, "reconcile.settle", v, true, &c->settle_ms);
    } else if (strcmp(key, "every") == 0) {
        duration(e, "reconcile.every", v, false, &c->every_ms);
    } else if (strcmp(key, "attempts") == 0) {
        if (!s || config_parse_count(s, false, &c->attempts) < 0)
            cfile_errs_add(e, v, "reconcile.attempts: '%s' is not a whole number from 1",
                           s ? s : cfile_type_name(v));
    } else {
        cfile_unknown_key(e, k, "reconcile", key, names, ARRAY_SIZE(names));
    }
}

void cfile_reconcile(struct errs *e, yaml_node_t *v, struct reconcile_config **ret)
{
    struct reconcile_config *c = calloc(1, sizeof(*c));
    unsigned before = e->n;

    *ret = NULL;
    if (!c) {
        e->oom = true;
        return;
    }
    reconcile_config_init(c);
    cfile_each_pair(e, v, "reconcile", reconcile_pair, c);
    if (e->n == before && !c->target)
        cfile_errs_add(e, v,
                       "reconcile: needs request.target (such as "
                       "\"/v1/payments?client_reference={key}\")");
    if (e->n == before && !c->found.nstatus)
        cfile_errs_add(e, v,
                       "reconcile: needs found.status (such as found: {status: [200], "
                       "json: /data/0})");
    if (e->n == before && !c->method)
        c->method = cfile_dup_or_oom(e, "GET"); /* out of memory: e->oom says so */
    if (e->n != before || e->oom) {
        reconcile_config_done(c);
        free(c);
        return;
    }
    *ret = c;
}
