/* SPDX-License-Identifier: MIT */
/* The principal of a request (doc/configuration.md, Scope): a verified
 * token's issuer and claims, or a trusted gateway's header. */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "idemproxy/buf.h"
#include "idemproxy/request.h"

#include "scope_impl.h"

static const char *const labels[] = {
#define X(id, label) label,
    SCOPE_FAILURE_LIST(X)
#undef X
};

const char *scope_failure_label(enum scope_failure f)
{
    return (unsigned)f < SCOPE_FAILURE_MAX ? labels[f] : "unknown";
}

static struct scope *scope_alloc(const char *header)
{
    struct scope *s = calloc(1, sizeof(*s));

    if (s && !(s->header = strdup(header))) {
        free(s);
        return NULL;
    }
    if (s)
        atomic_init(&s->refs, 1);
    return s;
}

struct scope *scope_ref(struct scope *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

const char *scope_header(const struct scope *s) { return s->header; }

void scope_unref(struct scope *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    scope_keyset_unref(s->keys);
    scope_source_unref(s->source);
    free(s->header);
    free(s->issuer);
    free(s->audience);
    for (size_t i = 0; i < s->nclaims; i++)
        free(s->claims[i]);
    free(s);
}

/* The keys of <c>: exactly one of keys, keys-url and secret-file. */
static int jwt_keys(struct scope *s, const struct scope_jwt_config *c, char *why, size_t whylen)
{
    int given = !!c->keys_file + !!c->keys_url + !!c->secret_file;

    if (given != 1) {
        snprintf(why, whylen, "scope.jwt: give one of keys, keys-url and secret-file (%s)",
                 given ? "not several" : "none is given");
        return -EINVAL;
    }
    if (c->keys_file)
        return scope_keyset_from_file(c->keys_file, &s->keys, why, whylen);
    if (c->secret_file)
        return scope_keyset_from_secret(c->secret_file, &s->keys, why, whylen);
    return scope_source_get(c->keys_url, &s->source, why, whylen);
}

int scope_jwt_new(const struct scope_jwt_config *c, struct scope **ret, char *why, size_t whylen)
{
    struct scope *s;
    int err = 0;

    if (!c->issuer || !c->issuer[0]) {
        snprintf(why, whylen, "scope.jwt: issuer is required (the iss every token must carry)");
        return -EINVAL;
    }
    s = scope_alloc(c->header ? c->header : "Authorization");
    if (!s)
        return -ENOMEM;
    s->jwt = true;
    s->leeway_s = c->leeway_s;
    s->issuer = strdup(c->issuer);
    s->audience = c->audience ? strdup(c->audience) : NULL;
    if (!s->issuer || (c->audience && !s->audience))
        err = -ENOMEM;
    for (size_t i = 0; err == 0 && i < (c->nclaims ? c->nclaims : 1); i++) {
        s->claims[i] = strdup(c->nclaims ? c->claims[i] : "sub");
        err = s->claims[i] ? 0 : -ENOMEM;
        s->nclaims += err == 0;
    }
    if (err == 0)
        err = jwt_keys(s, c, why, whylen);
    if (err < 0) {
        scope_unref(s);
        return err;
    }
    *ret = s;
    return 0;
}

/* Parses network <text> ("10.0.0.0/8", "::1/128", an address alone) into <n>. */
static int parse_net(const char *text, struct scope_net *n)
{
    char addr[64];
    const char *slash = strchr(text, '/');
    size_t len = slash ? (size_t)(slash - text) : strlen(text);
    unsigned max;
    char *end;

    if (len == 0 || len >= sizeof(addr))
        return -EINVAL;
    memcpy(addr, text, len);
    addr[len] = '\0';
    if (inet_pton(AF_INET, addr, n->addr) == 1)
        n->family = AF_INET;
    else if (inet_pton(AF_INET6, addr, n->addr) == 1)
        n->family = AF_INET6;
    else
        return -EINVAL;
    max = n->family == AF_INET ? 32 : 128;
    n->bits = max;
    if (slash) {
        unsigned long b = strtoul(slash + 1, &end, 10);

        if (slash[1] < '0' || slash[1] > '9' || *end || b > max)
            return -EINVAL;
        n->bits = (unsigned)b;
    }
    return 0;
}

int scope_trusted_new(const char *header, const char *const *cidrs, size_t n, struct scope **ret,
                      char *why, size_t whylen)
{
    struct scope *s;

    if (n == 0 || n > SCOPE_TRUSTED_MAX) {
        snprintf(why, whylen, "scope.trusted: 1 to %d networks (the gateway's addresses)",
                 SCOPE_TRUSTED_MAX);
        return -EINVAL;
    }
    s = scope_alloc(header);
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (parse_net(cidrs[i], &s->nets[i]) < 0) {
            snprintf(why, whylen,
                     "scope.trusted: '%s' is not a network (use an address, or ADDRESS/BITS "
                     "such as 10.0.0.0/8 or fd00::/8)",
                     cidrs[i]);
            scope_unref(s);
            return -EINVAL;
        }
    }
    s->nnets = n;
    *ret = s;
    return 0;
}

