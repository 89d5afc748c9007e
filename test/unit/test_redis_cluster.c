/* SPDX-License-Identifier: MIT */
/* Redis Cluster's pure parts: key slots, MOVED/ASK, CLUSTER SLOTS replies
 * (built by hand as hiredis would). The slot numbers were checked against
 * redis-server 7.0.15's CLUSTER KEYSLOT. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "check.h"
#include "idemproxy/common.h"
#include "idemproxy/redis_cluster.h"

#define REPLY_MAP 9 /* hiredis 1.x's REDIS_REPLY_MAP: a type 0.14 does not know */

static unsigned slot_of(const char *key) { return redis_cluster_key_slot(key, strlen(key)); }

static void test_crc16(void)
{
    uint8_t buf[] = { 'a', 'b', 'c', 0, 0 };
    uint16_t crc = redis_cluster_crc16(buf, 3);

    CHECK_EQ_INT(redis_cluster_crc16("123456789", 9), 0x31C3);
    CHECK_EQ_INT(redis_cluster_crc16("A", 1), 0x58E5);
    CHECK_EQ_INT(redis_cluster_crc16("", 0), 0);
    CHECK_EQ_INT(redis_cluster_crc16(NULL, 0), 0);
    CHECK_EQ_INT(redis_cluster_crc16("\0", 1), 0); /* init 0, no final xor */
    /* a CRC without reflection or final xor: appending it big-endian gives 0 */
    buf[3] = (uint8_t)(crc >> 8);
    buf[4] = (uint8_t)crc;
    CHECK_EQ_INT(redis_cluster_crc16(buf, 5), 0);
}

static void test_key_slot(void)
{
    CHECK_EQ_INT(slot_of("foo"), 12182);
    CHECK_EQ_INT(slot_of("bar"), 5061);
    CHECK_EQ_INT(slot_of("123456789"), 0x31C3 % 16384);
    CHECK_EQ_INT(slot_of(""), 0);
    CHECK_EQ_INT(redis_cluster_key_slot(NULL, 0), 0);
    CHECK_EQ_INT(slot_of("user1000"), 3443);
    CHECK_EQ_INT(slot_of("{user1000}.following"), 3443);
    CHECK_EQ_INT(slot_of("{user1000}.followers"), 3443);
    /* "{}" is no tag, and the first '{' decides: the whole key is hashed */
    CHECK_EQ_INT(slot_of("foo{}{bar}"), 8363);
    CHECK_EQ_INT(slot_of("foo{}{bar}"), redis_cluster_crc16("foo{}{bar}", 10) % 16384);
    CHECK_EQ_INT(slot_of("{}"), redis_cluster_crc16("{}", 2) % 16384);
    /* the tag runs from the first '{' to the first '}' after it */
    CHECK_EQ_INT(slot_of("foo{{bar}}zap"), 4015);
    CHECK_EQ_INT(slot_of("{bar"), 4015);
    CHECK_EQ_INT(slot_of("foo{bar}{zap}"), 5061);
    CHECK_EQ_INT(slot_of("x}{bar}"), 5061);
    /* no '}' after the '{': no tag */
    CHECK_EQ_INT(slot_of("foo{bar"), redis_cluster_crc16("foo{bar", 7) % 16384);
    CHECK_EQ_INT(slot_of("}bar{"), redis_cluster_crc16("}bar{", 5) % 16384);
    CHECK_EQ_INT(slot_of("{"), redis_cluster_crc16("{", 1) % 16384);
    /* binary keys, and <len> alone bounds the key */
    CHECK_EQ_INT(redis_cluster_key_slot("\0\xff{bar}\0", 9), 5061);
    CHECK_EQ_INT(redis_cluster_key_slot("{user1000}", 5), slot_of("{user"));
    CHECK_EQ_INT(redis_cluster_key_slot("foo{bar}", 3), 12182);
    CHECK_EQ_INT(redis_cluster_key_slot("idem:{t1}:k", 11), slot_of("t1"));
}

/* Parses NUL-terminated <s>; the result is the return value. */
static int redirect(const char *s, struct redis_redirect *r)
{
    return redis_redirect_parse(s, strlen(s), "self.example", r);
}

