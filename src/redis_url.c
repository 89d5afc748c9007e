/* SPDX-License-Identifier: MIT */
/* Redis URLs (doc/stores.md, Pointing idemproxy at Redis). */
#include "idemproxy/redis_url.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/common.h"
#include "idemproxy/http.h"

#define PORT_REDIS 6379
#define PORT_SENTINEL 26379
#define DB_MAX 2147483647ul

static int fail(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;

    if (why && why_len) {
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* Percent-decodes <s> into a new string; an empty one is NULL. */
static int decode(struct span s, char **ret)
{
    size_t n;
    char *d;

    *ret = NULL;
    if (s.len == 0)
        return 0;
    d = malloc(s.len + 1);
    if (!d)
        return -ENOMEM;
    if (http_percent_decode(s, d, &n) < 0 || memchr(d, '\0', n)) {
        free(d);
        return -EINVAL; /* a bad escape, or %00, which a Redis command could not carry */
    }
    d[n] = '\0';
    *ret = d;
    return 0;
}

/* Parses all of <s> as a decimal number from 0 to <max>. */
static bool parse_number(struct span s, unsigned long max, unsigned long *ret)
{
    unsigned long v = 0;

    if (s.len == 0 || s.len > 10)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        if (s.base[i] < '0' || s.base[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s.base[i] - '0');
    }
    if (v > max)
        return false;
    *ret = v;
    return true;
}

static bool is_name_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_';
}

/* One HOST[:PORT] of the host list. */
static int parse_host(struct span s, unsigned default_port, struct redis_addr *a, char *why,
                      size_t why_len)
{
    struct span host = s, port = { NULL, 0 };
    unsigned long v;

    if (s.len && s.base[0] == '[') {
        const char *close = memchr(s.base, ']', s.len);

        if (!close)
            return fail(why, why_len, "an IPv6 address is missing its ']'");
        host = (struct span){ s.base + 1, (size_t)(close - s.base - 1) };
        if (close + 1 < s.base + s.len) {
            if (close[1] != ':')
                return fail(why, why_len, "only ':PORT' may follow ']'");
            port = (struct span){ close + 2, (size_t)(s.base + s.len - close - 2) };
            if (port.len == 0)
                return fail(why, why_len, "a ':' with no port after it");
        }
        for (size_t i = 0; i < host.len; i++) {
            if (!(host.base[i] == ':' || host.base[i] == '.' ||
                  isxdigit((unsigned char)host.base[i])))
                return fail(why, why_len, "'%.*s' is not an IPv6 address", (int)host.len,
                            host.base);
        }
        if (host.len == 0)
            return fail(why, why_len, "an empty IPv6 address");
    } else {
        const char *colon = memchr(s.base, ':', s.len);

        if (colon) {
            host.len = (size_t)(colon - s.base);
            port = (struct span){ colon + 1, (size_t)(s.base + s.len - colon - 1) };
            if (port.len == 0)
                return fail(why, why_len, "a ':' with no port after it");
        }
        if (host.len == 0)
            return fail(why, why_len, "a host is missing");
        for (size_t i = 0; i < host.len; i++) {
            if (!is_name_char(host.base[i]))
                return fail(why, why_len, "the host '%.*s' holds a character a host name cannot",
                            (int)(host.len > 64 ? 64 : host.len), host.base);
        }
    }
    if (host.len >= sizeof(a->host))
        return fail(why, why_len, "a host name is longer than %zu bytes", sizeof(a->host) - 1);
    memcpy(a->host, host.base, host.len);
    a->host[host.len] = '\0';
    a->port = default_port;
    if (port.base) {
        if (!parse_number(port, 65535, &v) || v == 0)
            return fail(why, why_len, "the port '%.*s' is not a number from 1 to 65535",
                        (int)(port.len > 16 ? 16 : port.len), port.base);
        a->port = (unsigned)v;
    }
    return 0;
}

/* The query of a sentinel URL: master, sentinel_user, sentinel_password. */
static int parse_query(struct span q, struct redis_url *u, char *why, size_t why_len)
{
    const char *p = q.base, *end = q.base + q.len;

    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p)), *eq;
        struct span name, value;
        char **slot;
        int err;

        if (!amp)
            amp = end;
        eq = memchr(p, '=', (size_t)(amp - p));
        if (!eq)
            return fail(why, why_len, "the query parameter '%.*s' has no value",
                        (int)(amp - p > 32 ? 32 : amp - p), p);
        name = (struct span){ p, (size_t)(eq - p) };
        value = (struct span){ eq + 1, (size_t)(amp - eq - 1) };
        if (span_eq(name, SPAN_LIT("master")))
            slot = &u->master;
        else if (span_eq(name, SPAN_LIT("sentinel_user")))
            slot = &u->sentinel_user;
        else if (span_eq(name, SPAN_LIT("sentinel_password")))
            slot = &u->sentinel_password;
        else
            return fail(why, why_len,
                        "unknown query parameter '%.*s' (known: master, sentinel_user, "
                        "sentinel_password)",
                        (int)(name.len > 32 ? 32 : name.len), name.base);
        if (*slot)
            return fail(why, why_len, "the query parameter '%.*s' is given twice", (int)name.len,
                        name.base);
        err = decode(value, slot);
        if (err == -EINVAL)
            return fail(why, why_len, "the value of '%.*s' has a bad %%-escape or a %%00",
                        (int)name.len, name.base);
        if (err < 0)
            return err;
        if (!*slot)
            return fail(why, why_len, "the query parameter '%.*s' is empty", (int)name.len,
                        name.base);
        p = amp < end ? amp + 1 : end;
    }
    return 0;
}

