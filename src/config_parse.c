/* SPDX-License-Identifier: MIT */
/* The values of the options of doc/configuration.md (Options), each parsed as its kind: sizes,
 * seconds, booleans, addresses, status lists, URLs, header names, lists,
 * and the secret files. Pure, but for the resolver (an address's host) and
 * the files read (a secret, a readable path). */
#include "idemproxy/config_parse.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "idemproxy/http.h"
#include "idemproxy/pg_url.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/resolve.h"
#include "idemproxy/store_registry.h"
#include "idemproxy/upstream.h"

#define SECONDS_MAX 1000000000ull /* about 31 years: anything longer is a typo */
#define COUNT_MAX 1000000u

int config_parse_bytes(const char *s, size_t *ret)
{
    size_t v = 0, mul = 1;
    const char *p = s;

    if (!s || *s < '0' || *s > '9')
        return -EINVAL; /* no sign, no space, not empty */
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (SIZE_MAX - (size_t)(*p - '0')) / 10)
            return -EINVAL;
        v = v * 10 + (size_t)(*p - '0');
    }
    switch (*p) {
    case '\0':
        break;
    case 'K':
    case 'k':
        mul = (size_t)1 << 10;
        break;
    case 'M':
    case 'm':
        mul = (size_t)1 << 20;
        break;
    case 'G':
    case 'g':
        mul = (size_t)1 << 30;
        break;
    default:
        return -EINVAL;
    }
    if (*p && p[1] != '\0')
        return -EINVAL;
    if (v > SIZE_MAX / mul)
        return -EINVAL;
    *ret = v * mul;
    return 0;
}

/* Decimal only: strtod() would also take "inf", "nan", "0x1p3" and "1e3";
 * then one unit, s (the default), m, h or d: "7d", "1.5h". */
static int parse_seconds(const char *s, bool allow_zero, uint64_t *ret)
{
    uint64_t whole = 0, frac_ms = 0, ms, unit = 1;
    unsigned frac_digits = 0;
    bool digits = false, nonzero = false;
    const char *p = s;

    if (!s)
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        whole = whole * 10 + (uint64_t)(*p - '0');
        if (whole > SECONDS_MAX)
            return -EINVAL;
        digits = true;
        nonzero |= *p != '0';
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++) {
            /* Keep four digits: three for milliseconds, one to round. */
            if (frac_digits < 4) {
                frac_ms = frac_ms * 10 + (uint64_t)(*p - '0');
                frac_digits++;
            }
            digits = true;
            nonzero |= *p != '0';
        }
    }
    if (!digits || (*p != '\0' && p[1] != '\0'))
        return -EINVAL;
    switch (*p) { /* a unit: s, m, h or d (doc/configuration.md, Options: durations) */
    case '\0':
    case 's':
        break;
    case 'm':
        unit = 60;
        break;
    case 'h':
        unit = 3600;
        break;
    case 'd':
        unit = 86400;
        break;
    default:
        return -EINVAL;
    }
    if (whole > SECONDS_MAX / unit)
        return -EINVAL;
    for (; frac_digits < 4; frac_digits++)
        frac_ms *= 10;
    ms = ((whole * 10000 + frac_ms) * unit + 5) / 10; /* from tenths of milliseconds */
    if (ms == 0 && nonzero)
        ms = 1; /* a positive value never becomes zero */
    if (ms == 0 && !allow_zero)
        return -EINVAL;
    *ret = ms;
    return 0;
}

int config_parse_seconds(const char *s, uint64_t *ret) { return parse_seconds(s, false, ret); }

int config_parse_seconds0(const char *s, uint64_t *ret) { return parse_seconds(s, true, ret); }

