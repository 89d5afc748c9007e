/* SPDX-License-Identifier: MIT */
/* PostgreSQL URLs read by libpq, shown without secrets (pg_url.h). */
#include "idemproxy/pg_url.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool pg_url_is(const char *s)
{
    return s &&
           (strncasecmp(s, "postgresql://", 13) == 0 || strncasecmp(s, "postgres://", 11) == 0);
}

int pg_url_check(const char *s, char *why, size_t len)
{
    char *msg = NULL;
    PQconninfoOption *opts;

    if (len)
        why[0] = '\0';
    if (!pg_url_is(s)) {
        snprintf(why, len, "not a postgresql:// or postgres:// URL");
        return -EINVAL;
    }
    opts = PQconninfoParse(s, &msg);
    if (opts) {
        PQconninfoFree(opts);
        return 0;
    }
    if (!msg)
        return -ENOMEM;
    snprintf(why, len, "%.*s", (int)strcspn(msg, "\n"), msg); /* libpq ends it with a newline */
    PQfreemem(msg);
    return -EINVAL;
}

/* Appends <n> bytes of <p> to <out>, as far as it has room. */
static void put(char *out, size_t len, size_t *used, const char *p, size_t n)
{
    if (*used + 1 >= len)
        return;
    if (n > len - 1 - *used)
        n = len - 1 - *used;
    memcpy(out + *used, p, n);
    *used += n;
    out[*used] = '\0';
}

/* True when the query parameter at <c> names a secret: password or sslpassword. */
static bool is_secret_param(const char *c)
{
    static const char *const names[] = { "password=", "sslpassword=" };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strncmp(c, names[i], strlen(names[i])) == 0)
            return true;
    }
    return false;
}

void pg_url_redact(const char *s, char *out, size_t len)
{
    const char *start = strstr(s, "://"), *end = s + strlen(s), *auth_end, *at = NULL;
    const char *secret = NULL, *query;
    size_t used = 0;

    if (!len)
        return;
    out[0] = '\0';
    if (!start) {
        put(out, len, &used, s, (size_t)(end - s));
        return;
    }
    start += 3;
    auth_end = start + strcspn(start, "/?");
    for (const char *p = start; p < auth_end; p++) {
        if (*p == '@')
            at = p; /* the last one: a password may hold an '@' */
    }
    if (at)
        secret = memchr(start, ':', (size_t)(at - start));
    query = *auth_end == '?' ? auth_end : strchr(auth_end, '?');
    for (const char *c = s; c < end;) {
        if (secret && c == secret + 1) {
            put(out, len, &used, "***", 3);
            c = at;
            secret = NULL;
        } else if (query && c > query && (c[-1] == '?' || c[-1] == '&') && is_secret_param(c)) {
            size_t name = strcspn(c, "=") + 1;

            put(out, len, &used, c, name);
            put(out, len, &used, "***", 3);
            c += name + strcspn(c + name, "&");
        } else {
            put(out, len, &used, c, 1);
            c++;
        }
    }
}

/* Splits the comma-separated <v> into <n> fields of <out> (<cap> bytes
 * each). Returns how many, or -EINVAL past PG_URL_MAX_HOSTS or a field too long. */
static int split_list(const char *v, char (*out)[PG_URL_HOST_MAX], size_t cap)
{
    int n = 0;

    for (const char *p = v;; n++) {
        size_t len = strcspn(p, ",");

        if (n == PG_URL_MAX_HOSTS || len >= cap)
            return -EINVAL;
        memcpy(out[n], p, len);
        out[n][len] = '\0';
        if (!p[len])
            return n + 1;
        p += len + 1;
    }
}

int pg_url_hosts(const char *s, struct pg_url_hosts *ret)
{
    char ports[PG_URL_MAX_HOSTS][PG_URL_HOST_MAX];
    const char *hosts = NULL, *port = NULL;
    PQconninfoOption *opts = PQconninfoParse(s, NULL);
    int nh = 1, np = 0;

    if (!opts)
        return -EINVAL;
    memset(ret, 0, sizeof(*ret));
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (strcmp(o->keyword, "host") == 0)
            hosts = o->val;
        else if (strcmp(o->keyword, "port") == 0)
            port = o->val;
        else if (strcmp(o->keyword, "hostaddr") == 0)
            ret->hostaddr = o->val && o->val[0];
    }
    ret->host[0][0] = '\0';
    if (hosts && hosts[0])
        nh = split_list(hosts, ret->host, sizeof(ret->host[0]));
    if (nh > 0 && port && port[0])
        np = split_list(port, ports, sizeof(ports[0]));
    PQconninfoFree(opts);
    if (nh < 0 || np < 0 || (np > 1 && np != nh))
        return -EINVAL;
    ret->n = (unsigned)nh;
    for (int i = 0; i < nh; i++) /* one port for every host, or one each */
        snprintf(ret->port[i], sizeof(ret->port[i]), "%.7s", np ? ports[np > 1 ? i : 0] : "");
    return 0;
}

bool pg_url_host_is_name(const char *host)
{
    unsigned char a[16];

    return host[0] && host[0] != '/' && host[0] != '@' && inet_pton(AF_INET, host, a) != 1 &&
           inet_pton(AF_INET6, host, a) != 1;
}

size_t pg_text_escape(const char *in, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        bool plain = c >= 0x20 && c < 0x7f;

        if (len + (plain ? 1 : 3) >= cap)
            break;
        if (plain) {
            out[len++] = (char)c;
        } else {
            out[len++] = '%';
            out[len++] = hex[c >> 4];
            out[len++] = hex[c & 15];
        }
    }
    out[len] = '\0';
    return len;
}