#define SENTINEL_PASSWORD_KEY "sentinel_password="

/* The '@' that ends the user info of the URL whose authority starts at
 * <start>, or NULL. Without a query (redis://, rediss://) it is the last '@',
 * so a password may hold '@', '/', '?' or '#' unencoded; a Sentinel URL has
 * a query, and its user info ends at the last '@' before the first '?' (a
 * '?' in its password must be encoded, an '@' in a query value need not). */
static const char *userinfo_end(const char *start, bool sentinel)
{
    const char *end = sentinel ? start + strcspn(start, "?") : start + strlen(start);
    const char *at = NULL;

    for (const char *c = start; c < end; c++) {
        if (*c == '@')
            at = c;
    }
    return at;
}

/* True for redis-sentinel:// and rediss-sentinel://. */
static bool is_sentinel_scheme(const char *s)
{
    return strncasecmp(s, "redis-sentinel://", 17) == 0 ||
           strncasecmp(s, "rediss-sentinel://", 18) == 0;
}

/* USER:PASSWORD, :PASSWORD (the password alone) or USER (an ACL user, its
 * password from elsewhere), %-decoded into <u>. */
static int parse_userinfo(struct span ui, struct redis_url *u, char *why, size_t why_len)
{
    const char *colon = memchr(ui.base, ':', ui.len);
    int err;

    if (colon) {
        err = decode((struct span){ ui.base, (size_t)(colon - ui.base) }, &u->user);
        if (err == 0)
            err = decode((struct span){ colon + 1, ui.len - (size_t)(colon - ui.base) - 1 },
                         &u->password);
    } else if (ui.len) {
        err = decode(ui, &u->user);
    } else {
        err = 0; /* "@" alone: nothing */
    }
    if (err == -EINVAL)
        return fail(why, why_len, "the user or password has a bad %%-escape or a %%00");
    return err;
}

/* The comma-separated host list <list> into u->hosts. */
static int parse_hosts(struct span list, bool sentinel, struct redis_url *u, char *why,
                       size_t why_len)
{
    const char *end = list.base + list.len;
    int err;

    for (const char *h = list.base; h < end;) {
        const char *comma = memchr(h, ',', (size_t)(end - h));

        if (!comma)
            comma = end;
        if (u->nhosts == REDIS_URL_MAX_HOSTS)
            return fail(why, why_len, "more than %d hosts", REDIS_URL_MAX_HOSTS);
        err = parse_host((struct span){ h, (size_t)(comma - h) },
                         sentinel ? PORT_SENTINEL : PORT_REDIS, &u->hosts[u->nhosts], why, why_len);
        if (err < 0)
            return err;
        u->nhosts++;
        h = comma < end ? comma + 1 : end;
        if (comma < end && h == end)
            return fail(why, why_len, "a host is missing after the last ','");
    }
    if (u->nhosts == 0)
        return fail(why, why_len, "a host is missing");
    return 0;
}