int config_parse_bool(const char *s, bool *ret)
{
    static const char *const yes[] = { "true", "1", "yes", "on" };
    static const char *const no[] = { "false", "0", "no", "off" };

    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

int config_parse_addr(const char *s, struct config_addr *ret)
{
    struct resolve_addr a;
    int family = 0;
    char host[sizeof(ret->text)];
    const char *colon, *port;
    size_t hostlen, len;
    unsigned long portnum = 0;
    int r;

    if (!s)
        return -EINVAL;
    len = strlen(s);
    if (len == 0 || len >= sizeof(ret->text))
        return -EINVAL;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');

        if (!close || close[1] != ':')
            return -EINVAL;
        hostlen = (size_t)(close - s - 1);
        memcpy(host, s + 1, hostlen);
        colon = close + 1;
        family = RESOLVE_IPV6;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return -EINVAL; /* an IPv6 address needs brackets */
        hostlen = (size_t)(colon - s);
        memcpy(host, s, hostlen);
    }
    host[hostlen] = '\0';
    if (hostlen == 0)
        return -EINVAL;
    port = colon + 1;
    if (*port == '\0' || strlen(port) > 5)
        return -EINVAL;
    for (const char *p = port; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        portnum = portnum * 10 + (unsigned long)(*p - '0');
    }
    if (portnum < 1 || portnum > 65535)
        return -EINVAL;

    /* Numeric first: an address literal never waits for a resolver. */
    r = (int)resolve_host(host, port, family | RESOLVE_NUMERIC, &a, 1, NULL);
    if (r == 0 && s[0] != '[')
        r = (int)resolve_host(host, port, family, &a, 1, NULL);
    if (r == 0 || a.len > sizeof(ret->sa))
        return -EINVAL;
    memset(ret, 0, sizeof(*ret));
    memcpy(ret->text, s, len + 1);
    memcpy(&ret->sa, &a.sa, a.len);
    ret->sa_len = a.len;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t'; }

/* Trims blanks around s[0..n). */
static struct span trim(const char *s, size_t n)
{
    while (n > 0 && is_space(*s)) {
        s++;
        n--;
    }
    while (n > 0 && is_space(s[n - 1]))
        n--;
    return (struct span){ .base = s, .len = n };
}

int config_parse_status_list(const char *s, bool ret[600])
{
    bool set[600] = { false };
    const char *p = s;

    if (!s)
        return -EINVAL;
    if (trim(s, strlen(s)).len == 0)
        goto out; /* "": cache every status */
    for (;;) {
        const char *end = strchr(p, ',');
        struct span e = trim(p, end ? (size_t)(end - p) : strlen(p));

        if (e.len != 3 || e.base[0] < '1' || e.base[0] > '5')
            return -EINVAL;
        if ((e.base[1] == 'x' || e.base[1] == 'X') && (e.base[2] == 'x' || e.base[2] == 'X')) {
            int base = (e.base[0] - '0') * 100;

            for (int i = base; i < base + 100; i++)
                set[i] = true;
        } else if (e.base[1] >= '0' && e.base[1] <= '9' && e.base[2] >= '0' && e.base[2] <= '9') {
            set[(e.base[0] - '0') * 100 + (e.base[1] - '0') * 10 + (e.base[2] - '0')] = true;
        } else {
            return -EINVAL;
        }
        if (!end)
            break;
        p = end + 1;
    }
out:
    memcpy(ret, set, sizeof(set));
    return 0;
}

int config_parse_ratio(const char *s, double *ret)
{
    char *end;
    double v;

    if (!s || !*s || *s == ' ')
        return -EINVAL;
    errno = 0;
    v = strtod(s, &end);
    if (*end || errno || !(v >= 0.0 && v <= 1.0))
        return -EINVAL;
    *ret = v;
    return 0;
}

int config_parse_count(const char *s, bool zero_ok, unsigned *ret)
{
    unsigned long v = 0;

    if (!s || !*s)
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > COUNT_MAX)
            return -EINVAL;
    }
    if (v == 0 && !zero_ok)
        return -EINVAL;
    *ret = (unsigned)v;
    return 0;
}

