/* SPDX-License-Identifier: MIT */
/* Who may use /keys: the bearer token, or a loopback admin address. The
 * integration suite drives the listener itself (test_trust_boundary.py); a
 * non-loopback address cannot be listened on in the tests, so the decision
 * is checked here. */
#include "check.h"
#include "idemproxy/admin.h"
#include "idemproxy/config.h"

static void test_admin_keys_access_with_token(void)
{
    const char *tok = "s3cr3t-Token_01";

    CHECK(admin_keys_access(tok, true, "Bearer s3cr3t-Token_01") == ADMIN_ACCESS_ALLOWED);
    CHECK(admin_keys_access(tok, false, "Bearer s3cr3t-Token_01") == ADMIN_ACCESS_ALLOWED);
    CHECK(admin_keys_access(tok, false, "bearer s3cr3t-Token_01") == ADMIN_ACCESS_ALLOWED);
    /* a token configured is required even on loopback */
    CHECK(admin_keys_access(tok, true, NULL) == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer ") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer s3cr3t-Token_0") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer s3cr3t-Token_012") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer S3CR3T-TOKEN_01") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Basic s3cr3t-Token_01") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "s3cr3t-Token_01") == ADMIN_ACCESS_UNAUTHORIZED);
    CHECK(admin_keys_access(tok, true, "Bearer  s3cr3t-Token_01") == ADMIN_ACCESS_UNAUTHORIZED);
}

static void test_admin_keys_access_without_token(void)
{
    CHECK(admin_keys_access(NULL, true, NULL) == ADMIN_ACCESS_ALLOWED);
    CHECK(admin_keys_access(NULL, true, "Bearer anything") == ADMIN_ACCESS_ALLOWED);
    CHECK(admin_keys_access(NULL, false, NULL) == ADMIN_ACCESS_FORBIDDEN);
    CHECK(admin_keys_access(NULL, false, "Bearer anything") == ADMIN_ACCESS_FORBIDDEN);
}

static bool loopback(const char *addr)
{
    struct config cfg = { .enabled = true };

    CHECK_EQ_INT(config_parse_addr(addr, &cfg.admin_listen), 0);
    return admin_is_loopback(&cfg);
}

static void test_admin_loopback_addresses(void)
{
    CHECK(loopback("127.0.0.1:9090"));
    CHECK(loopback("127.9.8.7:9090"));
    CHECK(loopback("[::1]:9090"));
    CHECK(loopback("[::ffff:127.0.0.1]:9090"));
    CHECK(!loopback("0.0.0.0:9090"));
    CHECK(!loopback("[::]:9090"));
    CHECK(!loopback("10.1.2.3:9090"));
    CHECK(!loopback("128.0.0.1:9090"));
    CHECK(!loopback("[::ffff:10.0.0.1]:9090"));
    CHECK(!loopback("[2001:db8::1]:9090"));
}

TEST_MAIN(test_admin_keys_access_with_token, test_admin_keys_access_without_token,
          test_admin_loopback_addresses)
