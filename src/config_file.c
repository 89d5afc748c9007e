/* SPDX-License-Identifier: MIT */
/* The YAML configuration file (doc/configuration.md, Configuration file), read
 * with libyaml's document API: the whole file is parsed first (a syntax error
 * has libyaml's position), then walked once for the top level and once for the
 * routes, each node keeping its position for the messages. Runs on the main
 * thread. */
#include "idemproxy/config_file.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config_file_impl.h"
#include "idemproxy/config.h"
#include "idemproxy/config_check.h"
#include "idemproxy/http.h"
#include "idemproxy/keysource.h"
#include "idemproxy/metrics.h"
#include "idemproxy/reconcile.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"

#define ERR_LINES_MAX 50 /* past this many problems, one line says how many more */

_Static_assert(KEYSOURCE_MAX_NAMES >= CONFIG_MAX_LIST, "a key source takes any list");

static void cfile_errs_vadd(struct errs *e, const yaml_node_t *at, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void cfile_errs_vadd(struct errs *e, const yaml_node_t *at, const char *fmt, va_list ap)
{
    size_t used = strlen(e->err);
    char msg[512];

    e->n++;
    if (e->n > ERR_LINES_MAX)
        return;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (e->n == ERR_LINES_MAX)
        snprintf(msg, sizeof(msg), "too many problems: the rest are not shown");
    if (at)
        snprintf(e->err + used, e->errlen - used, "%s%s:%zu:%zu: %s", used ? "\n" : "", e->f->path,
                 at->start_mark.line + 1, at->start_mark.column + 1, msg);
    else
        snprintf(e->err + used, e->errlen - used, "%s%s: %s", used ? "\n" : "", e->f->path, msg);
}

void cfile_errs_add(struct errs *e, const yaml_node_t *at, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    cfile_errs_vadd(e, at, fmt, ap);
    va_end(ap);
}

void cfile_unknown_key(struct errs *e, const yaml_node_t *k, const char *what, const char *key,
                       const char *const *names, size_t n)
{
    const char *near = config_nearest(key, strlen(key), names, n);
    char list[1024] = "";

    if (near) {
        cfile_errs_add(e, k, "%s: unknown key '%s' (did you mean %s?)", what, key, near);
        return;
    }
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                 i == 0      ? ""
                 : i + 1 < n ? ", "
                             : " or ",
                 names[i]);
    cfile_errs_add(e, k, "%s: unknown key '%s' (use %s)", what, key, list);
}

/* ---- reading ---- */

static void append_line(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void append_line(char *err, size_t errlen, const char *fmt, ...)
{
    size_t used = strlen(err);
    va_list ap;

    if (used && used + 1 < errlen)
        err[used++] = '\n';
    va_start(ap, fmt);
    vsnprintf(err + used, errlen - used, fmt, ap);
    va_end(ap);
}

/* Reads at most CONFIG_FILE_MAX_BYTES of <path> into a new buffer. */
static int slurp(const char *path, unsigned char **ret, size_t *ret_len, char *err, size_t errlen)
{
    unsigned char *data = malloc(CONFIG_FILE_MAX_BYTES + 1);
    size_t n;
    FILE *fp;
    int r = 0;

    if (!data)
        return -ENOMEM;
    fp = fopen(path, "re");
    if (!fp) {
        r = -errno;
        append_line(err, errlen, "%s: cannot read the configuration file: %s", path, strerror(-r));
        free(data);
        return -EINVAL;
    }
    errno = 0;
    n = fread(data, 1, CONFIG_FILE_MAX_BYTES + 1, fp);
    if (ferror(fp)) {
        append_line(err, errlen, "%s: cannot read the configuration file: %s", path,
                    strerror(errno ? errno : EIO)); /* EISDIR for a directory */
        r = -EINVAL;
    } else if (n > CONFIG_FILE_MAX_BYTES) {
        append_line(err, errlen, "%s: larger than %u bytes: not a configuration file", path,
                    CONFIG_FILE_MAX_BYTES);
        r = -EINVAL;
    }
    fclose(fp);
    if (r < 0) {
        free(data);
        return r;
    }
    *ret = data;
    *ret_len = n;
    return 0;
}

/* Whether libyaml's problem at byte <at> of <data> is a tab, or a tab
 * among the spaces that indent its line: the usual cause of its "cannot
 * start any token", which does not say so. */
static bool at_tab(const unsigned char *data, size_t len, size_t at)
{
    size_t i = at < len ? at : len;

    if (i < len && data[i] == '\t')
        return true;
    while (i > 0 && data[i - 1] != '\n')
        i--;
    for (; i < len && (data[i] == ' ' || data[i] == '\t'); i++)
        if (data[i] == '\t')
            return true;
    return false;
}

int config_file_read(const char *path, struct config_file **ret, char *err, size_t errlen)
{
    struct config_file *f = NULL;
    unsigned char *data = NULL;
    yaml_parser_t parser;
    yaml_document_t extra;
    bool parser_up = false;
    size_t len;
    int r;

    r = slurp(path, &data, &len, err, errlen);
    if (r < 0)
        return r;
    f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path)) || !(f->doc = calloc(1, sizeof(*f->doc))) ||
        !yaml_parser_initialize(&parser)) {
        r = -ENOMEM;
        goto fail;
    }
    parser_up = true;
    yaml_parser_set_input_string(&parser, data, len);
    if (!yaml_parser_load(&parser, f->doc)) {
        free(f->doc); /* nothing to delete */
        f->doc = NULL;
        append_line(err, errlen, "%s:%zu:%zu: %s%s%s%s", path, parser.problem_mark.line + 1,
                    parser.problem_mark.column + 1, parser.problem ? parser.problem : "not YAML",
                    parser.context ? " " : "", parser.context ? parser.context : "",
                    at_tab(data, len, parser.problem_mark.index)
                        ? ": this is a tab, and YAML indents with spaces only (replace each "
                          "tab with spaces)"
                        : "");
        r = -EINVAL;
        goto fail;
    }
    /* A second document would be silently ignored: say so instead. */
    if (!yaml_parser_load(&parser, &extra)) {
        append_line(err, errlen, "%s:%zu:%zu: %s", path, parser.problem_mark.line + 1,
                    parser.problem_mark.column + 1, parser.problem ? parser.problem : "not YAML");
        r = -EINVAL;
        goto fail;
    }
    if (yaml_document_get_root_node(&extra)) {
        append_line(err, errlen, "%s:%zu:%zu: a second YAML document: the file holds one", path,
                    extra.start_mark.line + 1, extra.start_mark.column + 1);
        yaml_document_delete(&extra);
        r = -EINVAL;
        goto fail;
    }
    yaml_document_delete(&extra);
    yaml_parser_delete(&parser);
    free(data);
    *ret = f;
    return 0;

