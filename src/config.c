/* SPDX-License-Identifier: MIT */
/* The options (doc/configuration.md): one table (config_table.c) drives the defaults, the
 * environment, the flags, the file's keys, --help, and every loop over a
 * configuration (free, copy, diff, reload); main thread, at start and on SIGHUP. */
#include "idemproxy/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/config_parse.h"
#include "idemproxy/store_registry.h"

#include "config_impl.h"

/* ---- fields ---- */

/* Where the field of <o> lies in <cfg>: in the process's part, or in its
 * route settings. */
static char *field_base(const struct opt *o, struct config *cfg)
{
    return o->traits & CONFIG_ROUTE ? (char *)&cfg->route : (char *)cfg;
}

static const char *cfield_base(const struct opt *o, const struct config *cfg)
{
    return o->traits & CONFIG_ROUTE ? (const char *)&cfg->route : (const char *)cfg;
}

/* The entries the loops over a configuration visit: each field once, and no
 * action (--help). */
static bool is_looped(const struct opt *o) { return !o->alias && o->kind != K_ACTION; }

/* Sets the field of <o>, in the struct at <base>, from <v>. <append> asks a
 * repeatable list to grow. */
static int opt_set(char *base, const struct opt *o, const char *v, bool append)
{
    void *field = base + o->off;
    size_t *count = (size_t *)(void *)(base + o->off2);

    switch (o->kind) {
    case K_ADDR:
        return config_parse_addr(v, field);
    case K_URL:
    case K_ENDPOINT:
        return config_parse_upstream(field, v);
    case K_RATIO:
        return config_parse_ratio(v, field);
    case K_REDIS:
        return config_parse_redis_url(field, v);
    case K_STORE:
        return config_parse_store_url(field, v);
    case K_STR:
        return config_parse_string(field, v);
    case K_HEADER:
    case K_HEADER_OPT:
        return config_parse_header(field, v, o->kind == K_HEADER_OPT);
    case K_METHODS:
        return config_parse_list(field, count, v, false, true);
    case K_HEADERS:
        return config_parse_list(field, count, v, append, false);
    case K_BOOL:
        return config_parse_bool(v, field);
    case K_SECONDS:
        return config_parse_seconds(v, field);
    case K_SECONDS0:
        return config_parse_seconds0(v, field);
    case K_BYTES:
        return config_parse_bytes(v, field);
    case K_STATUS:
        return config_parse_status_list(v, field);
    case K_CHOICE:
        return config_parse_choice(o->choices, v, field);
    case K_COUNT:
    case K_COUNT0:
        return config_parse_count(v, o->kind == K_COUNT0, field);
    case K_ACTION:
        *(bool *)field = true;
        return 0;
    case K_TOKEN_FILE:
    case K_PASSWORD_FILE:
        return config_parse_secret_file(field, (char **)(void *)(base + o->off2), v,
                                        o->kind == K_TOKEN_FILE);
    case K_FILE:
        return config_parse_file(field, v);
    case K_HOSTNAME:
        return config_parse_hostname(field, v);
    }
    return -EINVAL;
}

/* The size of a field of kind <k>, for the kinds held by value. */
static size_t value_size(enum kind k)
{
    switch (k) {
    case K_ADDR:
        return sizeof(struct config_addr);
    case K_BOOL:
    case K_ACTION:
        return sizeof(bool);
    case K_SECONDS:
    case K_SECONDS0:
        return sizeof(uint64_t);
    case K_BYTES:
        return sizeof(size_t);
    case K_STATUS:
        return 600 * sizeof(bool);
    case K_CHOICE:
        return sizeof(int);
    case K_COUNT:
    case K_COUNT0:
        return sizeof(unsigned);
    case K_RATIO:
        return sizeof(double);
    default:
        return 0; /* a string or a list: owned pointers */
    }
}

static bool is_list(enum kind k) { return k == K_METHODS || k == K_HEADERS; }

