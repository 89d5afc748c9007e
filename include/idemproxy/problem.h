/* SPDX-License-Identifier: MIT */
/* RFC 9457 problem answers, built with jansson as records so the front end
 * sends them like any other response. */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include "idemproxy/outcome.h"

struct record;

/* The HTTP status and the stable code of <p>. */
unsigned problem_status(enum problem p);
const char *problem_code(enum problem p);

/* How a route answers its errors (doc/configuration.md, Error dialects). */
enum problem_dialect {
    PROBLEM_DIALECT_PROBLEM, /* RFC 9457 application/problem+json */
    PROBLEM_DIALECT_STRIPE,  /* {"error": {"type", "code", "message"}}, as Stripe's SDKs read it */
};

/* Returns a new record (refs 1) answering problem <p> in <dialect>: its
 * status, Retry-After: 1 for the 409 and 503 problems, Connection: close for
 * bad_request (400, 501), and a JSON body. PROBLEM_DIALECT_PROBLEM:
 * Content-Type: application/problem+json, members type, title, status,
 * detail and code. PROBLEM_DIALECT_STRIPE: Content-Type: application/json,
 * {"error": {"type": T, "code": code, "message": detail}}, T being
 * "idempotency_error" for the four key problems and "api_error" otherwise.
 * <detail> may be NULL for the title. NULL on OOM or an unknown <p>. */
struct record *problem_new(enum problem p, enum problem_dialect dialect, const char *detail);

/* problem_new() with one more member <name>: <value> (a string), in the
 * problem object or, in PROBLEM_DIALECT_STRIPE, the error object; none
 * when <name> is NULL. */
struct record *problem_new_with(enum problem p, enum problem_dialect dialect, const char *detail,
                                const char *name, const char *value);

#endif