fail:
    if (parser_up)
        yaml_parser_delete(&parser);
    free(data);
    config_file_free(f);
    return r;
}

void config_file_free(struct config_file *f)
{
    if (!f)
        return;
    if (f->doc)
        yaml_document_delete(f->doc);
    free(f->doc);
    free(f->path);
    free(f);
}

/* ---- nodes ---- */

yaml_node_t *cfile_node(const struct config_file *f, int id)
{
    return yaml_document_get_node(f->doc, id);
}

/* The text of scalar <n>; NULL for a YAML null (an empty, "~" or "null"
 * plain scalar), or a scalar holding a NUL byte, which no option takes. */
const char *cfile_scalar(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;

    if (n->type != YAML_SCALAR_NODE || strlen(s) != len)
        return NULL;
    if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
        (len == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
         strcmp(s, "NULL") == 0))
        return NULL;
    return s;
}

const char *cfile_type_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return cfile_scalar(n) ? "a value" : "null";
    }
}

/* Calls <fn> for each pair of mapping <map>, after checking that its key is
 * a scalar seen once. <what> names the mapping in messages. */

void cfile_each_pair(struct errs *e, yaml_node_t *map, const char *what, pair_fn *fn, void *ctx)
{
    const struct config_file *f = e->f;

    if (map->type != YAML_MAPPING_NODE) {
        cfile_errs_add(e, map, "%s must be a mapping (key: value), not %s", what,
                       cfile_type_name(map));
        return;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = cfile_node(f, p->key), *v = cfile_node(f, p->value);
        const char *key = k ? cfile_scalar(k) : NULL;
        bool dup = false;

        if (!k || !v)
            continue;
        if (!key) {
            cfile_errs_add(e, k, "%s: a key must be a plain name", what);
            continue;
        }
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p && !dup; q++) {
            yaml_node_t *qk = cfile_node(f, q->key);
            const char *other = qk ? cfile_scalar(qk) : NULL;

            if (other && strcmp(other, key) == 0) {
                cfile_errs_add(e, k, "duplicate key '%s' (first at line %zu)", key,
                               qk->start_mark.line + 1);
                dup = true;
            }
        }
        if (!dup)
            fn(e, key, k, v, ctx);
    }
}

/* The items of <v>, a scalar or a list of scalars, into <items> (at most
 * CONFIG_MAX_LIST). Returns the count, or -1 with the problem reported. */
int cfile_items_of(struct errs *e, const char *key, yaml_node_t *v, const char **items,
                   bool *ret_is_list)
{
    size_t n = 0;

    *ret_is_list = v->type == YAML_SEQUENCE_NODE;
    if (v->type == YAML_MAPPING_NODE) {
        cfile_errs_add(e, v, "%s: takes a value or a list, not a mapping", key);
        return -1;
    }
    if (v->type == YAML_SCALAR_NODE) {
        if (!(items[0] = cfile_scalar(v))) {
            cfile_errs_add(e, v, "%s: needs a value", key);
            return -1;
        }
        return 1;
    }
    for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top; i++) {
        yaml_node_t *item = cfile_node(e->f, *i);

        if (!item)
            continue;
        if (item->type != YAML_SCALAR_NODE || !cfile_scalar(item)) {
            cfile_errs_add(e, item, "%s: a list entry must be a value, not %s", key,
                           cfile_type_name(item));
            return -1;
        }
        if (n == CONFIG_MAX_LIST) {
            cfile_errs_add(e, item, "%s: too many entries (at most %d)", key, CONFIG_MAX_LIST);
            return -1;
        }
        items[n++] = cfile_scalar(item);
    }
    return (int)n;
}

