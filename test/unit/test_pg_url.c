/* SPDX-License-Identifier: MIT */
/* PostgreSQL URLs (doc/stores.md, PostgreSQL): pure logic, tested without a server. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "idemproxy/pg_url.h"

static void test_pg_url_is_and_check(void)
{
    char why[200];

    CHECK(pg_url_is("postgresql://h/db") && pg_url_is("POSTGRES://h/db"));
    CHECK(!pg_url_is("redis://h") && !pg_url_is("postgresq://h") && !pg_url_is(NULL));
    CHECK_EQ_INT(pg_url_check("postgresql://app@h1:5432,h2:5433/pay?sslmode=verify-full"
                              "&sslrootcert=/etc/ca.crt&target_session_attrs=read-write",
                              why, sizeof(why)),
                 0);
    CHECK_EQ_INT(pg_url_check("postgresql://h/db?nosuch=1", why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "nosuch") != NULL && strchr(why, '\n') == NULL);
    CHECK_EQ_INT(pg_url_check("redis://h", why, sizeof(why)), -EINVAL);
    CHECK_EQ_INT(pg_url_check("postgresql://h/db?sslmode=sometimes", why, sizeof(why)), 0);
}

static void test_pg_url_redact(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "postgresql://app:s3cret@h/db", "postgresql://app:***@h/db" },
        { "postgresql://app@h/db", "postgresql://app@h/db" },
        { "postgresql://app:p@ss@h1,h2/db?x=1", "postgresql://app:***@h1,h2/db?x=1" },
        { "postgres://h/db?password=pw&sslmode=require",
          "postgres://h/db?password=***&sslmode=require" },
        { "postgresql://h/db?sslmode=require&sslpassword=k",
          "postgresql://h/db?sslmode=require&sslpassword=***" },
        { "postgresql://app:@h", "postgresql://app:***@h" },
        { "postgresql://h?password=a&password=b", "postgresql://h?password=***&password=***" },
    };
    char out[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pg_url_redact(cases[i].in, out, sizeof(out));
        CHECK_EQ_STR(out, cases[i].out);
    }
    pg_url_redact("postgresql://user:verysecret@host", out, 24);
    CHECK(strstr(out, "very") == NULL);
}

static void test_pg_url_hosts(void)
{
    struct pg_url_hosts h;

    CHECK_EQ_INT(pg_url_hosts("postgresql://app@db1.example:5433,10.0.0.2,[::1]:6000/pay", &h), 0);
    CHECK_EQ_INT(h.n, 3);
    CHECK_EQ_STR(h.host[0], "db1.example");
    CHECK_EQ_STR(h.port[0], "5433");
    CHECK_EQ_STR(h.host[1], "10.0.0.2");
    CHECK_EQ_STR(h.port[1], "");
    CHECK_EQ_STR(h.host[2], "::1");
    CHECK_EQ_STR(h.port[2], "6000");
    CHECK(!h.hostaddr);
    CHECK(pg_url_host_is_name(h.host[0]) && !pg_url_host_is_name(h.host[1]) &&
          !pg_url_host_is_name(h.host[2]));
    CHECK(!pg_url_host_is_name("/var/run/postgresql") && !pg_url_host_is_name(""));
    /* one port for every host */
    CHECK_EQ_INT(pg_url_hosts("postgresql://a,b/db?port=7000", &h), 0);
    CHECK_EQ_INT(h.n, 2);
    CHECK_EQ_STR(h.port[1], "7000");
    CHECK_EQ_INT(pg_url_hosts("postgresql:///db?host=/tmp&hostaddr=127.0.0.1", &h), 0);
    CHECK(h.hostaddr);
    CHECK_EQ_INT(pg_url_hosts("postgresql://h/db?nosuch=1", &h), -EINVAL);
}

static void test_pg_text_escape(void)
{
    char out[32];

    CHECK_EQ_INT(pg_text_escape("POST /a?x=%41", 13, out, sizeof(out)), 13);
    CHECK_EQ_STR(out, "POST /a?x=%41");
    CHECK_EQ_INT(pg_text_escape("a\xff"
                                "\x00"
                                "b\n",
                                5, out, sizeof(out)),
                 11);
    CHECK_EQ_STR(out, "a%FF%00b%0A");
    /* cut before a form that would not fit, never inside one */
    CHECK_EQ_INT(pg_text_escape("ab\xff"
                                "c",
                                4, out, 5),
                 2);
    CHECK_EQ_STR(out, "ab");
    CHECK_EQ_INT(pg_text_escape("abc", 3, out, 1), 0);
    CHECK_EQ_STR(out, "");
}

TEST_MAIN(test_pg_url_is_and_check, test_pg_url_redact, test_pg_url_hosts, test_pg_text_escape)
