/* SPDX-License-Identifier: MIT */
/* The redis:// URL parser: pure logic, tested without a Redis. */
#include <stdlib.h>

#include "check.h"
#include "idemproxy/store_redis.h"

static void url_free(struct store_redis_url *u)
{
    free(u->password);
    u->password = NULL;
}

static void test_redis_parse_url(void)
{
    struct store_redis_url u = { .port = 1, .db = 7 };

    CHECK_EQ_INT(store_redis_parse_url("redis://localhost", &u), 0);
    CHECK_EQ_STR(u.host, "localhost");
    CHECK_EQ_INT(u.port, 6379);
    CHECK_EQ_INT(u.db, 0);
    CHECK(u.password == NULL);

    CHECK_EQ_INT(store_redis_parse_url("redis://127.0.0.1:6380/3", &u), 0);
    CHECK_EQ_STR(u.host, "127.0.0.1");
    CHECK_EQ_INT(u.port, 6380);
    CHECK_EQ_INT(u.db, 3);
    CHECK(u.password == NULL);

    CHECK_EQ_INT(store_redis_parse_url("redis://:s3cret@h:1/", &u), 0);
    CHECK_EQ_STR(u.host, "h");
    CHECK_EQ_INT(u.port, 1);
    CHECK_EQ_INT(u.db, 0);
    CHECK_EQ_STR(u.password, "s3cret");
    url_free(&u);

    CHECK_EQ_INT(store_redis_parse_url("REDIS://user:p%40ss:w/rd@[::1]:7000/15", &u), 0);
    CHECK_EQ_STR(u.host, "::1");
    CHECK_EQ_INT(u.port, 7000);
    CHECK_EQ_INT(u.db, 15);
    CHECK_EQ_STR(u.password, "p@ss:w/rd"); /* the user ignored */
    url_free(&u);

    CHECK_EQ_INT(store_redis_parse_url("redis://onlypass@h", &u), 0); /* as redis-cli reads it */
    CHECK_EQ_STR(u.password, "onlypass");
    url_free(&u);
    CHECK_EQ_INT(store_redis_parse_url("redis://user:@h", &u), 0);
    CHECK(u.password == NULL);

    u = (struct store_redis_url){ .port = 42, .db = 9 };
    static const char *const bad[] = {
        NULL,
        "",
        "redis://",
        "redis:///0",
        "redis://:pw@",
        "redis://:pw@:6379",
        "rediss://h",
        "http://h:6379",
        "unix:///tmp/redis.sock",
        "h:6379",
        "redis:/h",
        "redis://h:",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:99999999999",
        "redis://h:6x",
        "redis://h:-1",
        "redis://h/x",
        "redis://h/-1",
        "redis://h/2147483648",
        "redis://h/1/2",
        "redis://h?db=1",
        "redis://h#x",
        "redis://h h",
        "redis://[::1",
        "redis://[::1]x",
        "redis://[zz]",
        "redis://:%zz@h",
        "redis://:%4@h",
        "redis://:%00@h",
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        int r = store_redis_parse_url(bad[i], &u);

        if (r != -EINVAL)
            fprintf(stderr, "accepted: %s\n", bad[i] ? bad[i] : "(null)");
        CHECK_EQ_INT(r, -EINVAL);
    }
    CHECK_EQ_INT(u.port, 42); /* untouched on failure */
    CHECK_EQ_INT(u.db, 9);
    CHECK(u.password == NULL);
}

TEST_MAIN(test_redis_parse_url)