/* Sets option <key> from <v>: of the process's <cfg>, or of a route's
 * settings <rs> (<cfg> NULL); a problem is reported at <k> (an unknown key)
 * or <v> (a bad value). */
static void set_option(struct errs *e, struct config *cfg, struct route_settings *rs,
                       const char *key, yaml_node_t *k, yaml_node_t *v)
{
    const char *items[CONFIG_MAX_LIST];
    char why[512];
    bool is_list;
    int n = cfile_items_of(e, key, v, items, &is_list);
    int r;

    if (n < 0)
        return;
    if (cfg)
        r = config_set_option(cfg, key, items, (size_t)n, is_list, why, sizeof(why));
    else
        r = config_set_route_option(rs, key, items, (size_t)n, is_list, why, sizeof(why));
    if (r == -ENOMEM)
        e->oom = true;
    if (r < 0)
        cfile_errs_add(e, r == -ENOENT ? k : v, "%s", why);
}

/* ---- routes ---- */

static bool parse_bool_node(struct errs *e, const char *key, yaml_node_t *v, bool *ret)
{
    const char *s = cfile_scalar(v);

    if (!s || config_parse_bool(s, ret) < 0) {
        cfile_errs_add(e, v, "%s: '%s' is not a boolean (use true or false)", key,
                       s ? s : cfile_type_name(v));
        return false;
    }
    return true;
}

char *cfile_dup_or_oom(struct errs *e, const char *s)
{
    char *copy = strdup(s);

    if (!copy)
        e->oom = true;
    return copy;
}

/* The keys of a key source (keysource.h): its kinds and the fallback. */
static const char *const key_keys[] = { "header", "headers", "json", "fallback" };

static void key_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    const char *items[CONFIG_MAX_LIST];
    char what[64], why[512];
    bool is_list;
    int n, r;

    snprintf(what, sizeof(what), "key.%s", key);
    n = cfile_items_of(e, what, v, items, &is_list);
    if (n < 0)
        return;
    r = keysource_set(ctx, key, items, (size_t)n, is_list, why, sizeof(why));
    if (r == -ENOMEM)
        e->oom = true;
    else if (r == -ENOENT)
        cfile_unknown_key(e, k, "key", key, key_keys, ARRAY_SIZE(key_keys));
    else if (r < 0)
        cfile_errs_add(e, v, "%s", why);
}

/* resource: {header: NAME} or {json: POINTER}, one of them
 * (doc/configuration.md, Resource links). */
static void resource_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v,
                          void *ctx)
{
    struct route *rt = ctx;
    const char *s = cfile_scalar(v);

    if (rt->resource_header || rt->resource_json) {
        cfile_errs_add(e, k, "resource: give one source, header or json");
    } else if (strcmp(key, "header") == 0) {
        if (s && http_is_token(span_from_cstr(s)))
            rt->resource_header = cfile_dup_or_oom(e, s);
        else
            cfile_errs_add(e, v,
                           "resource.header: '%s' is not a header name (a token such as Location)",
                           s ? s : cfile_type_name(v));
    } else if (strcmp(key, "json") == 0) {
        if (s && keysource_pointer_check(s) == 0)
            rt->resource_json = cfile_dup_or_oom(e, s);
        else
            cfile_errs_add(e, v,
                           "resource.json: '%s' is not a JSON pointer (RFC 6901, such as /id or "
                           "/data/0/id)",
                           s ? s : cfile_type_name(v));
    } else {
        static const char *const names[] = { "header", "json" };

        cfile_unknown_key(e, k, "resource", key, names, ARRAY_SIZE(names));
    }
}

/* Copies the <n> <items> into <list>, each passing <ok> (else reported as
 * not <what>). */
static void fingerprint_list(struct errs *e, const char *key, yaml_node_t *v, char **list,
                             size_t *ret_n, bool (*ok)(const char *), const char *what)
{
    const char *items[CONFIG_MAX_LIST];
    bool is_list;
    int n = cfile_items_of(e, key, v, items, &is_list);

    for (int i = 0; i < n; i++) {
        if (!ok(items[i])) {
            cfile_errs_add(e, v, "%s: '%s' is not %s", key, items[i], what);
            return;
        }
    }
    for (int i = 0; i < n && !e->oom; i++) {
        list[*ret_n] = cfile_dup_or_oom(e, items[i]);
        *ret_n += list[*ret_n] != NULL;
    }
}

/* A pointer to a member or an entry: "" (the whole body) would make every
 * JSON body fingerprint alike. */
static bool is_pointer(const char *s) { return s[0] && keysource_pointer_check(s) == 0; }