static bool is_secret_file(enum kind k) { return k == K_TOKEN_FILE || k == K_PASSWORD_FILE; }

static char **string_at(char *base, size_t off) { return (char **)(void *)(base + off); }

static char *const *cstring_at(const char *base, size_t off)
{
    return (char *const *)(const void *)(base + off);
}

static size_t *count_at(char *base, size_t off) { return (size_t *)(void *)(base + off); }

static size_t ccount_at(const char *base, size_t off)
{
    return *(const size_t *)(const void *)(base + off);
}

static void free_secret(char **slot)
{
    if (*slot)
        explicit_bzero(*slot, strlen(*slot));
    free(*slot);
    *slot = NULL;
}

/* Frees what the field of <o> owns in the struct at <base>. */
static void field_done(const struct opt *o, char *base)
{
    if (value_size(o->kind))
        return;
    if (is_list(o->kind)) {
        config_parse_list_clear(string_at(base, o->off), count_at(base, o->off2));
        return;
    }
    free(*string_at(base, o->off));
    *string_at(base, o->off) = NULL;
    if (is_secret_file(o->kind))
        free_secret(string_at(base, o->off2));
}

static bool same_string(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* True when the field of <o> holds the same value in the structs at <a> and <b>. */
static bool field_same(const struct opt *o, const char *a, const char *b)
{
    size_t size = value_size(o->kind), n;

    if (o->kind == K_ADDR)
        return strcmp(((const struct config_addr *)(const void *)(a + o->off))->text,
                      ((const struct config_addr *)(const void *)(b + o->off))->text) == 0;
    if (size)
        return memcmp(a + o->off, b + o->off, size) == 0;
    if (is_list(o->kind)) {
        n = ccount_at(a, o->off2);
        if (n != ccount_at(b, o->off2))
            return false;
        for (size_t i = 0; i < n; i++) {
            if (!same_string(cstring_at(a, o->off)[i], cstring_at(b, o->off)[i]))
                return false;
        }
        return true;
    }
    return same_string(*cstring_at(a, o->off), *cstring_at(b, o->off)) &&
           (!is_secret_file(o->kind) ||
            same_string(*cstring_at(a, o->off2), *cstring_at(b, o->off2)));
}

static void swap_bytes(char *a, char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char t = a[i];

        a[i] = b[i];
        b[i] = t;
    }
}

/* Exchanges the values of the field of <o> between the structs at <a> and <b>. */
static void field_swap(const struct opt *o, char *a, char *b)
{
    size_t size = value_size(o->kind);

    if (size) {
        swap_bytes(a + o->off, b + o->off, size);
    } else if (is_list(o->kind)) {
        swap_bytes(a + o->off, b + o->off, CONFIG_MAX_LIST * sizeof(char *));
        swap_bytes(a + o->off2, b + o->off2, sizeof(size_t));
    } else {
        swap_bytes(a + o->off, b + o->off, sizeof(char *));
        if (is_secret_file(o->kind))
            swap_bytes(a + o->off2, b + o->off2, sizeof(char *));
    }
}

/* Makes the field of <o> at <dst> (a byte copy of <src>'s) a deep copy. The
 * caller has set every pointer of <dst> to NULL first, so that a failure
 * leaves nothing <src> owns in it. */
static int field_copy(const struct opt *o, char *dst, const char *src)
{
    size_t n = is_list(o->kind) ? ccount_at(src, o->off2) : 1;

    if (value_size(o->kind) || is_secret_file(o->kind))
        return 0; /* values are copied; secrets are not (a route never holds one) */
    for (size_t i = 0; i < n; i++) {
        const char *from = cstring_at(src, o->off)[i];

        if (from && !(string_at(dst, o->off)[i] = strdup(from)))
            return -ENOMEM;
    }
    return 0;
}

