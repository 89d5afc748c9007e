/* SPDX-License-Identifier: MIT */
/* Redis Cluster's parsers of what nodes send: the hash slot of any key, the
 * MOVED and ASK redirections, and CLUSTER SLOTS replies that hiredis' reader
 * builds from the input read as RESP. */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "idemproxy/redis_cluster.h"

#define SELF_HOST "self.example"

/* The slot is in range; a hash tag (bytes between the first '{' and the
 * first '}' after it) decides it alone; the CRC of a message followed by its
 * CRC, big-endian, is 0. */
static void check_key_slot(const uint8_t *data, size_t size)
{
    unsigned slot = redis_cluster_key_slot(data, size);
    const uint8_t *open = size ? memchr(data, '{', size) : NULL;
    size_t after = open ? size - (size_t)(open - data) - 1 : 0;
    const uint8_t *close = after ? memchr(open + 1, '}', after) : NULL;
    uint16_t crc = redis_cluster_crc16(data, size);
    uint8_t *framed = malloc(size + 2);

    FUZZ_CHECK(slot < REDIS_CLUSTER_SLOTS);
    if (close && close > open + 1)
        FUZZ_CHECK(slot == redis_cluster_key_slot(open + 1, (size_t)(close - open - 1)));
    else
        FUZZ_CHECK(slot == crc % REDIS_CLUSTER_SLOTS);
    FUZZ_CHECK(framed != NULL);
    if (size)
        memcpy(framed, data, size);
    framed[size] = (uint8_t)(crc >> 8);
    framed[size + 1] = (uint8_t)crc;
    FUZZ_CHECK(redis_cluster_crc16(framed, size + 2) == 0);
    free(framed);
}

static bool is_good_host(const char *host)
{
    size_t n = strnlen(host, REDIS_URL_HOST_MAX);

    return n > 0 && n < REDIS_URL_HOST_MAX && strcmp(host, "?") != 0;
}

/* Refused: <ret> untouched. Accepted: a slot, port and host in range, and
 * the canonical text of the redirection parses back to the same. */
static void check_redirect(const uint8_t *data, size_t size)
{
    struct redis_redirect r, before, again;
    char text[REDIS_URL_HOST_MAX + 32];
    int n;

    memset(&before, 0x5a, sizeof(before));
    memcpy(&r, &before, sizeof(r));
    if (redis_redirect_parse((const char *)data, size, SELF_HOST, &r) != 0) {
        FUZZ_CHECK(memcmp(&r, &before, sizeof(r)) == 0);
        return;
    }
    FUZZ_CHECK(r.kind == REDIS_REDIRECT_MOVED || r.kind == REDIS_REDIRECT_ASK);
    FUZZ_CHECK(r.slot < REDIS_CLUSTER_SLOTS);
    FUZZ_CHECK(r.addr.port >= 1 && r.addr.port <= 65535);
    FUZZ_CHECK(is_good_host(r.addr.host));
    n = snprintf(text, sizeof(text), "%s %u %s:%u", r.kind == REDIS_REDIRECT_ASK ? "ASK" : "MOVED",
                 r.slot, r.addr.host, r.addr.port);
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof(text));
    FUZZ_CHECK(redis_redirect_parse(text, (size_t)n, NULL, &again) == 0);
    FUZZ_CHECK(again.kind == r.kind && again.slot == r.slot && again.addr.port == r.addr.port);
    FUZZ_CHECK(strcmp(again.addr.host, r.addr.host) == 0);
}

/* hiredis 0.14 allocates an array's element pointers as soon as it reads
 * "*<count>" (up to INT_MAX of them): inputs that announce more elements in
 * all than they have bytes would only measure the allocator. */
static bool counts_fit(const uint8_t *data, size_t size)
{
    size_t total = 0;

    for (size_t i = 0; i < size; i++) {
        size_t n = 0, j = i + 1;

        if (data[i] != '*')
            continue;
        if (j < size && (data[j] == '+' || data[j] == '-'))
            j++;
        for (; j < size && data[j] >= '0' && data[j] <= '9'; j++) {
            n = n * 10 + (size_t)(data[j] - '0');
            if (n > size)
                return false;
        }
        total += n;
        if (total > size)
            return false;
    }
    return true;
}

/* Element <i> of the range <e> when it is an integer (a slot), or -1. */
static long long int_at(const redisReply *e, size_t i)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements <= i ||
        e->element[i]->type != REDIS_REPLY_INTEGER)
        return -1;
    return e->element[i]->integer;
}

/* Refused: -EPROTO and <ret> untouched. Accepted: ranges in order, each one
 * of the reply's, with slots, port and host in range. */
static void check_slots(const uint8_t *data, size_t size)
{
    redisReader *rd;
    void *reply = NULL;
    struct redis_slot_range *v;
    const redisReply *r;
    int n;

    if (size == 0 || data[0] != '*' || !counts_fit(data, size))
        return;
    rd = redisReaderCreate();
    FUZZ_CHECK(rd != NULL);
    if (redisReaderFeed(rd, (const char *)data, size) != REDIS_OK ||
        redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
        goto out;
    r = reply;
    v = (struct redis_slot_range *)&rd;
    n = redis_cluster_slots_parse(r, SELF_HOST, &v);
    if (n < 0) {
        FUZZ_CHECK(n == -EPROTO && v == (struct redis_slot_range *)&rd);
        goto out;
    }
    FUZZ_CHECK(r->type == REDIS_REPLY_ARRAY && (size_t)n <= r->elements);
    FUZZ_CHECK((n == 0) == (v == NULL));
    for (size_t i = 0, j = 0; i < (size_t)n; i++, j++) {
        FUZZ_CHECK(v[i].first <= v[i].last && v[i].last < REDIS_CLUSTER_SLOTS);
        FUZZ_CHECK(v[i].master.port >= 1 && v[i].master.port <= 65535);
        FUZZ_CHECK(is_good_host(v[i].master.host));
        while (j < r->elements &&
               (int_at(r->element[j], 0) != v[i].first || int_at(r->element[j], 1) != v[i].last))
            j++;
        FUZZ_CHECK(j < r->elements);
    }
    free(v);
out:
    if (reply)
        freeReplyObject(reply);
    redisReaderFree(rd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_key_slot(data, size);
    check_redirect(data, size);
    check_slots(data, size);
    return 0;
}