static bool is_header_name(const char *s) { return http_is_token(span_from_cstr(s)); }

/* fingerprint: {body: raw|json, ignore: [POINTER...], headers: [NAME...],
 * query: raw|sorted} (doc/configuration.md, Fingerprint). */
static const char *const fingerprint_keys[] = { "body", "ignore", "headers", "query" };

static void fingerprint_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v,
                             void *ctx)
{
    struct route_fingerprint *fp = ctx;
    const char *s = cfile_scalar(v);

    if (strcmp(key, "body") == 0 && s && (!strcmp(s, "raw") || !strcmp(s, "json")))
        fp->body_json = strcmp(s, "json") == 0;
    else if (strcmp(key, "body") == 0)
        cfile_errs_add(e, v, "fingerprint.body: '%s' is not raw or json",
                       s ? s : cfile_type_name(v));
    else if (strcmp(key, "query") == 0 && s && (!strcmp(s, "raw") || !strcmp(s, "sorted")))
        fp->query_sorted = strcmp(s, "sorted") == 0;
    else if (strcmp(key, "query") == 0)
        cfile_errs_add(e, v, "fingerprint.query: '%s' is not raw or sorted",
                       s ? s : cfile_type_name(v));
    else if (strcmp(key, "ignore") == 0 && fp->nignore == 0)
        fingerprint_list(e, "fingerprint.ignore", v, fp->ignore, &fp->nignore, is_pointer,
                         "a JSON pointer (RFC 6901, such as /id or /metadata/at)");
    else if (strcmp(key, "headers") == 0 && fp->nheaders == 0)
        fingerprint_list(e, "fingerprint.headers", v, fp->headers, &fp->nheaders, is_header_name,
                         "a header name (a token such as Stripe-Version)");
    else
        cfile_unknown_key(e, k, "fingerprint", key, fingerprint_keys, ARRAY_SIZE(fingerprint_keys));
}

/* ---- scope (doc/configuration.md, Scope) ---- */

/* The forms a scope takes: one of them. */
struct scope_nodes {
    yaml_node_t *headers, *jwt, *header, *trusted;
};

static const char *const scope_keys[] = { "headers", "jwt", "header", "trusted" };

static void scope_find(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct scope_nodes *n = ctx;

    if (strcmp(key, "headers") == 0)
        n->headers = v;
    else if (strcmp(key, "jwt") == 0)
        n->jwt = v;
    else if (strcmp(key, "header") == 0)
        n->header = v;
    else if (strcmp(key, "trusted") == 0)
        n->trusted = v;
    else
        cfile_unknown_key(e, k, "scope", key, scope_keys, ARRAY_SIZE(scope_keys));
}

struct jwt_ctx {
    struct scope_jwt_config c;
    const char *claims[CONFIG_MAX_LIST];
};

/* Where scope.jwt's text key <key> goes in <c>, NULL: not one. */
static const char **jwt_slot(struct scope_jwt_config *c, const char *key)
{
    static const struct {
        const char *key;
        size_t off;
    } slots[] = {
        { "header", offsetof(struct scope_jwt_config, header) },
        { "keys", offsetof(struct scope_jwt_config, keys_file) },
        { "keys-url", offsetof(struct scope_jwt_config, keys_url) },
        { "secret-file", offsetof(struct scope_jwt_config, secret_file) },
        { "issuer", offsetof(struct scope_jwt_config, issuer) },
        { "audience", offsetof(struct scope_jwt_config, audience) },
    };

    for (size_t i = 0; i < ARRAY_SIZE(slots); i++) {
        if (strcmp(slots[i].key, key) == 0)
            return (const char **)(void *)((char *)c + slots[i].off);
    }
    return NULL;
}

static void jwt_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct jwt_ctx *j = ctx;
    const char **slot = jwt_slot(&j->c, key);
    const char *s = cfile_scalar(v);
    uint64_t ms;
    bool is_list;
    int n;

    if (strcmp(key, "claims") == 0) {
        n = cfile_items_of(e, "scope.jwt.claims", v, j->claims, &is_list);
        j->c.nclaims = n > 0 ? (size_t)n : 0;
        if (n == 0)
            cfile_errs_add(e, v,
                           "scope.jwt.claims: name at least one claim (without the key: [sub])");
    } else if (strcmp(key, "leeway") == 0) {
        if (s && config_parse_seconds0(s, &ms) == 0 && ms % 1000 == 0 && ms <= 3600000)
            j->c.leeway_s = ms / 1000;
        else
            cfile_errs_add(e, v, "scope.jwt.leeway: '%s' is not a number of seconds (0 to 3600)",
                           s ? s : cfile_type_name(v));
    } else if (!slot) {
        static const char *const names[] = { "header", "keys",     "keys-url", "secret-file",
                                             "issuer", "audience", "claims",   "leeway" };

        cfile_unknown_key(e, k, "scope.jwt", key, names, ARRAY_SIZE(names));
    } else if (!s || !s[0]) {
        cfile_errs_add(e, v, "scope.jwt.%s: needs a value", key);
    } else if (strcmp(key, "header") == 0 && !is_header_name(s)) {
        cfile_errs_add(e, v, "scope.jwt.header: '%s' is not a header name", s);
    } else {
        *slot = s;
    }
}