/* ---- error lines ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A value as it may appear in the one error line: no control bytes, not too long. */
static void quote_value(const char *v, char *out, size_t outlen)
{
    size_t i = 0, max = outlen > 4 ? outlen - 4 : 0;

    for (; *v && i < max; v++)
        out[i++] = ((unsigned char)*v < 0x20 || (unsigned char)*v == 0x7f) ? '?' : *v;
    if (*v) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

/* "--ttl", "IDEMPROXY_TTL (--ttl)" or "IDEMPOTENCY_ENABLED": where a value came from. */
static void source_name(const struct opt *o, bool from_env, char *out, size_t outlen)
{
    if (!from_env)
        snprintf(out, outlen, "%s", o->flag);
    else if (o->flag)
        snprintf(out, outlen, "%s (%s)", o->env, o->flag);
    else
        snprintf(out, outlen, "%s", o->env);
}

static void choices_text(const char *const *choices, char *out, size_t outlen)
{
    size_t used = (size_t)snprintf(out, outlen, "use");

    for (size_t i = 0; choices[i] && used < outlen; i++) {
        const char *sep = i == 0 ? " " : choices[i + 1] ? ", " : " or ";

        used += (size_t)snprintf(out + used, outlen - used, "%s%s", sep, choices[i]);
    }
}

/* <v> with the user info of a URL (what lies between "://" and the last '@'
 * before the path) as "***", so that an error line never shows a password. */
static void mask_userinfo(const char *v, char *out, size_t outlen)
{
    const char *start = strstr(v, "://"), *at, *end;

    snprintf(out, outlen, "%s", v);
    if (!start)
        return;
    start += 3;
    end = start + strcspn(start, "/?#");
    at = NULL;
    for (const char *p = start; p < end; p++) {
        if (*p == '@')
            at = p;
    }
    if (at)
        snprintf(out, outlen, "%.*s***%s", (int)(start - v), v, at);
}

/* Explains why <v> was refused for <o> (<r> from opt_set()), the line
 * starting with <src>: the flag, the variable, or the file's key. */
/* A store URL whose scheme is none of a store's, when it is one written
 * wrong ("rediss//h", "postgres:/db") or one a typo away ("postgresq://"):
 * says which in <why>, and that one's form in <forms>. Returns whether it
 * did. */
static bool near_scheme(const char *v, char *why, size_t whylen, char *forms, size_t formslen)
{
    const char *names[16], *near = NULL;
    size_t n = store_registry_schemes(names, ARRAY_SIZE(names));
    size_t len = strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");

    for (size_t i = 0; i < n && !near; i++)
        if (strlen(names[i]) == len && strncasecmp(v, names[i], len) == 0)
            near = names[i];
    if (near && strncmp(v + len, "://", 3) == 0)
        return false; /* its own store said what is wrong */
    if (near)
        snprintf(why, whylen, "a %s URL begins %s:// (a colon, two slashes)", near, near);
    else if ((near = len ? config_nearest(v, len, names, n) : NULL))
        snprintf(why, whylen, "'%.*s' is no store's scheme: did you mean %s://?", (int)len, v,
                 near);
    if (near)
        store_registry_form(near, forms, formslen);
    return near != NULL;
}

static void value_err(const struct opt *o, const char *src, const char *v, int r, char *err,
                      size_t errlen)
{
    char val[80], expect[640], masked[512];

    if (o->kind == K_URL || o->kind == K_ENDPOINT) {
        mask_userinfo(v, masked, sizeof(masked));
        v = masked;
    }
    if (o->kind == K_REDIS || o->kind == K_STORE) {
        char why[200], forms[400];

        /* the parser says what is wrong, then what the forms are */
        config_store_url_why(v, o->kind == K_STORE, why, sizeof(why));
        if (o->kind == K_STORE && !near_scheme(v, why, sizeof(why), forms, sizeof(forms)))
            store_registry_forms(forms, sizeof(forms));
        store_registry_redact_url(v, masked, sizeof(masked));
        v = masked;
        snprintf(expect, sizeof(expect), "%s; %s", why,
                 o->kind == K_STORE ? forms : config_kind_info[o->kind].expect);
    }
    quote_value(v, val, sizeof(val));
    if (o->kind == K_CHOICE)
        choices_text(o->choices, expect, sizeof(expect));
    else if (o->kind != K_REDIS && o->kind != K_STORE)
        snprintf(expect, sizeof(expect), "%s", config_kind_info[o->kind].expect);
    if (r == -ENOMEM)
        set_err(err, errlen, "%s: out of memory", src);
    else if ((o->kind == K_TOKEN_FILE || o->kind == K_PASSWORD_FILE || o->kind == K_FILE) &&
             r != -EINVAL)
        set_err(err, errlen, "%s: cannot read '%s': %s", src, val, strerror(-r));
    else if (r == -E2BIG)
        set_err(err, errlen, "%s: too many entries (at most %d)", src, CONFIG_MAX_LIST);
    else
        set_err(err, errlen, "%s: '%s' is not %s (%s)", src, val, config_kind_info[o->kind].what,
                expect);
}

static int apply(struct config *cfg, const struct opt *o, bool from_env, const char *v, bool append,
                 char *err, size_t errlen)
{
    int r = opt_set(field_base(o, cfg), o, v, append);
    char src[128];

    if (r < 0) {
        source_name(o, from_env, src, sizeof(src));
        value_err(o, src, v, r, err, errlen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

static const struct opt *opt_find(const char *name, size_t n);

/* ---- names, and the nearest one to a misspelt name ---- */

enum name_form { NAME_FLAG, NAME_KEY, NAME_ENV };

/* The table's name nearest <s> (<len> bytes) in <form>: a flag, a file's
 * key (a flag without its dashes) or a variable; NULL when none is near.
 * The part every name shares ("--", "IDEMPROXY_") is left out of the
 * comparison, so that it does not make every short name look near. */
static const char *nearest_name(const char *s, size_t len, enum name_form form)
{
    const char *names[CONFIG_NOPTS], *near;
    size_t skip = form == NAME_FLAG ? 2 : form == NAME_ENV ? 10 : 0;

    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        names[i] = NULL;
        if (form == NAME_ENV && o->env && strncmp(o->env, "IDEMPROXY_", 10) == 0)
            names[i] = o->env + skip;
        else if (form != NAME_ENV && o->flag && !o->env_only &&
                 (form == NAME_FLAG || o->kind != K_ACTION))
            names[i] = o->flag + 2;
    }
    if (len < skip)
        return NULL;
    near = config_nearest(s + skip, len - skip, names, ARRAY_SIZE(names));
    return near ? near - skip : NULL; /* back to the whole name */
}

size_t config_each_unknown_env(char *const envp[], config_env_fn *fn, void *ctx)
{
    size_t n = 0;

    for (size_t i = 0; envp && envp[i]; i++) {
        const char *e = envp[i], *eq = strchr(e, '=');
        size_t len = eq ? (size_t)(eq - e) : strlen(e);
        bool known = false;
        char name[128];

        if (strncmp(e, "IDEMPROXY_", 10) != 0 || len >= sizeof(name))
            continue;
        for (size_t j = 0; j < CONFIG_NOPTS && !known; j++)
            known = config_opts[j].env && strlen(config_opts[j].env) == len &&
                    memcmp(config_opts[j].env, e, len) == 0;
        if (known)
            continue;
        memcpy(name, e, len);
        name[len] = '\0';
        fn(ctx, name, nearest_name(name, len, NAME_ENV));
        n++;
    }
    return n;
}

/* ---- the configuration file's view of the table ---- */

/* The entry a file's key <name> sets: a flag's, without its dashes; not the
 * actions, and not --config itself. */
static const struct opt *file_opt(const char *name)
{
    char flag[64];
    const struct opt *o;

    if (snprintf(flag, sizeof(flag), "--%s", name) >= (int)sizeof(flag))
        return NULL;
    o = opt_find(flag, strlen(flag));
    if (!o || o->kind == K_ACTION || strcmp(o->flag, "--config") == 0)
        return NULL;
    return o;
}

bool config_is_route_option(const char *name)
{
    const struct opt *o = file_opt(name);

    return o && (o->traits & CONFIG_ROUTE);
}

size_t config_route_option_list(const char **out, size_t max)
{
    size_t n = 0;

    for (size_t i = 0; i < CONFIG_NOPTS && n < max; i++) {
        if ((config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]))
            out[n++] = config_opts[i].flag + 2;
    }
    return n;
}

void config_route_option_names(char *out, size_t outlen)
{
    size_t used = 0;

    out[0] = '\0';
    for (size_t i = 0; i < CONFIG_NOPTS && used < outlen; i++) {
        if ((config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]))
            used += (size_t)snprintf(out + used, outlen - used, "%s%s", used ? ", " : "",
                                     config_opts[i].flag + 2);
    }
}

/* Sets <o>'s field in the struct at <base> from the file's value or list
 * under the key <name>; a problem's line starts with <name>. */
static int set_named(char *base, const struct opt *o, const char *name, const char *const *items,
                     size_t n, bool list, char *why, size_t whylen)
{
    char joined[4096];
    const char *v = items[0];
    size_t used = 0;
    int r;

    if (!list && n != 1) {
        set_err(why, whylen, "%s: needs a value", name);
        return -EINVAL;
    }
    if (list && o->kind != K_METHODS && o->kind != K_HEADERS && o->kind != K_STATUS) {
        set_err(why, whylen, "%s: takes one value, not a list", name);
        return -EINVAL;
    }
    /* A list is given to the comma-separated parser: an item may not hold a
     * comma of its own (no method, header name or status does). */
    joined[0] = '\0';
    for (size_t i = 0; list && i < n; i++) {
        size_t len = strlen(items[i]);

        if (strchr(items[i], ',') || len == 0 || used + len + 2 > sizeof(joined)) {
            char val[80];

            quote_value(items[i], val, sizeof(val));
            set_err(why, whylen, "%s: '%s' is not %s (%s)", name, val,
                    config_kind_info[o->kind].what, "one item per list entry");
            return -EINVAL;
        }
        if (i > 0)
            joined[used++] = ',';
        memcpy(joined + used, items[i], len + 1);
        used += len;
    }
    if (list)
        v = joined;
    r = opt_set(base, o, v, false);
    if (r < 0) {
        value_err(o, name, v, r, why, whylen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

int config_set_option(struct config *cfg, const char *name, const char *const *items, size_t n,
                      bool is_list, char *why, size_t whylen)
{
    const struct opt *o = file_opt(name);

    if (!o) {
        const char *near = nearest_name(name, strlen(name), NAME_KEY);

        if (near)
            set_err(why, whylen, "unknown key '%s' (did you mean %s?)", name, near);
        else
            set_err(why, whylen, "unknown key '%s'", name);
        return -ENOENT;
    }
    return set_named(field_base(o, cfg), o, name, items, n, is_list, why, whylen);
}

int config_set_route_option(struct route_settings *rs, const char *name, const char *const *items,
                            size_t n, bool is_list, char *why, size_t whylen)
{
    const struct opt *o = file_opt(name);

    if (!o || !(o->traits & CONFIG_ROUTE)) {
        set_err(why, whylen, "'%s' is not an option a route may set", name);
        return -ENOENT;
    }
    return set_named((char *)rs, o, name, items, n, is_list, why, whylen);
}

/* ---- loading ---- */

static const char *env_lookup(char *const envp[], const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; envp && envp[i]; i++) {
        if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
            return envp[i] + n + 1;
    }
    return NULL;
}

/* The table entry of flag <name> (the first <n> bytes), NULL if none. */
static const struct opt *opt_find(const char *name, size_t n)
{
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        if (o->flag && !o->env_only && strlen(o->flag) == n && memcmp(o->flag, name, n) == 0)
            return o;
    }
    return NULL;
}

/* --help and --version win over everything else, bad values included, so a
 * broken environment can still print the help. Values are skipped, so that
 * "--key-prefix -h" is not mistaken for it. */
bool config_wants_action(struct config *cfg, int argc, char *const argv[])
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct opt *o;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            cfg->show_help = true;
        else if (strcmp(a, "--version") == 0)
            cfg->show_version = true;
        else if (strncmp(a, "--", 2) == 0 && !strchr(a, '=') && (o = opt_find(a, strlen(a))) &&
                 o->arg && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            i++; /* the same rule as load_flags() */
    }
    return cfg->show_help || cfg->show_version;
}

static int load_flags(struct config *cfg, int argc, char *const argv[], char *err, size_t errlen)
{
    bool seen[CONFIG_NOPTS] = { false };

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *v;
        const struct opt *o;
        size_t n;
        int r;

        if (a[0] != '-' || strcmp(a, "--") == 0) {
            char val[80];

            quote_value(a, val, sizeof(val));
            set_err(err, errlen, "unexpected argument '%s' (options start with --, see --help)",
                    val);
            return -EINVAL;
        }
        eq = strchr(a, '=');
        n = eq ? (size_t)(eq - a) : strlen(a);
        o = strncmp(a, "--", 2) == 0 ? opt_find(a, n) : NULL;
        if (!o) {
            char val[80];

            const char *near = nearest_name(a, n, NAME_FLAG);

            quote_value(a, val, sizeof(val));
            if (eq)
                val[n < sizeof(val) - 1 ? n : sizeof(val) - 1] = '\0';
            set_err(err, errlen, "unknown option '%s' (%s%s%ssee --help)", val,
                    near ? "did you mean " : "", near ? near : "", near ? "? " : "");
            return -EINVAL;
        }
        if (eq) {
            v = eq + 1;
            if (o->kind == K_ACTION) {
                set_err(err, errlen, "%s: takes no value", o->flag);
                return -EINVAL;
            }
        } else if (!o->arg) {
            v = "true"; /* --require-key, --help */
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            v = argv[++i];
        } else {
            char expect[400];

            if (o->kind == K_CHOICE)
                choices_text(o->choices, expect, sizeof(expect));
            else if (o->kind == K_STORE)
                store_registry_forms(expect, sizeof(expect));
            else
                snprintf(expect, sizeof(expect), "%s", config_kind_info[o->kind].expect);
            set_err(err, errlen, "%s: missing value (%s %s: %s)", o->flag, o->flag, o->arg, expect);
            return -EINVAL;
        }
        /* The first flag of a list replaces the environment's list; repeats append. */
        r = apply(cfg, o, false, v, seen[o - config_opts], err, errlen);
        if (r < 0)
            return r;
        seen[o - config_opts] = true;
    }
    return 0;
}

