/* SPDX-License-Identifier: MIT */
/* Redis Cluster's pure parts: key slots, the CLUSTER SLOTS map, MOVED and ASK.
 * Replies and redirections come from the network: every field is checked. */
#include "idemproxy/redis_cluster.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#define SLOT_MAX (REDIS_CLUSTER_SLOTS - 1)
#define PORT_MAX 65535u

uint16_t redis_cluster_crc16(const void *s, size_t len)
{
    const unsigned char *p = s;
    unsigned crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)p[i] << 8;
        for (int bit = 0; bit < 8; bit++)
            crc = ((crc << 1) ^ (crc & 0x8000 ? 0x1021 : 0)) & 0xffff;
    }
    return (uint16_t)crc;
}

unsigned redis_cluster_key_slot(const void *key, size_t len)
{
    const char *k = key;
    const char *open = len ? memchr(k, '{', len) : NULL;
    size_t after = open ? len - (size_t)(open - k) - 1 : 0; /* bytes after the '{' */
    const char *close = after ? memchr(open + 1, '}', after) : NULL;

    /* "{}" is no tag: the whole key is hashed, as Redis does */
    if (close && close > open + 1)
        return redis_cluster_crc16(open + 1, (size_t)(close - open - 1)) % REDIS_CLUSTER_SLOTS;
    return redis_cluster_crc16(k, len) % REDIS_CLUSTER_SLOTS;
}

/* Parses all of <s> (<len> bytes) as a decimal number from 0 to <max>. */
static bool parse_uint(const char *s, size_t len, unsigned max, unsigned *ret)
{
    unsigned v = 0;

    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
        if (v > max)
            return false; /* checked at each digit, so that nothing overflows */
    }
    *ret = v;
    return true;
}

/* "?": Redis 7 told to announce a hostname it was not given. Unlike "", it
 * need not be the node that answered, so nothing can be sent there. */
static bool is_unknown_host(const char *s, size_t len) { return len == 1 && s[0] == '?'; }

/* Copies the host <s> (<len> bytes; brackets around the whole removed) into
 * <a>; an empty one is <self_host>. False when it is empty with no
 * <self_host>, is "?", does not fit, or holds a space, a control or 8-bit
 * byte, or a bracket anywhere else: a host goes to the resolver and into log
 * lines. */
static bool set_host(struct redis_addr *a, const char *s, size_t len, const char *self_host)
{
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        if (len == 2)
            return false;
        s++;
        len -= 2;
    } else if (len == 0) {
        if (!self_host || !*self_host)
            return false;
        s = self_host;
        len = strlen(self_host);
    }
    if (len >= sizeof(a->host) || is_unknown_host(s, len))
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c < 0x21 || c > 0x7e || c == '[' || c == ']')
            return false;
    }
    memcpy(a->host, s, len);
    a->host[len] = '\0';
    return true;
}

int redis_redirect_parse(const char *s, size_t len, const char *self_host,
                         struct redis_redirect *ret)
{
    struct redis_redirect r = { .kind = REDIS_REDIRECT_MOVED };
    const char *end, *p, *space, *colon;

    if (len > 6 && memcmp(s, "MOVED ", 6) == 0) {
        p = s + 6;
    } else if (len > 4 && memcmp(s, "ASK ", 4) == 0) {
        r.kind = REDIS_REDIRECT_ASK;
        p = s + 4;
    } else {
        return -EINVAL;
    }
    end = s + len; /* not before: <s> may be NULL when <len> is 0 */
    space = memchr(p, ' ', (size_t)(end - p));
    if (!space || !parse_uint(p, (size_t)(space - p), SLOT_MAX, &r.slot))
        return -EINVAL;
    /* the last ':', so that an IPv6 address needs no brackets */
    for (colon = end - 1; colon > space && *colon != ':'; colon--)
        ;
    if (colon == space)
        return -EINVAL;
    if (!parse_uint(colon + 1, (size_t)(end - colon - 1), PORT_MAX, &r.addr.port) ||
        r.addr.port == 0)
        return -EINVAL;
    if (!set_host(&r.addr, space + 1, (size_t)(colon - space - 1), self_host))
        return -EINVAL;
    *ret = r;
    return 0;
}

static bool parse_slot(const redisReply *e, unsigned *ret)
{
    if (e->type != REDIS_REPLY_INTEGER || e->integer < 0 || e->integer > SLOT_MAX)
        return false;
    *ret = (unsigned)e->integer;
    return true;
}

/* Parses the node [host, port, id?, …] <n> into <a>. Returns 0, 1 when its
 * host is "?" (<a> partly filled), or -EPROTO. */
static int parse_node(const redisReply *n, const char *self_host, struct redis_addr *a)
{
    const redisReply *host, *port;

    if (n->type != REDIS_REPLY_ARRAY || n->elements < 2)
        return -EPROTO;
    host = n->element[0];
    port = n->element[1];
    if (port->type != REDIS_REPLY_INTEGER || port->integer < 1 || port->integer > PORT_MAX)
        return -EPROTO;
    a->port = (unsigned)port->integer;
    /* a nil host is Redis 7's "unknown-endpoint": like "", the node that answered */
    if (host->type == REDIS_REPLY_NIL)
        return set_host(a, "", 0, self_host) ? 0 : -EPROTO;
    if (host->type != REDIS_REPLY_STRING)
        return -EPROTO;
    if (is_unknown_host(host->str, host->len))
        return 1;
    return set_host(a, host->str, host->len, self_host) ? 0 : -EPROTO;
}

int redis_cluster_slots_parse(const redisReply *r, const char *self_host,
                              struct redis_slot_range **ret)
{
    struct redis_slot_range *v = NULL;
    struct redis_addr replica;
    size_t n = 0;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements > REDIS_CLUSTER_MAX_RANGES)
        return -EPROTO;
    if (r->elements && !(v = calloc(r->elements, sizeof(*v))))
        return -ENOMEM;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        struct redis_slot_range *range = &v[n];
        int master = 0;

        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            !parse_slot(e->element[0], &range->first) || !parse_slot(e->element[1], &range->last) ||
            range->first > range->last)
            goto fail;
        /* replicas are not used, but a reply with a malformed one is not trusted */
        for (size_t j = 2; j < e->elements; j++) {
            int k = parse_node(e->element[j], self_host, j == 2 ? &range->master : &replica);

            if (k < 0)
                goto fail;
            if (j == 2)
                master = k;
        }
        if (master == 0)
            n++; /* else the slot is left out, as if unassigned, and <range> reused */
    }
    if (n == 0) {
        free(v);
        v = NULL;
    }
    *ret = v;
    return (int)n;
fail:
    free(v);
    return -EPROTO;
}
