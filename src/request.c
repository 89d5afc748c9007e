/* SPDX-License-Identifier: MIT */
/* The request object: made by the front end, read by the pipeline. */
#include "idemproxy/request.h"

#include <stdlib.h>
#include <string.h>

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