bool config_is_cacheable(const struct route_settings *rs, unsigned status)
{
    return status < ARRAY_SIZE(rs->no_cache) && !rs->no_cache[status];
}

bool config_is_enforced(const struct route_settings *rs, struct span method)
{
    for (size_t i = 0; i < rs->nmethods; i++) {
        if (strlen(rs->methods[i]) == method.len &&
            memcmp(rs->methods[i], method.base, method.len) == 0)
            return true;
    }
    return false;
}

/* ---- loops over the table ---- */

int config_route_copy(struct route_settings *dst, const struct route_settings *src)
{
    int r = 0;

    memcpy(dst, src, sizeof(*dst));
    /* Every pointer of <dst> is made its own (or NULL) before anything can
     * fail, so that config_route_done(<dst>) never frees what <src> owns. */
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        if ((config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]) &&
            !value_size(config_opts[i].kind))
            memset((char *)dst + config_opts[i].off, 0,
                   (is_list(config_opts[i].kind) ? CONFIG_MAX_LIST : 1) * sizeof(char *));
    }
    for (size_t i = 0; i < CONFIG_NOPTS && r == 0; i++) {
        if ((config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]))
            r = field_copy(&config_opts[i], (char *)dst, (const char *)src);
    }
    return r;
}

void config_route_done(struct route_settings *rs)
{
    if (!rs)
        return;
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        if ((config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]))
            field_done(&config_opts[i], (char *)rs);
    }
}