static void test_redirect(void)
{
    struct redis_redirect r;
    char buf[300];

    CHECK_EQ_INT(redirect("MOVED 3999 127.0.0.1:6381", &r), 0);
    CHECK_EQ_INT(r.kind, REDIS_REDIRECT_MOVED);
    CHECK_EQ_INT(r.slot, 3999);
    CHECK_EQ_STR(r.addr.host, "127.0.0.1");
    CHECK_EQ_INT(r.addr.port, 6381);

    CHECK_EQ_INT(redirect("ASK 0 node-2.example:1", &r), 0);
    CHECK_EQ_INT(r.kind, REDIS_REDIRECT_ASK);
    CHECK_EQ_INT(r.slot, 0);
    CHECK_EQ_STR(r.addr.host, "node-2.example");
    CHECK_EQ_INT(r.addr.port, 1);

    CHECK_EQ_INT(redirect("MOVED 16383 h:65535", &r), 0);
    CHECK_EQ_INT(r.slot, 16383);
    CHECK_EQ_INT(r.addr.port, 65535);

    /* IPv6: the port follows the last ':'; brackets are accepted and removed */
    CHECK_EQ_INT(redirect("MOVED 1 ::1:7000", &r), 0);
    CHECK_EQ_STR(r.addr.host, "::1");
    CHECK_EQ_INT(r.addr.port, 7000);
    CHECK_EQ_INT(redirect("ASK 2 [2001:db8::1]:7001", &r), 0);
    CHECK_EQ_STR(r.addr.host, "2001:db8::1");
    CHECK_EQ_INT(r.addr.port, 7001);
    CHECK_EQ_INT(redirect("MOVED 3 fe80::1%eth0:7002", &r), 0);
    CHECK_EQ_STR(r.addr.host, "fe80::1%eth0");

    /* Redis 7 not knowing its own address: the node that answered */
    CHECK_EQ_INT(redirect("MOVED 12182 :7000", &r), 0);
    CHECK_EQ_STR(r.addr.host, "self.example");
    CHECK_EQ_INT(r.addr.port, 7000);
    CHECK_EQ_INT(redis_redirect_parse("ASK 1 :7000", 11, "::1", &r), 0);
    CHECK_EQ_STR(r.addr.host, "::1");

    /* <s> need not be terminated: <len> bounds it */
    CHECK_EQ_INT(redis_redirect_parse("MOVED 5 h:7000123", 14, NULL, &r), 0);
    CHECK_EQ_INT(r.addr.port, 7000);

    /* the longest host a struct redis_addr holds */
    memcpy(buf, "MOVED 1 ", 8);
    memset(buf + 8, 'a', REDIS_URL_HOST_MAX - 1);
    strcpy(buf + 8 + REDIS_URL_HOST_MAX - 1, ":7000");
    CHECK_EQ_INT(redirect(buf, &r), 0);
    CHECK_EQ_INT(strlen(r.addr.host), REDIS_URL_HOST_MAX - 1);
}