/* scope: {jwt: {...}} into <ret>. */
static void parse_jwt(struct errs *e, yaml_node_t *v, struct scope **ret)
{
    struct jwt_ctx j = { .c.leeway_s = 60 };
    size_t before = e->n;
    char why[512];
    int r;

    cfile_each_pair(e, v, "scope.jwt", jwt_pair, &j);
    if (e->n != before || e->oom)
        return;
    j.c.claims = j.claims;
    r = scope_jwt_new(&j.c, ret, why, sizeof(why));
    if (r == -ENOMEM)
        e->oom = true;
    else if (r < 0)
        cfile_errs_add(e, v, "%s", why);
}

/* scope: {header: NAME, trusted: [CIDR...]} into <ret>. */
static void parse_trusted(struct errs *e, yaml_node_t *at, const struct scope_nodes *n,
                          struct scope **ret)
{
    const char *cidrs[CONFIG_MAX_LIST], *h = n->header ? cfile_scalar(n->header) : NULL;
    char why[512];
    bool is_list;
    int count, r;

    if (!n->header || !n->trusted) {
        cfile_errs_add(e, at,
                       "scope: a principal header needs trusted: the networks of the gateway that "
                       "sets it (and trusted needs header)");
        return;
    }
    if (!h || !is_header_name(h)) {
        cfile_errs_add(e, n->header, "scope.header: '%s' is not a header name",
                       h ? h : cfile_type_name(n->header));
        return;
    }
    count = cfile_items_of(e, "scope.trusted", n->trusted, cidrs, &is_list);
    if (count < 0)
        return;
    r = scope_trusted_new(h, cidrs, (size_t)count, ret, why, sizeof(why));
    if (r == -ENOMEM)
        e->oom = true;
    else if (r < 0)
        cfile_errs_add(e, n->trusted, "%s", why);
}

/* A scope node <v>: {headers} sets the scope headers of <rs> (when not
 * NULL: the top level's are set by config_file_apply()), {jwt} and
 * {header, trusted} make <ret>. */
static void parse_scope(struct errs *e, yaml_node_t *v, struct route_settings *rs,
                        struct scope **ret)
{
    struct scope_nodes n = { NULL, NULL, NULL, NULL };
    size_t before = e->n;

    cfile_each_pair(e, v, "scope", scope_find, &n);
    if (e->n != before)
        return;
    if (!!n.headers + !!n.jwt + !!(n.header || n.trusted) != 1)
        cfile_errs_add(e, v, "scope: give one of headers, jwt, or header with trusted");
    else if (n.headers && rs)
        set_option(e, NULL, rs, "scope-header", n.headers, n.headers);
    else if (n.jwt)
        parse_jwt(e, n.jwt, ret);
    else if (!n.headers)
        parse_trusted(e, v, &n, ret);
}

/* ---- the top level ---- */

static void top_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct config *cfg = ctx;

    if (strcmp(key, "scope") == 0) {
        /* {headers} is the top level's scope-header; the other forms, and
         * every problem, are config_file_routes()' */
        struct scope_nodes n = { NULL, NULL, NULL, NULL };
        struct errs quiet = { .f = e->f, .err = (char[1]){ 0 }, .errlen = 1 };

        cfile_each_pair(&quiet, v, "scope", scope_find, &n);
        if (n.headers && !n.jwt && !n.header && !n.trusted)
            set_option(e, cfg, NULL, "scope-header", n.headers, n.headers);
        return;
    }
    if (strcmp(key, "routes") == 0 || strcmp(key, "key") == 0 || strcmp(key, "errors") == 0 ||
        strcmp(key, "fingerprint") == 0)
        return; /* config_file_routes() */
    if (strcmp(key, "config") == 0 || strcmp(key, "check-config") == 0) {
        cfile_errs_add(e, k, "'%s' is a command-line option, not a key of the file", key);
        return;
    }
    set_option(e, cfg, NULL, key, k, v);
}

int config_file_apply(const struct config_file *f, struct config *cfg, char *err, size_t errlen)
{
    struct errs e = { .f = f, .err = err, .errlen = errlen };
    yaml_node_t *root = yaml_document_get_root_node(f->doc);

    if (!root)
        return 0; /* an empty file sets nothing */
    cfile_each_pair(&e, root, "the file", top_pair, cfg);
    if (e.oom)
        return -ENOMEM;
    return e.n ? -EINVAL : 0;
}

static void parse_errors(struct errs *e, yaml_node_t *v, enum problem_dialect *ret)
{
    const char *s = cfile_scalar(v);

    if (s && strcmp(s, "problem") == 0)
        *ret = PROBLEM_DIALECT_PROBLEM;
    else if (s && strcmp(s, "stripe") == 0)
        *ret = PROBLEM_DIALECT_STRIPE;
    else
        cfile_errs_add(e, v, "errors: '%s' is not an error dialect (use problem or stripe)",
                       s ? s : cfile_type_name(v));
}