void config_done(struct config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        if (!(config_opts[i].traits & CONFIG_ROUTE) && is_looped(&config_opts[i]))
            field_done(&config_opts[i], (char *)cfg);
    }
    config_route_done(&cfg->route);
}

/* The name of <o> in a diff: the file's key, or the variable of an option
 * that has no flag. */
static const char *diff_name(const struct opt *o) { return o->flag ? o->flag + 2 : o->env; }

size_t config_diff(const struct config *a, const struct config *b, config_diff_fn *fn, void *ctx)
{
    size_t n = 0;

    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        if (is_looped(o) && !field_same(o, cfield_base(o, a), cfield_base(o, b))) {
            n++;
            fn(ctx, diff_name(o), o->traits);
        }
    }
    return n;
}

void config_swap_reloadable(struct config *cfg, struct config *next)
{
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        if (is_looped(o) && !(o->traits & CONFIG_RESTART))
            field_swap(o, field_base(o, cfg), field_base(o, next));
    }
}

/* ---- loading ---- */

const char *config_find_file(int argc, char *const argv[], char *const envp[])
{
    const char *path = env_lookup(envp, "IDEMPROXY_CONFIG");

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t n = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = strncmp(a, "--", 2) == 0 ? opt_find(a, n) : NULL;
        bool is_config = o && strcmp(o->flag, "--config") == 0;

        if (is_config && eq) {
            path = eq + 1;
            continue;
        }
        if (!o || !o->arg || eq || i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
            continue;
        i++; /* the value, as load_flags() takes it */
        if (is_config)
            path = argv[i];
    }
    return path;
}