static void test_redirect_refused(void)
{
    static const char *const bad[] = {
        "",
        "MOVED",
        "MOVED ",
        "MOVEDX 1 h:1",
        "MOVED 1",
        "MOVED 1 ",
        "MOVED abc h:1",
        "MOVED -1 h:1",
        "MOVED +1 h:1",
        "MOVED  1 h:1",
        "MOVED 16384 h:1",
        "MOVED 99999999999999999999999 h:1", /* would overflow */
        "MOVED 4294983680 h:1",              /* 16384 modulo 2^32 */
        "MOVED 1 h:0",
        "MOVED 1 h:65536",
        "MOVED 1 h:70000",
        "MOVED 1 h:99999999999999999999",
        "MOVED 1 h:",
        "MOVED 1 h",
        "MOVED 1 h:-1",
        "MOVED 1 h:7000 ",
        "MOVED 1 h:7000 x",
        "MOVED 1 h:7000\r\n",
        "MOVED 1 h x:7000",
        "MOVED 1 h\tx:7000",
        "MOVED 1 caf\xc3\xa9:7000",
        "MOVED 1 []:7000",
        "MOVED 1 [::1:7000",
        "MOVED 1 ::1]:7000",
        "MOVED 1 [[::1]]:7000",
        "MOVED 1 ?:7000", /* Redis 7 announcing a hostname it was not given */
        "MOVED 1 [?]:7000",
        "moved 1 h:7000",
        "ASK",
        "ASK 1",
        "ASKX 1 h:1",
        "ERR unknown command",
        "MOVED\t1 h:1",
    };
    struct redis_redirect r, before;
    char buf[300];

    memset(&before, 0xa5, sizeof(before));
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        memcpy(&r, &before, sizeof(r));
        CHECK_EQ_INT(redirect(bad[i], &r), -EINVAL);
        if (memcmp(&r, &before, sizeof(r)) != 0)
            fprintf(stderr, "touched by \"%s\"\n", bad[i]);
        CHECK(memcmp(&r, &before, sizeof(r)) == 0);
    }
    memcpy(&r, &before, sizeof(r));
    /* a NUL inside, an empty host with no or an empty self host */
    CHECK_EQ_INT(redis_redirect_parse("MOVED 1 h\0x:7000", 16, "s", &r), -EINVAL);
    CHECK_EQ_INT(redis_redirect_parse("MOVED 1 :7000", 13, NULL, &r), -EINVAL);
    CHECK_EQ_INT(redis_redirect_parse("MOVED 1 :7000", 13, "", &r), -EINVAL);
    CHECK_EQ_INT(redis_redirect_parse(NULL, 0, "s", &r), -EINVAL);
    /* a host one byte too long, and a self host too long */
    memcpy(buf, "MOVED 1 ", 8);
    memset(buf + 8, 'a', REDIS_URL_HOST_MAX);
    strcpy(buf + 8 + REDIS_URL_HOST_MAX, ":7000");
    CHECK_EQ_INT(redirect(buf, &r), -EINVAL);
    CHECK_EQ_INT(redis_redirect_parse("MOVED 1 :7000", 13, buf + 8, &r), -EINVAL);
    CHECK(memcmp(&r, &before, sizeof(r)) == 0);
}

/* Replies built as hiredis builds them (calloc'ed), freed by reply_free(). */

static redisReply *reply_new(int type)
{
    redisReply *r = calloc(1, sizeof(*r));

    if (!r)
        abort();
    r->type = type;
    return r;
}

static redisReply *reply_int(long long v)
{
    redisReply *r = reply_new(REDIS_REPLY_INTEGER);

    r->integer = v;
    return r;
}

static redisReply *reply_bytes(int type, const char *s, size_t len)
{
    redisReply *r = reply_new(type);

    r->str = malloc(len + 1);
    if (!r->str)
        abort();
    memcpy(r->str, s, len);
    r->str[len] = '\0';
    r->len = len;
    return r;
}

static redisReply *reply_str(const char *s)
{
    return reply_bytes(REDIS_REPLY_STRING, s, strlen(s));
}

/* An array (or another aggregate <type>) of <n> replies. */
static redisReply *reply_agg(int type, size_t n, ...)
{
    redisReply *r = reply_new(type);
    va_list ap;

    r->elements = n;
    r->element = calloc(n ? n : 1, sizeof(*r->element));
    if (!r->element)
        abort();
    va_start(ap, n);
    for (size_t i = 0; i < n; i++)
        r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}

#define ARR(...) reply_agg(REDIS_REPLY_ARRAY, ARG_COUNT(__VA_ARGS__), __VA_ARGS__)
#define ARG_COUNT(...) (sizeof((redisReply *[]){ __VA_ARGS__ }) / sizeof(redisReply *))
#define EMPTY_ARR() reply_agg(REDIS_REPLY_ARRAY, 0)

static void reply_free(redisReply *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->elements; i++)
        reply_free(r->element[i]);
    free(r->element);
    free(r->str);
    free(r);
}

/* A node of a Redis 6 reply: [host, port, id]. */
static redisReply *node(const char *host, long long port, const char *id)
{
    return ARR(reply_str(host), reply_int(port), reply_str(id));
}

