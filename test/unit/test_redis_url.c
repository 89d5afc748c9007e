/* SPDX-License-Identifier: MIT */
/* Redis URLs (doc/stores.md, Pointing idemproxy at Redis): pure logic, tested
 * without a Redis. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "idemproxy/redis_url.h"

static void test_redis_url_server(void)
{
    struct redis_url u;
    char why[200];

    CHECK_EQ_INT(redis_url_parse("redis://localhost", &u, why, sizeof(why)), 0);
    CHECK_EQ_INT(u.kind, REDIS_URL_SERVER);
    CHECK(!u.tls);
    CHECK_EQ_INT(u.nhosts, 1);
    CHECK_EQ_STR(u.hosts[0].host, "localhost");
    CHECK_EQ_INT(u.hosts[0].port, 6379);
    CHECK_EQ_INT(u.db, 0);
    CHECK(u.user == NULL && u.password == NULL && u.master == NULL);
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("rediss://127.0.0.1:6380/3", &u, why, sizeof(why)), 0);
    CHECK(u.tls);
    CHECK_EQ_STR(u.hosts[0].host, "127.0.0.1");
    CHECK_EQ_INT(u.hosts[0].port, 6380);
    CHECK_EQ_INT(u.db, 3);
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("redis://:s3cret@h:1/", &u, why, sizeof(why)), 0);
    CHECK(u.user == NULL);
    CHECK_EQ_STR(u.password, "s3cret");
    CHECK_EQ_INT(u.hosts[0].port, 1);
    redis_url_done(&u);

    /* an ACL user; a password with an encoded '@' and a bare '/', an IPv6 host */
    CHECK_EQ_INT(redis_url_parse("REDISS://app:p%40ss:w/rd@[::1]:7000/15", &u, why, sizeof(why)),
                 0);
    CHECK(u.tls);
    CHECK_EQ_STR(u.user, "app");
    CHECK_EQ_STR(u.password, "p@ss:w/rd");
    CHECK_EQ_STR(u.hosts[0].host, "::1");
    CHECK_EQ_INT(u.hosts[0].port, 7000);
    CHECK_EQ_INT(u.db, 15);
    redis_url_done(&u);

    /* the last '@' ends the user info: a bare '@' or '?' in the password */
    CHECK_EQ_INT(redis_url_parse("redis://u:a@b?c@h", &u, why, sizeof(why)), 0);
    CHECK_EQ_STR(u.password, "a@b?c");
    CHECK_EQ_STR(u.hosts[0].host, "h");
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("redis://app@h", &u, why, sizeof(why)), 0);
    CHECK_EQ_STR(u.user, "app"); /* an ACL user, as redis-py and node-redis read it */
    CHECK(u.password == NULL);
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("redis://:onlypass@h", &u, why, sizeof(why)), 0);
    CHECK(u.user == NULL); /* the password alone */
    CHECK_EQ_STR(u.password, "onlypass");
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("redis://user:@h", &u, why, sizeof(why)), 0);
    CHECK_EQ_STR(u.user, "user");
    CHECK(u.password == NULL);
    redis_url_done(&u);
}

static void test_redis_url_seeds_and_sentinel(void)
{
    struct redis_url u;
    char why[200];

    CHECK_EQ_INT(redis_url_parse("redis://a:7000,b,[::1]:7002", &u, why, sizeof(why)), 0);
    CHECK_EQ_INT(u.kind, REDIS_URL_SEEDS);
    CHECK_EQ_INT(u.nhosts, 3);
    CHECK_EQ_STR(u.hosts[0].host, "a");
    CHECK_EQ_INT(u.hosts[0].port, 7000);
    CHECK_EQ_STR(u.hosts[1].host, "b");
    CHECK_EQ_INT(u.hosts[1].port, 6379);
    CHECK_EQ_STR(u.hosts[2].host, "::1");
    redis_url_done(&u);

    CHECK_EQ_INT(
        redis_url_parse("redis-sentinel://s1,s2:26380/2?master=mymaster", &u, why, sizeof(why)), 0);
    CHECK_EQ_INT(u.kind, REDIS_URL_SENTINEL);
    CHECK(!u.tls);
    CHECK_EQ_INT(u.nhosts, 2);
    CHECK_EQ_INT(u.hosts[0].port, 26379); /* a sentinel's default port */
    CHECK_EQ_INT(u.hosts[1].port, 26380);
    CHECK_EQ_INT(u.db, 2);
    CHECK_EQ_STR(u.master, "mymaster");
    CHECK(u.sentinel_user == NULL && u.sentinel_password == NULL);
    redis_url_done(&u);

    CHECK_EQ_INT(redis_url_parse("rediss-sentinel://app:pw@s1?master=m%2F1&sentinel_user=sen"
                                 "&sentinel_password=x@y%26z",
                                 &u, why, sizeof(why)),
                 0);
    CHECK(u.tls);
    CHECK_EQ_STR(u.user, "app");
    CHECK_EQ_STR(u.password, "pw");
    CHECK_EQ_STR(u.hosts[0].host, "s1");
    CHECK_EQ_STR(u.master, "m/1");
    CHECK_EQ_STR(u.sentinel_user, "sen");
    CHECK_EQ_STR(u.sentinel_password, "x@y&z");
    redis_url_done(&u);

    /* a sentinel password in the query, none in the user info */
    CHECK_EQ_INT(
        redis_url_parse("redis-sentinel://s1?master=m&sentinel_password=a@b", &u, why, sizeof(why)),
        0);
    CHECK(u.password == NULL);
    CHECK_EQ_STR(u.hosts[0].host, "s1");
    CHECK_EQ_STR(u.sentinel_password, "a@b");
    redis_url_done(&u);
}

