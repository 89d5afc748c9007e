/* SPDX-License-Identifier: MIT */
#include "idemproxy/pg_url.h"

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
