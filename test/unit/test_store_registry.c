/* SPDX-License-Identifier: MIT */
/* The store registry's URL side (store_registry.h): each scheme checked and
 * shown by its store, the rest refused with the schemes listed and shown
 * without anything a password could hide in. */
#include "idemproxy/store_registry.h"

#include <string.h>

#include "check.h"

static void test_store_registry_checks_by_scheme(void)
{
    char why[512];

    CHECK_EQ_INT(store_registry_check_url("redis://127.0.0.1:6379/2", why, sizeof(why)), 0);
    CHECK_EQ_INT(store_registry_check_url("rediss-sentinel://h:26379?master=m", why, sizeof(why)),
                 0);
    CHECK_EQ_INT(store_registry_check_url("postgresql://u@h/db", why, sizeof(why)), 0);
    CHECK_EQ_INT(store_registry_check_url("redis://h:1/x", why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "/DB") != NULL); /* the Redis store's own reason */
    CHECK_EQ_INT(store_registry_check_url("postgresq://u@h/db", why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "postgresql://, postgres://, redis://, rediss://, redis-sentinel:// or "
                      "rediss-sentinel://") != NULL);
    CHECK_EQ_INT(store_registry_check_url("127.0.0.1:6379", NULL, 0), -EINVAL);
}

static void test_store_registry_redacts(void)
{
    static const char *const leaky[] = {
        "reddis://:pa/ss@h", "reddis://:p?ss@h",   "reddis://:p@ss@h",
        "redis:/:pw@h",      "u:pw@h/?n=http://x", "postgresq://h/db?password=pw",
    };
    char out[256];

    store_registry_redact_url("redis://:s3cret@h:6379/0", out, sizeof(out));
    CHECK(strstr(out, "s3cret") == NULL && strstr(out, "h:6379") != NULL);
    store_registry_redact_url("postgresql://u:s3cret@h/db?sslpassword=s3cret", out, sizeof(out));
    CHECK(strstr(out, "s3cret") == NULL && strstr(out, "@h/db") != NULL);
    for (size_t i = 0; i < ARRAY_SIZE(leaky); i++) {
        store_registry_redact_url(leaky[i], out, sizeof(out));
        CHECK(strstr(out, "pw") == NULL && strstr(out, "ss") == NULL);
    }
    store_registry_redact_url("reddis://:pa/ss@h", out, sizeof(out));
    CHECK_EQ_STR(out, "reddis://***");
    store_registry_redact_url("http://x:1/p", out, sizeof(out)); /* nowhere to hide one */
    CHECK_EQ_STR(out, "http://x:1/p");
    store_registry_redact_url("u:p@x", out, sizeof(out));
    CHECK_EQ_STR(out, "***");
}

static void test_store_registry_forms_name_every_store(void)
{
    char out[512];

    store_registry_forms(out, sizeof(out));
    CHECK(strncmp(out, "use postgresql://", 17) == 0);
    CHECK(strstr(out, "or a Redis URL: redis://") != NULL);
}

TEST_MAIN(test_store_registry_checks_by_scheme, test_store_registry_redacts,
          test_store_registry_forms_name_every_store)