static int parse(const char *s, struct redis_url *u, char *why, size_t why_len)
{
    static const struct {
        const char *scheme;
        bool tls, sentinel;
    } schemes[] = {
        { "redis://", false, false },
        { "rediss://", true, false },
        { "redis-sentinel://", false, true },
        { "rediss-sentinel://", true, true },
    };
    const char *p = NULL, *at = NULL, *q, *hosts, *hosts_end, *path;
    bool sentinel = false;
    int err;

    for (size_t i = 0; i < ARRAY_SIZE(schemes) && !p; i++) {
        size_t n = strlen(schemes[i].scheme);

        if (strncasecmp(s, schemes[i].scheme, n) == 0) {
            p = s + n;
            u->tls = schemes[i].tls;
            sentinel = schemes[i].sentinel;
        }
    }
    if (!p)
        return fail(why, why_len,
                    "the scheme must be redis://, rediss://, redis-sentinel:// or "
                    "rediss-sentinel://");
    for (const char *c = p; *c; c++) {
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c == 0x7f)
            return fail(why, why_len, "a space or control character");
    }
    at = userinfo_end(p, sentinel);
    hosts = at ? at + 1 : p;
    hosts_end = hosts + strcspn(hosts, "/?#");
    path = hosts_end;
    if (at && (err = parse_userinfo((struct span){ p, (size_t)(at - p) }, u, why, why_len)) < 0)
        return err;
    err =
        parse_hosts((struct span){ hosts, (size_t)(hosts_end - hosts) }, sentinel, u, why, why_len);
    if (err < 0)
        return err;
    /* /DB, then the query */
    q = path + strcspn(path, "?#");
    if (*path == '/' && q > path + 1) {
        unsigned long v;

        if (!parse_number((struct span){ path + 1, (size_t)(q - path - 1) }, DB_MAX, &v))
            return fail(why, why_len, "the path must be /DB, a database number");
        u->db = (unsigned)v;
    } else if (*path == '/' && q != path + 1) {
        return fail(why, why_len, "the path must be /DB, a database number");
    }
    if (*q == '#' || strchr(q, '#'))
        return fail(why, why_len, "a fragment ('#') has no meaning here");
    if (*q == '?') {
        if (!sentinel)
            return fail(why, why_len,
                        "a query has no meaning for redis:// or rediss:// (a Sentinel URL "
                        "is redis-sentinel://…?master=NAME)");
        err = parse_query((struct span){ q + 1, strlen(q + 1) }, u, why, why_len);
        if (err < 0)
            return err;
    }
    if (sentinel) {
        u->kind = REDIS_URL_SENTINEL;
        if (!u->master)
            return fail(why, why_len, "a Sentinel URL needs ?master=NAME");
    } else {
        u->kind = u->nhosts > 1 ? REDIS_URL_SEEDS : REDIS_URL_SERVER;
    }
    return 0;
}

int redis_url_parse(const char *s, struct redis_url *ret, char *why, size_t why_len)
{
    struct redis_url u = { .kind = REDIS_URL_SERVER };
    int err;

    if (why && why_len)
        why[0] = '\0';
    if (!s)
        return fail(why, why_len, "no URL");
    err = parse(s, &u, why, why_len);
    if (err < 0) {
        redis_url_done(&u);
        return err;
    }
    *ret = u;
    return 0;
}

static void free_secret(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

void redis_url_done(struct redis_url *u)
{
    if (!u)
        return;
    free(u->user);
    free_secret(u->password);
    free(u->master);
    free(u->sentinel_user);
    free_secret(u->sentinel_password);
    *u = (struct redis_url){ .kind = REDIS_URL_SERVER };
}

/* Appends [<p>, <p> + <n>) to <out> (<used> of <len> bytes taken), truncating. */
static void put(char *out, size_t len, size_t *used, const char *p, size_t n)
{
    if (*used + n >= len)
        n = len - 1 - *used;
    memcpy(out + *used, p, n);
    *used += n;
    out[*used] = '\0';
}

void redis_url_redact(const char *s, char *out, size_t len)
{
    const size_t klen = sizeof(SENTINEL_PASSWORD_KEY) - 1;
    const char *start = strstr(s, "://"), *end = s + strlen(s), *at = NULL, *secret = NULL,
               *secret_end = NULL, *colon, *query;
    size_t used = 0;

    if (!len)
        return;
    out[0] = '\0';
    if (!start) {
        put(out, len, &used, s, (size_t)(end - s));
        return;
    }
    start += 3;
    at = userinfo_end(start, is_sentinel_scheme(s));
    query = strchr(at ? at : start, '?');
    if (at) {
        colon = memchr(start, ':', (size_t)(at - start));
        secret = colon ? colon + 1 : NULL; /* USER:PASSWORD@; USER@ holds no secret */
        secret_end = at;
    }
    for (const char *c = s; c < end;) {
        if (c == secret) {
            put(out, len, &used, "***", 3);
            c = secret_end;
            secret = NULL; /* once: an empty password would not move <c> on */
        } else if (query && c > query && strncmp(c, SENTINEL_PASSWORD_KEY, klen) == 0 &&
                   (c - 1 == query || c[-1] == '&')) {
            put(out, len, &used, c, klen);
            put(out, len, &used, "***", 3);
            c += klen + strcspn(c + klen, "&");
        } else {
            put(out, len, &used, c, 1);
            c++;
        }
    }
}

void redis_addr_format(const struct redis_addr *a, char *out, size_t len)
{
    if (strchr(a->host, ':'))
        snprintf(out, len, "[%s]:%u", a->host, a->port);
    else
        snprintf(out, len, "%s:%u", a->host, a->port);
}