static void test_redis_url_refused_with_a_reason(void)
{
    static const struct {
        const char *url, *why;
    } bad[] = {
        { "", "scheme" },
        { "http://h", "scheme" },
        { "redis:/h", "scheme" },
        { "redis://", "host is missing" },
        { "redis:///0", "host is missing" },
        { "redis://:pw@", "host is missing" },
        { "redis://:pw@:6379", "host is missing" },
        { "redis://h:", "no port" },
        { "redis://h:0", "1 to 65535" },
        { "redis://h:65536", "1 to 65535" },
        { "redis://h:99999999999", "1 to 65535" },
        { "redis://h:6x", "1 to 65535" },
        { "redis://h:-1", "1 to 65535" },
        { "redis://h/x", "/DB" },
        { "redis://h/-1", "/DB" },
        { "redis://h/2147483648", "/DB" },
        { "redis://h/1/2", "/DB" },
        { "redis://h?db=1", "query" },
        { "redis://h#x", "fragment" },
        { "redis://h h", "space" },
        { "redis://h\x01", "control" },
        { "redis://[::1", "']'" },
        { "redis://[::1]x", "':PORT'" },
        { "redis://[zz]", "IPv6" },
        { "redis://h_!", "host name" },
        { "redis://a,", "after the last ','" },
        { "redis://,a", "host is missing" },
        { "redis://:%zz@h", "%-escape" },
        { "redis://:%4@h", "%-escape" },
        { "redis://:%00@h", "%00" },
        { "redis-sentinel://s1", "?master=NAME" },
        { "redis-sentinel://s1?master=", "empty" },
        { "redis-sentinel://s1?master=a&master=b", "twice" },
        { "redis-sentinel://s1?master=a&db=1", "unknown query parameter 'db'" },
        { "redis-sentinel://s1?master", "no value" },
        { "redis-sentinel://s1?master=a%zz", "%-escape" },
        { "redis://a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", "more than 16" },
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct redis_url u = { .nhosts = 99 };
        char why[200];
        int r = redis_url_parse(bad[i].url, &u, why, sizeof(why));

        if (r != -EINVAL || !strstr(why, bad[i].why))
            fprintf(stderr, "  url %s: %d '%s' (wanted '%s')\n", bad[i].url, r, why, bad[i].why);
        CHECK_EQ_INT(r, -EINVAL);
        CHECK(strstr(why, bad[i].why) != NULL);
        CHECK_EQ_INT(u.nhosts, 99); /* untouched */
    }
    CHECK_EQ_INT(redis_url_parse(NULL, &(struct redis_url){ 0 }, NULL, 0), -EINVAL);
}

static void test_redis_url_redact(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "redis://h:6379/0", "redis://h:6379/0" },
        { "redis://:s3cret@h", "redis://:***@h" },
        { "redis://app:s3cret@h", "redis://app:***@h" },
        { "redis://app@h", "redis://app@h" },      /* a user alone: no secret */
        { "redis://app:@h", "redis://app:***@h" }, /* an empty password: still masked */
        { "redis://@h", "redis://@h" },
        { "redis://u:a@b?c@h:1/2", "redis://u:***@h:1/2" },
        { "rediss-sentinel://app:pw@s1,s2?master=m&sentinel_password=x@y&sentinel_user=u",
          "rediss-sentinel://app:***@s1,s2?master=m&sentinel_password=***&sentinel_user=u" },
        { "redis-sentinel://s1?sentinel_password=p@q&master=m",
          "redis-sentinel://s1?sentinel_password=***&master=m" },
        { "not a url", "not a url" },
    };
    char out[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redis_url_redact(cases[i].in, out, sizeof(out));
        CHECK_EQ_STR(out, cases[i].out);
    }
    /* truncated, still terminated, and the password is never partly shown */
    redis_url_redact("redis://user:verysecret@host", out, 16);
    CHECK_EQ_STR(out, "redis://user:**");
    CHECK(strstr(out, "very") == NULL);
}

static void test_redis_addr_format(void)
{
    char out[64];

    redis_addr_format(&(struct redis_addr){ .host = "10.0.0.1", .port = 6379 }, out, sizeof(out));
    CHECK_EQ_STR(out, "10.0.0.1:6379");
    redis_addr_format(&(struct redis_addr){ .host = "::1", .port = 7000 }, out, sizeof(out));
    CHECK_EQ_STR(out, "[::1]:7000");
}

TEST_MAIN(test_redis_url_server, test_redis_url_seeds_and_sentinel,
          test_redis_url_refused_with_a_reason, test_redis_url_redact, test_redis_addr_format)