int config_parse_choice(const char *const *choices, const char *s, int *ret)
{
    for (int i = 0; choices[i]; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *ret = i;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- values kept as text: each replaces *<slot>, and leaves it alone on failure ---- */

static int replace_string(char **slot, const char *v, size_t n)
{
    char *copy = strndup(v, n);

    if (!copy)
        return -ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

int config_parse_string(char **slot, const char *v) { return replace_string(slot, v, strlen(v)); }

int config_parse_header(char **slot, const char *v, bool may_be_empty)
{
    if (!(may_be_empty && *v == '\0') && !http_is_token(span_from_cstr(v)))
        return -EINVAL;
    return replace_string(slot, v, strlen(v));
}

static bool has_ctl(const char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s == 0x7f)
            return true;
    }
    return false;
}

/* scheme://host[:port][/prefix], as the upstream module will read it (libcurl's
 * URL API), with no user info, query or fragment; one trailing '/' dropped. */
int config_parse_upstream(char **slot, const char *v)
{
    struct upstream_base base;
    size_t len = strlen(v);
    int r;

    /* No '?' or '#' at all (curl drops an empty query or fragment without a
     * word, and the URL is shown as given), and ASCII only. */
    if (has_ctl(v) || strpbrk(v, "?#"))
        return -EINVAL;
    for (const char *c = v; *c; c++) {
        if ((unsigned char)*c >= 0x80)
            return -EINVAL;
    }
    r = upstream_base_parse(v, &base); /* http or https only, as curl reads it */
    if (r < 0)
        return r;
    upstream_base_done(&base);
    if (v[len - 1] == '/')
        len--;
    return replace_string(slot, v, len);
}

#define TOKEN_MAX 4096

/* Reads the first line of the file <path> (its line end left out) as a
 * secret: into <secret_slot>, and the path into <path_slot>. A token
 * (<token>) has the whitespace around it cut and is 1 to TOKEN_MAX visible
 * ASCII characters; a password is 1 to TOKEN_MAX bytes with no control
 * character. Nothing changes on failure. */
int config_parse_secret_file(char **path_slot, char **secret_slot, const char *path, bool token)
{
    char buf[TOKEN_MAX + 2], *secret;
    struct span t;
    size_t n;
    FILE *f;
    int r;

    f = fopen(path, "re");
    if (!f)
        return -errno;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    r = ferror(f) ? -EIO : 0;
    fclose(f);
    if (r < 0)
        return r;
    t = (struct span){ .base = buf, .len = 0 };
    while (t.len < n && buf[t.len] != '\r' && buf[t.len] != '\n')
        t.len++; /* a NUL stays in: it is refused below, not a silent end */
    while (token && t.len > 0 && (t.base[0] == ' ' || t.base[0] == '\t')) {
        t.base++;
        t.len--;
    }
    while (token && t.len > 0 && (t.base[t.len - 1] == ' ' || t.base[t.len - 1] == '\t'))
        t.len--;
    r = t.len == 0 || t.len > TOKEN_MAX ? -EINVAL : 0;
    if (r == 0 && token && !http_is_visible(t, TOKEN_MAX))
        r = -EINVAL;
    for (size_t i = 0; r == 0 && !token && i < t.len; i++) {
        if ((unsigned char)t.base[i] < 0x20 || (unsigned char)t.base[i] == 0x7f)
            r = -EINVAL;
    }
    if (r == 0) {
        secret = strndup(t.base, t.len);
        r = secret ? replace_string(path_slot, path, strlen(path)) : -ENOMEM;
        if (r == 0) {
            if (*secret_slot)
                explicit_bzero(*secret_slot, strlen(*secret_slot));
            free(*secret_slot);
            *secret_slot = secret;
        } else if (secret) {
            explicit_bzero(secret, t.len);
            free(secret);
        }
    }
    explicit_bzero(buf, sizeof(buf));
    return r;
}

int config_parse_redis_url(char **slot, const char *v)
{
    struct redis_url u;
    int err;

    if (*v == '\0') {
        free(*slot); /* "" asks for no Redis, as if unset */
        *slot = NULL;
        return 0;
    }
    err = redis_url_parse(v, &u, NULL, 0);
    if (err < 0)
        return err;
    redis_url_done(&u);
    return replace_string(slot, v, strlen(v));
}

int config_parse_store_url(char **slot, const char *v)
{
    int err;

    if (*v == '\0') {
        free(*slot); /* "" asks for no store URL, as if unset */
        *slot = NULL;
        return 0;
    }
    err = store_registry_check_url(v, NULL, 0);
    return err < 0 ? err : replace_string(slot, v, strlen(v));
}

void config_store_url_why(const char *v, bool any_store, char *why, size_t len)
{
    struct redis_url u;

    if (len)
        why[0] = '\0';
    if (any_store)
        (void)store_registry_check_url(v, why, len);
    else if (pg_url_is(v))
        snprintf(why, len, "a PostgreSQL URL goes in --store");
    else if (redis_url_parse(v, &u, why, len) == 0)
        redis_url_done(&u);
}

/* The edit distance between <a> and <b> (insertions, deletions,
 * substitutions and swaps of neighbours each count one), up to 64 bytes
 * each (longer: far). */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    unsigned char d[65][65];

    if (la > 64 || lb > 64)
        return SIZE_MAX;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            unsigned best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);

            if (d[i - 1][j] + 1u < best)
                best = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < best)
                best = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1u < best)
                best = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)best;
        }
    }
    return d[la][lb];
}