static void test_slots_three_masters(void)
{
    redisReply *r = ARR(ARR(reply_int(0), reply_int(5460), node("10.0.0.1", 7000, "aaa"),
                            node("10.0.0.4", 7003, "ddd")),
                        ARR(reply_int(5461), reply_int(10922), node("10.0.0.2", 7001, "bbb"),
                            node("10.0.0.5", 7004, "eee"), node("10.0.0.7", 7006, "ggg")),
                        ARR(reply_int(10923), reply_int(16383), node("10.0.0.3", 7002, "ccc")));
    struct redis_slot_range *v = NULL;

    CHECK_EQ_INT(redis_cluster_slots_parse(r, "10.0.0.9", &v), 3);
    CHECK(v != NULL);
    if (v) {
        CHECK_EQ_INT(v[0].first, 0);
        CHECK_EQ_INT(v[0].last, 5460);
        CHECK_EQ_STR(v[0].master.host, "10.0.0.1");
        CHECK_EQ_INT(v[0].master.port, 7000);
        CHECK_EQ_INT(v[1].first, 5461);
        CHECK_EQ_INT(v[1].last, 10922);
        CHECK_EQ_STR(v[1].master.host, "10.0.0.2");
        CHECK_EQ_INT(v[1].master.port, 7001);
        CHECK_EQ_INT(v[2].first, 10923);
        CHECK_EQ_INT(v[2].last, 16383);
        CHECK_EQ_STR(v[2].master.host, "10.0.0.3");
        CHECK_EQ_INT(v[2].master.port, 7002);
    }
    free(v);
    reply_free(r);

    /* Redis 3-era nodes without an id; a one-slot range */
    r = ARR(ARR(reply_int(7), reply_int(7), ARR(reply_str("h"), reply_int(1))));
    v = NULL;
    CHECK_EQ_INT(redis_cluster_slots_parse(r, NULL, &v), 1);
    CHECK(v && v[0].first == 7 && v[0].last == 7 && v[0].master.port == 1);
    free(v);
    reply_free(r);
}

/* Redis 7's nodes: [endpoint, port, id, {metadata}], the map an array in RESP2. */
static void test_slots_redis7(void)
{
    redisReply *r =
        ARR(ARR(reply_int(0), reply_int(100),
                ARR(reply_str("node1.example"), reply_int(6379), reply_str("id1"),
                    ARR(reply_str("ip"), reply_str("10.0.0.1"))),
                ARR(reply_str("node2.example"), reply_int(6380), reply_str("id2"), EMPTY_ARR())),
            ARR(reply_int(101), reply_int(200),
                ARR(reply_str("2001:db8::7"), reply_int(6381), reply_str("id3"),
                    reply_agg(REPLY_MAP, 2, reply_str("hostname"), reply_str("n3")), reply_int(1),
                    reply_new(REDIS_REPLY_NIL))));
    struct redis_slot_range *v = NULL;

    CHECK_EQ_INT(redis_cluster_slots_parse(r, "self", &v), 2);
    CHECK(v != NULL);
    if (v) {
        CHECK_EQ_STR(v[0].master.host, "node1.example");
        CHECK_EQ_INT(v[0].master.port, 6379);
        CHECK_EQ_STR(v[1].master.host, "2001:db8::7");
        CHECK_EQ_INT(v[1].first, 101);
        CHECK_EQ_INT(v[1].last, 200);
    }
    free(v);
    reply_free(r);
}