int config_init(struct config *cfg, char *err, size_t errlen)
{
    set_err(err, errlen, "%s", "");
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        if (config_opts[i].def) {
            int r = apply(cfg, &config_opts[i], false, config_opts[i].def, false, err, errlen);

            if (r < 0)
                return r;
        }
    }
    return 0;
}

int config_apply_args(struct config *cfg, int argc, char *const argv[], char *const envp[],
                      char *err, size_t errlen)
{
    int r;

    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const char *v = config_opts[i].env ? env_lookup(envp, config_opts[i].env) : NULL;

        if (v && (r = apply(cfg, &config_opts[i], true, v, false, err, errlen)) < 0)
            return r;
    }
    r = load_flags(cfg, argc, argv, err, errlen);
    return r;
}

void config_print_help(FILE *f)
{
    fprintf(f, "Usage: idemproxy --upstream URL [options]\n"
               "       idemproxy --config FILE [options] [--check-config]\n\n"
               "An HTTP reverse proxy that enforces the Idempotency-Key header.\n"
               "Each option is also read from the environment variable shown, and from the "
               "--config\nfile (spelled without the dashes); a flag wins over the environment, "
               "which wins over\nthe file, which wins over the default. "
               "Lists in the environment are comma-separated.\n"
               "S is seconds (fractions allowed, e.g. 0.5); BYTES takes a K, M or G suffix.\n\n"
               "Options:\n");
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        if (o->env_only)
            continue;
        fprintf(f, "  %s%s%s\n      %s\n", o->flag, o->arg ? " " : "", o->arg ? o->arg : "",
                o->help);
        if (o->env || o->def) {
            fprintf(f, "      [");
            if (o->env)
                fprintf(f, "env %s%s", o->env, o->def ? ", " : "");
            if (o->def)
                fprintf(f, "default %s", o->def);
            fprintf(f, "]\n");
        }
    }
    fprintf(f, "\nEnvironment only:\n");
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const struct opt *o = &config_opts[i];

        if (!o->env_only)
            continue;
        fprintf(f, "  %s=%s\n      %s\n", o->env, o->arg, o->help);
        if (o->def)
            fprintf(f, "      [default %s]\n", o->def);
    }
}