const char *config_nearest(const char *s, size_t len, const char *const *names, size_t n)
{
    size_t most = len / 3 < 3 ? len / 3 : 3, best = SIZE_MAX;
    const char *found = NULL;

    for (size_t i = 0; i < n; i++) {
        size_t d;

        if (!names[i])
            continue;
        d = edit_distance(s, len, names[i], strlen(names[i]));
        if (d < best && d > 0 && d <= (most ? most : 1)) {
            best = d;
            found = names[i];
        }
    }
    return found;
}

/* A path this process can read, kept as given. */
int config_parse_file(char **slot, const char *path)
{
    if (!*path || has_ctl(path))
        return -EINVAL;
    if (access(path, R_OK) < 0)
        return -errno;
    return replace_string(slot, path, strlen(path));
}

int config_parse_hostname(char **slot, const char *v)
{
    size_t n = strlen(v);

    if (n == 0 || n > 253)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)v[i]) && !strchr("-._:", v[i]))
            return -EINVAL;
    }
    return replace_string(slot, v, n);
}

void config_parse_list_clear(char **list, size_t *n)
{
    for (size_t i = 0; i < *n; i++) {
        free(list[i]);
        list[i] = NULL;
    }
    *n = 0;
}

/* Parses the comma-separated tokens of <v> and replaces the list with them,
 * or appends them when <append>; <upper> (methods) upper-cases them and
 * refuses an empty list, which other lists (scope headers) take as none.
 * Nothing changes on failure. -E2BIG past CONFIG_MAX_LIST entries. */
int config_parse_list(char **list, size_t *n, const char *v, bool append, bool upper)
{
    char *items[CONFIG_MAX_LIST] = { NULL };
    size_t count = 0, base = append ? *n : 0;
    const char *p = v;
    int r;

    if (trim(v, strlen(v)).len == 0 && !upper) {
        if (!append)
            config_parse_list_clear(list,
                                    n); /* scope headers "": none, every client in one scope */
        return 0;
    }
    for (;;) {
        const char *end = strchr(p, ',');
        struct span e = trim(p, end ? (size_t)(end - p) : strlen(p));

        if (!http_is_token(e)) {
            r = -EINVAL;
            goto fail;
        }
        if (base + count == CONFIG_MAX_LIST) {
            r = -E2BIG;
            goto fail;
        }
        items[count] = strndup(e.base, e.len);
        if (!items[count]) {
            r = -ENOMEM;
            goto fail;
        }
        if (upper) {
            for (char *c = items[count]; *c; c++) {
                if (*c >= 'a' && *c <= 'z')
                    *c = (char)(*c - 'a' + 'A');
            }
        }
        count++;
        if (!end)
            break;
        p = end + 1;
    }
    if (!append)
        config_parse_list_clear(list, n);
    memcpy(list + *n, items, count * sizeof(items[0]));
    *n += count;
    return 0;

fail:
    for (size_t i = 0; i < count; i++)
        free(items[i]);
    return r;
}
