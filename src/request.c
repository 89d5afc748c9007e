/* SPDX-License-Identifier: MIT */
/* The request object: made by the front end, read by the pipeline. */
#include "idemproxy/request.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemproxy/http.h"
#include "idemproxy/rng.h"

struct request *request_new(const char *target)
{
    struct request *rq = calloc(1, sizeof(*rq));

    if (!rq)
        return NULL;
    rq->target_buf = strdup(target);
    if (!rq->target_buf) {
        free(rq);
        return NULL;
    }
    rq->target = span_from_cstr(rq->target_buf);
    return rq;
}

int request_add_header(struct request *rq, struct span name, struct span value)
{
    if (rq->nheaders == rq->headers_cap) {
        size_t cap = rq->headers_cap ? rq->headers_cap * 2 : 16;
        struct http_header *h = realloc(rq->headers, cap * sizeof(*h));

        if (!h)
            return -ENOMEM;
        rq->headers = h;
        rq->headers_cap = cap;
    }
    rq->headers[rq->nheaders++] = (struct http_header){ .name = name, .value = value };
    return 0;
}

const struct span *request_header(const struct request *rq, struct span name, size_t *ret_count)
{
    const struct span *found = NULL;
    size_t n = 0;

    for (size_t i = 0; i < rq->nheaders; i++) {
        if (span_eq_nocase(rq->headers[i].name, name)) {
            if (!found)
                found = &rq->headers[i].value;
            n++;
        }
    }
    if (ret_count)
        *ret_count = n;
    return found;
}

void request_free(struct request *rq)
{
    if (!rq)
        return;
    free(rq->target_buf);
    free(rq->headers);
    free(rq);
}

bool request_id_is_valid(struct span v) { return http_is_visible(v, REQUEST_ID_MAX); }

bool request_id_pick(const struct request *rq, struct span header, char out[REQUEST_ID_MAX + 1])
{
    size_t count = 0;
    const struct span *v = request_header(rq, header, &count);

    if (v && count == 1 && request_id_is_valid(*v)) {
        memcpy(out, v->base, v->len);
        out[v->len] = '\0';
        return true;
    }
    /* 128 random bits in 32 hex digits (rng.h: no RAND_bytes call of its own). */
    _Static_assert(REQUEST_ID_MAX >= 32, "a made request id is 32 hex digits");
    if (rng_hex(out, 16) < 0) {
        /* OpenSSL's generator failed: the time and an address still make an
         * id that tells requests apart in a log, which is all it is for. */
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(out, 33, "%016llx%016llx",
                 (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec,
                 (unsigned long long)(uintptr_t)rq);
    }
    return false;
}