static void match_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct route *rt = ctx;
    const char *s = cfile_scalar(v);
    int r;

    if (strcmp(key, "methods") == 0) {
        const char *items[CONFIG_MAX_LIST];
        bool is_list;
        int n = cfile_items_of(e, "match.methods", v, items, &is_list);

        for (int i = 0; i < n; i++) {
            char *m;

            if (!http_is_token(span_from_cstr(items[i]))) {
                cfile_errs_add(e, v, "match.methods: '%s' is not a method", items[i]);
                return;
            }
            m = cfile_dup_or_oom(e, items[i]);
            for (char *c = m; c && *c; c++)
                *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c);
            rt->match_methods[rt->nmatch_methods++] = m;
        }
    } else if (strcmp(key, "path") == 0) {
        r = s ? route_set_path(rt, s) : -EINVAL;
        if (r == -ENOMEM)
            e->oom = true;
        else if (r < 0)
            cfile_errs_add(
                e, v,
                "match.path: '%s' is not a path (an exact path such as /v1/payments, or a "
                "prefix ending in /* such as /v1/*; visible ASCII, no ? or #)",
                s ? s : cfile_type_name(v));
    } else if (strcmp(key, "host") == 0) {
        bool ok = s && *s && strlen(s) <= 255;

        for (const char *c = s; ok && *c; c++)
            ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 strchr("-.:[]_", *c);
        if (!ok)
            cfile_errs_add(e, v,
                           "match.host: '%s' is not a host (a name or address, optionally :port)",
                           s ? s : cfile_type_name(v));
        else
            rt->match_host = cfile_dup_or_oom(e, s);
    } else {
        static const char *const names[] = { "methods", "path", "host" };

        cfile_unknown_key(e, k, "match", key, names, ARRAY_SIZE(names));
    }
}

struct route_ctx {
    struct route *rt;
    const struct route_table *t; /* the routes before this one, for unique names */
    size_t index;
    yaml_node_t *name_node;
    bool has_key;         /* the route sets its own key (else: the top level's) */
    bool has_fingerprint; /* the route sets its own fingerprint (else: the top level's) */
    bool has_scope;       /* the route sets its own scope or scope-header (else: the top's) */
    bool scope_block, scope_header; /* which of the two it sets: one at most */
};

/* A route's key that is none of its own nor an option a route may set. */
static void route_unknown_key(struct errs *e, const yaml_node_t *k, const char *key)
{
    static const char *const own[] = { "name",     "match",       "enforce", "key",      "errors",
                                       "resource", "fingerprint", "scope",   "reconcile" };
    const char *names[ARRAY_SIZE(own) + 64];
    size_t n = ARRAY_SIZE(own);
    char options[512];

    memcpy(names, own, sizeof(own));
    n += config_route_option_list(names + n, ARRAY_SIZE(names) - n);
    if (config_nearest(key, strlen(key), names, n)) {
        cfile_unknown_key(e, k, "route", key, names, n);
        return;
    }
    config_route_option_names(options, sizeof(options));
    cfile_errs_add(e, k,
                   "route: unknown key '%s' (a route has name, match, enforce, key, errors, "
                   "resource, fingerprint, scope, reconcile, and the options %s)",
                   key, options);
}

static void route_pair(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct route_ctx *c = ctx;
    struct route *rt = c->rt;
    const char *s = cfile_scalar(v);

    if (strcmp(key, "name") == 0) {
        c->name_node = v;
        if (!s || !route_name_is_valid(s)) {
            cfile_errs_add(e, v, "name: '%s' is not a route name ([a-z0-9_-], 1 to %d characters)",
                           s ? s : cfile_type_name(v), ROUTE_NAME_MAX);
            return;
        }
        if (strcmp(s, ROUTE_DEFAULT) == 0) {
            cfile_errs_add(e, v,
                           "name: '%s' is the route of requests that match no route; choose "
                           "another name",
                           s);
            return;
        }
        for (size_t i = 0; i < c->index; i++) {
            if (c->t->routes[i].name && strcmp(c->t->routes[i].name, s) == 0) {
                cfile_errs_add(e, v, "name: '%s' is already the name of route %zu", s, i + 1);
                return;
            }
        }
        rt->name = cfile_dup_or_oom(e, s);
    } else if (strcmp(key, "match") == 0) {
        cfile_each_pair(e, v, "match", match_pair, rt);
    } else if (strcmp(key, "enforce") == 0) {
        (void)parse_bool_node(e, key, v, &rt->enforce);
    } else if (strcmp(key, "key") == 0) {
        c->has_key = true;
        cfile_each_pair(e, v, "key", key_pair, &rt->key);
    } else if (strcmp(key, "errors") == 0) {
        parse_errors(e, v, &rt->errors);
    } else if (strcmp(key, "resource") == 0) {
        cfile_each_pair(e, v, "resource", resource_pair, rt);
    } else if (strcmp(key, "fingerprint") == 0) {
        c->has_fingerprint = true;
        cfile_each_pair(e, v, "fingerprint", fingerprint_pair, &rt->fingerprint);
    } else if (strcmp(key, "scope") == 0) {
        c->has_scope = c->scope_block = true;
        parse_scope(e, v, &rt->settings, &rt->scope);
    } else if (strcmp(key, "reconcile") == 0) {
        cfile_reconcile(e, v, &rt->reconcile);
    } else if (config_is_route_option(key)) {
        c->scope_header |= strcmp(key, "scope-header") == 0;
        c->has_scope |= c->scope_header;
        set_option(e, NULL, &rt->settings, key, k, v);
    } else {
        route_unknown_key(e, k, key);
    }
}