static void test_slots_self_and_unknown_hosts(void)
{
    /* "": the node does not know its address; nil: unknown-endpoint; "?": unusable */
    redisReply *r = ARR(ARR(reply_int(0), reply_int(9), node("", 7000, "a")),
                        ARR(reply_int(10), reply_int(19), node("?", 7001, "b")),
                        ARR(reply_int(20), reply_int(29),
                            ARR(reply_new(REDIS_REPLY_NIL), reply_int(7002), reply_str("c")),
                            node("?", 7005, "r")),
                        ARR(reply_int(30), reply_int(39), node("[::1]", 7003, "d")));
    struct redis_slot_range *v = NULL;

    CHECK_EQ_INT(redis_cluster_slots_parse(r, "seed.example", &v), 3);
    CHECK(v != NULL);
    if (v) {
        CHECK_EQ_INT(v[0].first, 0);
        CHECK_EQ_STR(v[0].master.host, "seed.example");
        CHECK_EQ_INT(v[0].master.port, 7000);
        CHECK_EQ_INT(v[1].first, 20); /* 10-19 left out */
        CHECK_EQ_STR(v[1].master.host, "seed.example");
        CHECK_EQ_INT(v[1].master.port, 7002);
        CHECK_EQ_INT(v[2].first, 30);
        CHECK_EQ_STR(v[2].master.host, "::1");
    }
    free(v);
    reply_free(r);

    /* only unknown masters, and no slot assigned at all: 0 ranges and NULL */
    r = ARR(ARR(reply_int(0), reply_int(16383), node("?", 7000, "a")));
    v = (struct redis_slot_range *)&v;
    CHECK_EQ_INT(redis_cluster_slots_parse(r, "s", &v), 0);
    CHECK(v == NULL);
    reply_free(r);
    r = EMPTY_ARR();
    v = (struct redis_slot_range *)&v;
    CHECK_EQ_INT(redis_cluster_slots_parse(r, "s", &v), 0);
    CHECK(v == NULL);
    reply_free(r);
}

/* The range [<first>, <last>, <master>]. */
static redisReply *range_with(long long first, long long last, redisReply *master)
{
    return ARR(reply_int(first), reply_int(last), master);
}

/* Checks that <r> is refused and <ret> left alone, and frees <r>. */
static void check_refused(redisReply *r, const char *self_host, int line)
{
    struct redis_slot_range *v = (struct redis_slot_range *)&line;
    int got = redis_cluster_slots_parse(r, self_host, &v);

    if (got != -EPROTO || v != (struct redis_slot_range *)&line)
        fprintf(stderr, "line %d: a malformed reply returned %d\n", line, got);
    CHECK_EQ_INT(got, -EPROTO);
    CHECK(v == (struct redis_slot_range *)&line);
    reply_free(r);
}

#define REFUSED(r) check_refused((r), "self", __LINE__)

