/* SPDX-License-Identifier: MIT */
/* Measures what route matching costs a request: builds the route table of
 * scripts/bench's idemproxy-routes50 (49 routes a request to POST /pay
 * does not match: prefixes, exact paths, hosts; then the one it does)
 * through config_file_load(), as the proxy does, and times route_match() for
 * that request, and for a table without routes. Not a test: README's
 * figure comes from it.
 *   build/test/measure_routes [matches=10000000] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/route.h"

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char file[] = "/tmp/measure_routes_XXXXXX";

/* Writes the 50 routes to the temporary file <file>. */
static void write_routes(void)
{
    FILE *f;
    int fd = mkstemp(file);

    if (fd < 0 || !(f = fdopen(fd, "w"))) {
        perror("measure_routes: temporary file");
        exit(1);
    }
    fprintf(f, "routes:\n");
    for (int i = 0; i < 49; i++) {
        if (i % 3 == 0)
            fprintf(f, "  - {name: r%d, match: {methods: [POST], path: /api/v%d/*}}\n", i, i);
        else if (i % 3 == 1)
            fprintf(f, "  - {name: r%d, match: {path: /pay%d}, key: {json: /id}}\n", i, i);
        else
            fprintf(f, "  - {name: r%d, match: {path: /pay/*, host: h%d.example.com}}\n", i, i);
    }
    fprintf(f, "  - {name: pay, match: {methods: [GET, POST], path: /pay}}\n");
    fclose(f);
}

/* Nanoseconds per route_match() of POST /pay (Host 127.0.0.1:8080) on the routes <t>. */
static double time_match(const struct route_table *t, long n, const char *want)
{
    struct span method = SPAN_LIT("POST"), path = SPAN_LIT("/pay"),
                host = SPAN_LIT("127.0.0.1:8080");
    const struct route *rt = NULL;
    double t0 = now_s();

    for (long i = 0; i < n; i++) {
        rt = route_match(t, method, path, host);
        __asm__ volatile("" : : "r"(rt) : "memory"); /* each call is made */
    }
    if (!rt || strcmp(rt->name, want) != 0) {
        fprintf(stderr, "measure_routes: matched %s, not %s\n", rt ? rt->name : "none", want);
        exit(1);
    }
    return (now_s() - t0) * 1e9 / (double)n;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    char *with[] = { "idemproxy", "--upstream", "http://127.0.0.1:1", "--config", file, NULL };
    char *without[] = { "idemproxy", "--upstream", "http://127.0.0.1:1", NULL };
    char *env[] = { NULL };
    struct config a = { 0 }, b = { 0 };
    struct route_table *ta = NULL, *tb = NULL;
    char err[4096];

    write_routes();
    if (n < 1 || config_file_load(&a, &ta, 5, with, env, err, sizeof(err)) < 0 ||
        config_file_load(&b, &tb, 3, without, env, err, sizeof(err)) < 0) {
        fprintf(stderr, "measure_routes: %s\n", err);
        return 1;
    }
    unlink(file);
    printf("route_match, POST /pay, %ld matches each:\n", n);
    printf("  50 routes, the last one matching: %.1f ns\n", time_match(ta, n, "pay"));
    printf("  no routes (default):              %.1f ns\n", time_match(tb, n, "default"));
    route_table_unref(ta);
    route_table_unref(tb);
    config_done(&a);
    config_done(&b);
    return 0;
}