/* The top level's key, errors, fingerprint, scope and routes nodes (NULL: absent). */
struct top_nodes {
    yaml_node_t *key, *errors, *fingerprint, *scope, *routes;
};

static void find_top(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx)
{
    struct top_nodes *t = ctx;

    (void)e, (void)k;
    if (strcmp(key, "key") == 0)
        t->key = v;
    else if (strcmp(key, "errors") == 0)
        t->errors = v;
    else if (strcmp(key, "fingerprint") == 0)
        t->fingerprint = v;
    else if (strcmp(key, "scope") == 0)
        t->scope = v;
    else if (strcmp(key, "routes") == 0)
        t->routes = v;
}

static void check_route(struct errs *e, const struct config *cfg, struct route *rt, yaml_node_t *at)
{
    char why[512];

    if (config_check_route(cfg, &rt->settings, why, sizeof(why)) < 0)
        cfile_errs_add(e, at, "route '%s': %s", rt->name ? rt->name : "?", why);
    if (rt->fingerprint.nignore && !rt->fingerprint.body_json)
        cfile_errs_add(e, at,
                       "route '%s': fingerprint.ignore needs body: json (a raw body's bytes "
                       "have no members to leave out)",
                       rt->name ? rt->name : ROUTE_DEFAULT);
    for (size_t i = 0; rt->reconcile && i < rt->fingerprint.nignore; i++) {
        if (reconcile_target_reads(rt->reconcile->target, rt->fingerprint.ignore[i]))
            cfile_errs_add(e, at,
                           "route '%s': reconcile's target reads the body at %s, which "
                           "fingerprint.ignore leaves out: a duplicate with another value "
                           "there would have the probe look for another request",
                           rt->name ? rt->name : ROUTE_DEFAULT, rt->fingerprint.ignore[i]);
    }
    if (rt->reconcile && rt->settings.on_unknown == CONFIG_ON_UNKNOWN_RETRY)
        cfile_errs_add(e, at,
                       "route '%s': reconcile needs on-unknown-outcome: refuse (under retry no "
                       "key is left unknown to probe)",
                       rt->name ? rt->name : ROUTE_DEFAULT);
}

/* The default route (the top level's key), every route without a key
 * source of its own given the top level's key-header, and each route's
 * metrics id. */
static void finish_table(struct errs *e, const struct config *cfg, const struct top_nodes *top,
                         struct route_table *t)
{
    struct route *def = route_table_default(t);

    def->name = cfile_dup_or_oom(e, ROUTE_DEFAULT);
    if (top->key)
        cfile_each_pair(e, top->key, "key", key_pair, &def->key);
    if (top->fingerprint)
        cfile_each_pair(e, top->fingerprint, "fingerprint", fingerprint_pair, &def->fingerprint);
    if (top->fingerprint && def->fingerprint.nignore && !def->fingerprint.body_json)
        cfile_errs_add(e, top->fingerprint,
                       "fingerprint.ignore needs body: json (a raw body's bytes "
                       "have no members to leave out)");
    for (size_t i = 0; i <= t->nroutes; i++) {
        if (keysource_set_default(&t->routes[i].key, cfg->key_header) < 0)
            e->oom = true;
    }
    for (size_t i = 0; i <= t->nroutes && !e->oom && e->n == 0; i++) {
        int id = metrics_route_id(t->routes[i].name);

        if (id < 0)
            cfile_errs_add(e, NULL, "route '%s': more than %d route names since the start; restart",
                           t->routes[i].name, METRICS_ROUTES_MAX);
        else
            t->routes[i].metrics_id = (unsigned)id;
    }
}

/* Route <i> of the file into <t>: its own keys, then what it takes from
 * the top level (<top>, <top_scope>). */
static void route_at(struct errs *e, const struct config *cfg, const struct top_nodes *top,
                     struct scope *top_scope, struct route_table *t, size_t i)
{
    yaml_node_t *rn = cfile_node(e->f, top->routes->data.sequence.items.start[i]);
    struct route_ctx c = { .rt = &t->routes[i], .t = t, .index = i };

