/* SPDX-License-Identifier: MIT */
/* Host names into addresses (resolve.h): IPv4 first, one family at a time,
 * literals without a lookup. Only names the machine itself knows. */
#include "idemproxy/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>

#include "check.h"

static void test_resolve_literals(void)
{
    struct resolve_addr a[4];
    int gai = -1;

    CHECK_EQ_INT(resolve_host("127.0.0.1", "8080", RESOLVE_NUMERIC, a, 4, &gai), 1);
    CHECK_EQ_INT(gai, 0);
    CHECK_EQ_INT(a[0].sa.ss_family, AF_INET);
    CHECK_EQ_INT(ntohs(((struct sockaddr_in *)&a[0].sa)->sin_port), 8080);
    CHECK_EQ_INT(resolve_host("::1", "80", RESOLVE_NUMERIC | RESOLVE_IPV6, a, 4, NULL), 1);
    CHECK_EQ_INT(a[0].sa.ss_family, AF_INET6);
    /* A bracketed literal is IPv6 only: an IPv4 one is not taken for it. */
    CHECK_EQ_INT(resolve_host("127.0.0.1", "80", RESOLVE_NUMERIC | RESOLVE_IPV6, a, 4, &gai), 0);
    CHECK(gai != 0);
    /* A name is never looked up when only a literal is asked for. */
    CHECK_EQ_INT(resolve_host("localhost", "80", RESOLVE_NUMERIC, a, 4, &gai), 0);
    CHECK_EQ_INT(gai, EAI_NONAME);
}

static void test_resolve_names_ipv4_first(void)
{
    struct resolve_addr a[8];
    char text[64];
    unsigned n = resolve_host("localhost", NULL, 0, a, 8, NULL);

    CHECK(n >= 1);
    CHECK_EQ_INT(a[0].sa.ss_family, AF_INET);
    for (unsigned i = 1; i < n; i++) /* no IPv4 address after an IPv6 one */
        CHECK(a[i].sa.ss_family == AF_INET6 || a[i - 1].sa.ss_family == AF_INET);
    CHECK_EQ_INT(resolve_host("localhost", NULL, 0, a, 1, NULL), 1); /* <max> holds */
    CHECK_EQ_INT(resolve_host_text("localhost", text, sizeof(text)), 0);
    CHECK_EQ_STR(text, "127.0.0.1");
}

TEST_MAIN(test_resolve_literals, test_resolve_names_ipv4_first)
