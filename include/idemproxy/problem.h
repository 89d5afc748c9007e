/* SPDX-License-Identifier: MIT */
/* RFC 9457 problem answers, built with jansson as records so the front end
 * sends them like any other response. */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include "idemproxy/outcome.h"

struct record;

/* Returns a new record (refs 1) answering problem <p>: its status, the header
 * Content-Type: application/problem+json, Retry-After: 1 for the 409 and 503
 * problems, Connection: close for bad_request (400, 501), and a JSON body with type, title, status,
 * detail (<detail>, which may be NULL for the title) and code. NULL on OOM. */
struct record *problem_new(enum problem p, const char *detail);

#endif