/* Whether address <a> of <family> is in <n>. */
static bool net_has(const struct scope_net *n, int family, const uint8_t *a)
{
    unsigned full = n->bits / 8, rest = n->bits % 8;

    if (family != n->family || memcmp(a, n->addr, full) != 0)
        return false;
    return rest == 0 || ((a[full] ^ n->addr[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

/* Whether the client <ip> is in one of the trusted networks of <s>; an
 * IPv4-mapped IPv6 address counts as its IPv4 one. */
static bool peer_trusted(const struct scope *s, const char *ip)
{
    uint8_t a[16];
    int family = AF_INET;

    if (inet_pton(AF_INET, ip, a) != 1) {
        if (inet_pton(AF_INET6, ip, a) != 1)
            return false;
        family = AF_INET6;
        if (memcmp(a, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
            memmove(a, a + 12, 4);
            family = AF_INET;
        }
    }
    for (size_t i = 0; i < s->nnets; i++) {
        if (net_has(&s->nets[i], family, a))
            return true;
    }
    return false;
}

/* The token in header value <v>: after "Bearer " (the scheme in any case),
 * or the whole value in a header other than Authorization. */
static struct span bearer(const struct scope *s, struct span v)
{
    if (v.len > 7 && strncasecmp(v.base, "Bearer ", 7) == 0) {
        v.base += 7, v.len -= 7;
        while (v.len && v.base[0] == ' ')
            v.base++, v.len--;
        return v;
    }
    if (strcasecmp(s->header, "Authorization") == 0)
        return (struct span){ NULL, 0 }; /* another scheme: not a bearer token */
    return v;
}

/* The kinds of principal, the first value hashed: a principal of one kind
 * never hashes like one of another (nor like scope headers' values, which
 * hold no NUL), on any route of the store. */
#define JWT_TAG SPAN_LIT("\0jwt")
#define TRUSTED_TAG SPAN_LIT("\0trusted")

/* Appends <v> to <text> as the next value (its start in <offs>[<n>]). */
static int add_value(struct buf *text, size_t *offs, size_t *n, struct span v)
{
    offs[(*n)++] = text->len;
    return buf_append(text, v.base ? v.base : "", v.len);
}

/* Points <p>'s <n> values into <text>, which it takes over. */
static void set_values(struct scope_principal *p, struct buf *text, const size_t *offs, size_t n)
{
    p->owned = text->data;
    for (size_t i = 0; i < n; i++) {
        size_t end = i + 1 < n ? offs[i + 1] : text->len;

        p->values[i] = (struct span){ text->data ? text->data + offs[i] : "", end - offs[i] };
    }
    p->n = n;
}

/* The principal of verified <claims>: the tag, iss, then each named claim's
 * name and compact JSON (a string quoted), so that "1" and 1, and a value
 * under another claim's name, differ. */
static int principal_of(const struct scope *s, json_t *claims, struct scope_principal *p)
{
    struct buf text = BUF_INIT(SIZE_MAX);
    size_t offs[SCOPE_VALUES_MAX], n = 0;
    json_t *iss = json_object_get(claims, "iss");
    int err = add_value(&text, offs, &n, JWT_TAG);

    if (err == 0)
        err = add_value(&text, offs, &n,
                        (struct span){ json_string_value(iss), json_string_length(iss) });
    for (size_t i = 0; err == 0 && i < s->nclaims; i++) {
        char *j = json_dumps(json_object_get(claims, s->claims[i]),
                             JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);

        err = add_value(&text, offs, &n, span_from_cstr(s->claims[i]));
        if (err == 0)
            err = j ? add_value(&text, offs, &n, span_from_cstr(j)) : -ENOMEM;
        free(j);
    }
    if (err < 0) {
        buf_done(&text);
        return err;
    }
    set_values(p, &text, offs, n);
    return 0;
}

/* The principal a trusted gateway's header <v> names: the tag, the header's
 * name (lower case), its value. */
static int trusted_principal(const struct scope *s, struct span v, struct scope_principal *p)
{
    struct buf text = BUF_INIT(SIZE_MAX);
    size_t offs[3], n = 0;
    int err = add_value(&text, offs, &n, TRUSTED_TAG);

    if (err == 0)
        err = add_value(&text, offs, &n, span_from_cstr(s->header));
    for (size_t i = offs[1]; err == 0 && i < text.len; i++)
        text.data[i] = (char)tolower((unsigned char)text.data[i]);
    if (err == 0)
        err = add_value(&text, offs, &n, v);
    if (err < 0) {
        buf_done(&text);
        return err;
    }
    set_values(p, &text, offs, n);
    return 0;
}

int scope_eval(const struct scope *s, const struct request *rq, uint64_t now_s,
               struct scope_principal *p, enum scope_failure *why)
{
    const struct span *v;
    struct span tok;
    size_t count;
    json_t *claims = NULL;
    int r;

    memset(p, 0, sizeof(*p));
    v = request_header(rq, span_from_cstr(s->header), &count);
    if (!s->jwt) {
        if (v && count == 1 && peer_trusted(s, rq->client_ip))
            return trusted_principal(s, *v, p);
        return 0; /* from elsewhere, as if absent */
    }
    if (!v)
        return 0;
    if (count > 1) {
        *why = SCOPE_FAILURE_MALFORMED;
        return 1;
    }
    tok = bearer(s, *v);
    if (!tok.base)
        return 0; /* Basic or another scheme: no bearer token, no principal */
    r = scope_jwt_verify(s, tok, now_s, &claims, why);
    if (r == 0)
        r = principal_of(s, claims, p);
    json_decref(claims);
    return r;
}

bool scope_can_wait(const struct scope *s) { return s->source != NULL; }

int scope_wait_keys(const struct scope *s, struct scope_waiter *w)
{
    return s->source ? scope_source_wait(s->source, w) : -EALREADY;
}

void scope_principal_done(struct scope_principal *p)
{
    free(p->owned);
    p->owned = NULL;
    p->n = 0;
}
