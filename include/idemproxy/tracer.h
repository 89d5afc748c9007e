/* SPDX-License-Identifier: MIT */
/* The span exporter (doc/operations.md, Tracing): a bounded queue the
 * request path copies finished spans into, and a thread of its own that
 * posts them in batches to --otlp-endpoint as OTLP/HTTP JSON (libcurl).
 * The request path never waits for it: a full queue drops the span and
 * counts it (idemproxy_trace_spans_dropped_total), as does an export the
 * collector refused or did not answer in time. */
#ifndef IDEMPROXY_TRACER_H
#define IDEMPROXY_TRACER_H

#include "idemproxy/trace.h"

#define TRACER_BATCH 256       /* spans per export at most */
#define TRACER_FLUSH_MS 1000   /* a span waits at most this long for its batch */
#define TRACER_TIMEOUT_MS 4000 /* one export, all of it */

struct tracer;

/* Starts the exporter to <endpoint> (an http(s) URL, checked) with room for
 * <queue> spans; <version> names the service's version. Returns 0 with it
 * in <ret>, or a negative errno. Main thread. */
int tracer_start(const char *endpoint, unsigned queue, const char *version, struct tracer **ret);

/* Copies <s> into the queue, or drops and counts it when the queue is full.
 * Any thread; holds the queue's lock only for the copy. NULL-safe (no
 * tracer: nothing). */
void tracer_submit(struct tracer *t, const struct trace_span *s);

/* Exports what is queued (each export bounded as at any time, and none
 * after one fails), stops the thread and frees. Main thread. NULL-safe. */
void tracer_stop(struct tracer *t);

#endif