    if (!rn)
        return;
    cfile_each_pair(e, rn, "a route", route_pair, &c);
    if ((!c.has_key && top->key) || (!c.has_fingerprint && top->fingerprint)) {
        /* the top level's: its problems are said once, for the default route */
        struct errs quiet = { .f = e->f, .err = (char[1]){ 0 }, .errlen = 1 };

        if (!c.has_key && top->key)
            cfile_each_pair(&quiet, top->key, "key", key_pair, &c.rt->key);
        if (!c.has_fingerprint && top->fingerprint)
            cfile_each_pair(&quiet, top->fingerprint, "fingerprint", fingerprint_pair,
                            &c.rt->fingerprint);
        e->oom |= quiet.oom;
    }
    if (!c.has_scope)
        c.rt->scope = scope_ref(top_scope);
    if (c.scope_block && c.scope_header)
        cfile_errs_add(e, rn,
                       "route %zu: give scope or scope-header, not both (scope: {headers: [...]} "
                       "is scope-header's long form)",
                       i + 1);
    if (rn->type == YAML_MAPPING_NODE && !c.name_node)
        cfile_errs_add(e, rn, "route %zu: name is required", i + 1);
    check_route(e, cfg, c.rt, rn);
}

int config_file_routes(const struct config_file *f, const struct config *cfg,
                       struct route_table **ret, char *err, size_t errlen)
{
    struct config_file none = { .path = (char *)"" };
    struct errs e = { .f = f ? f : &none, .err = err, .errlen = errlen };
    struct top_nodes top = { NULL, NULL, NULL, NULL, NULL };
    struct scope *top_scope = NULL;
    enum problem_dialect dialect = PROBLEM_DIALECT_PROBLEM;
    struct route_table *t = NULL;
    yaml_node_t *root = f ? yaml_document_get_root_node(f->doc) : NULL;
    size_t n = 0;
    int r;

    if (root && root->type == YAML_MAPPING_NODE) {
        struct errs quiet = { .f = f, .err = (char[1]){ 0 }, .errlen = 1 };

        cfile_each_pair(&quiet, root, "the file", find_top, &top); /* apply() said what is wrong */
    }
    if (top.routes && top.routes->type == YAML_SEQUENCE_NODE)
        n = (size_t)(top.routes->data.sequence.items.top - top.routes->data.sequence.items.start);
    else if (top.routes && (top.routes->type == YAML_MAPPING_NODE || cfile_scalar(top.routes)))
        cfile_errs_add(&e, top.routes,
                       "routes: a list of routes (each one starting with '- '), not %s",
                       cfile_type_name(top.routes)); /* an empty "routes:" is no routes */
    if (n > ROUTE_MAX) {
        cfile_errs_add(&e, top.routes, "routes: %zu routes, at most %d", n, ROUTE_MAX);
        n = 0;
    }
    if (top.errors)
        parse_errors(&e, top.errors, &dialect); /* every route's default, and the default's */
    if (top.scope)
        parse_scope(&e, top.scope, NULL, &top_scope); /* {headers}: config_file_apply() */
    r = route_table_new(n, &t);
    if (r < 0) {
        scope_unref(top_scope);
        return r;
    }
    t->on_store_error = cfg->on_store_error;
    for (size_t i = 0; i <= n; i++) {
        struct route *rt = &t->routes[i];

        rt->enforce = true;
        rt->errors = dialect;
        if (config_route_copy(&rt->settings, &cfg->route) < 0)
            e.oom = true;
    }
    for (size_t i = 0; i < n && !e.oom; i++)
        route_at(&e, cfg, &top, top_scope, t, i);
    finish_table(&e, cfg, &top, t);
    route_table_default(t)->scope = top_scope; /* the reference made above */
    if (e.oom || e.n) {
        route_table_unref(t);
        return e.oom ? -ENOMEM : -EINVAL;
    }
    *ret = t;
    return 0;
}

/* ---- the whole configuration ---- */

int config_file_load(struct config *cfg, struct route_table **ret_routes, int argc,
                     char *const argv[], char *const envp[], char *err, size_t errlen)
{
    struct config_file *file = NULL;
    struct route_table *t = NULL;
    const char *path;
    int r;

    r = config_init(cfg, err, errlen);
    if (r < 0 || config_wants_action(cfg, argc, argv))
        return r;
    path = config_find_file(argc, argv, envp);
    if (path) {
        r = config_file_read(path, &file, err, errlen);
        if (r == 0)
            r = config_file_apply(file, cfg, err, errlen);
        if (r == -EINVAL && file && config_file_routes(file, cfg, &t, err, errlen) == 0)
            route_table_unref(t); /* every problem of the file at once: its routes' too */
        if (r < 0)
            goto out;
    }
    r = config_apply_args(cfg, argc, argv, envp, err, errlen);
    if (r == 0)
        r = config_check_options(cfg, err, errlen);
    if (r == 0)
        r = config_file_routes(file, cfg, &t, err, errlen);
    if (r == 0 && ret_routes)
        *ret_routes = t;
    else if (r == 0)
        route_table_unref(t);
out:
    config_file_free(file);
    return r;
}