static void test_slots_refused(void)
{
    char longhost[REDIS_URL_HOST_MAX + 1];

    memset(longhost, 'a', REDIS_URL_HOST_MAX);
    longhost[REDIS_URL_HOST_MAX] = '\0';
    REFUSED(NULL);
    /* not an array */
    REFUSED(reply_str("0 16383"));
    REFUSED(reply_int(0));
    REFUSED(reply_new(REDIS_REPLY_NIL));
    REFUSED(reply_bytes(REDIS_REPLY_ERROR, "ERR cluster support disabled", 28));
    REFUSED(reply_agg(REPLY_MAP, 0));
    /* a range of another shape */
    REFUSED(ARR(reply_int(0)));
    REFUSED(ARR(EMPTY_ARR()));
    REFUSED(ARR(ARR(reply_int(0), reply_int(100))));
    REFUSED(ARR(reply_agg(REPLY_MAP, 3, reply_int(0), reply_int(1), node("h", 1, "i"))));
    REFUSED(ARR(ARR(reply_str("0"), reply_int(100), node("h", 1, "i"))));
    REFUSED(ARR(ARR(reply_int(0), reply_new(REDIS_REPLY_NIL), node("h", 1, "i"))));
    /* slots */
    REFUSED(ARR(range_with(5, 4, node("h", 1, "i"))));
    REFUSED(ARR(range_with(0, 16384, node("h", 1, "i"))));
    REFUSED(ARR(range_with(16384, 16384, node("h", 1, "i"))));
    REFUSED(ARR(range_with(-1, 5, node("h", 1, "i"))));
    REFUSED(ARR(range_with(0, -5, node("h", 1, "i"))));
    REFUSED(ARR(range_with(0, 4294967296 + 5, node("h", 1, "i"))));
    REFUSED(ARR(range_with(LLONG_MIN, 5, node("h", 1, "i"))));
    /* ports */
    REFUSED(ARR(range_with(0, 1, node("h", 0, "i"))));
    REFUSED(ARR(range_with(0, 1, node("h", 65536, "i"))));
    REFUSED(ARR(range_with(0, 1, node("h", 70000, "i"))));
    REFUSED(ARR(range_with(0, 1, node("h", -1, "i"))));
    REFUSED(ARR(range_with(0, 1, node("h", 4294967296 + 7000, "i"))));
    REFUSED(ARR(range_with(0, 1, ARR(reply_str("h"), reply_str("7000")))));
    /* hosts */
    REFUSED(ARR(range_with(0, 1, ARR(reply_int(1), reply_int(7000)))));
    REFUSED(ARR(range_with(0, 1, ARR(EMPTY_ARR(), reply_int(7000)))));
    REFUSED(ARR(range_with(0, 1, ARR(reply_bytes(REDIS_REPLY_STATUS, "h", 1), reply_int(1)))));
    REFUSED(ARR(range_with(0, 1, node(longhost, 7000, "i"))));
    REFUSED(ARR(range_with(0, 1, node("a b", 7000, "i"))));
    REFUSED(ARR(range_with(0, 1, node("[]", 7000, "i"))));
    REFUSED(ARR(range_with(0, 1, node("[?]", 7000, "i"))));
    REFUSED(ARR(range_with(0, 1, ARR(reply_bytes(REDIS_REPLY_STRING, "h\0x", 3), reply_int(1)))));
    check_refused(ARR(range_with(0, 1, node("", 7000, "i"))), NULL, __LINE__);
    check_refused(ARR(range_with(0, 1, node("", 7000, "i"))), longhost, __LINE__);
    /* nodes */
    REFUSED(ARR(range_with(0, 1, reply_str("h:7000"))));
    REFUSED(ARR(range_with(0, 1, ARR(reply_str("h")))));
    REFUSED(ARR(range_with(0, 1, EMPTY_ARR())));
    REFUSED(ARR(range_with(0, 1, reply_new(REDIS_REPLY_NIL))));
    /* a bad replica, or a bad range after good ones (nothing leaks) */
    REFUSED(ARR(ARR(reply_int(0), reply_int(1), node("h", 1, "i"), node("r", 0, "j"))));
    REFUSED(ARR(ARR(reply_int(0), reply_int(1), node("h", 1, "i"), reply_int(5))));
    REFUSED(ARR(ARR(reply_int(0), reply_int(1), node("?", 1, "i"), node("r", 1, "j"),
                    ARR(reply_int(1), reply_int(7000)))));
    REFUSED(ARR(range_with(0, 1, node("h", 1, "i")), range_with(2, 3, node("h", 2, "i")),
                range_with(9, 8, node("h", 3, "i"))));
}

/* REDIS_CLUSTER_MAX_RANGES ranges are read, one more is refused. */
static void test_slots_limit(void)
{
    redisReply *one = range_with(0, 0, node("h", 1, "i"));
    redisReply *r = reply_new(REDIS_REPLY_ARRAY);
    struct redis_slot_range *v = NULL;

    r->element = calloc(REDIS_CLUSTER_MAX_RANGES + 1, sizeof(*r->element));
    if (!r->element)
        abort();
    for (size_t i = 0; i <= REDIS_CLUSTER_MAX_RANGES; i++)
        r->element[i] = one; /* the same one: overlaps are not the parser's business */
    r->elements = REDIS_CLUSTER_MAX_RANGES;
    CHECK_EQ_INT(redis_cluster_slots_parse(r, "s", &v), REDIS_CLUSTER_MAX_RANGES);
    CHECK(v && v[REDIS_CLUSTER_MAX_RANGES - 1].master.port == 1);
    free(v);
    v = (struct redis_slot_range *)&v;
    r->elements = REDIS_CLUSTER_MAX_RANGES + 1;
    CHECK_EQ_INT(redis_cluster_slots_parse(r, "s", &v), -EPROTO);
    CHECK(v == (struct redis_slot_range *)&v);
    free(r->element);
    free(r);
    reply_free(one);
}

TEST_MAIN(test_crc16, test_key_slot, test_redirect, test_redirect_refused, test_slots_three_masters,
          test_slots_redis7, test_slots_self_and_unknown_hosts, test_slots_refused,
          test_slots_limit)
