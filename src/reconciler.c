/* SPDX-License-Identifier: MIT */
/* The probes of unknown keys (reconciler.h). A job lives on one loop and
 * does one thing at a time: waits (its timer), claims a probe or notes its
 * result (a store call, whose callback may come on any thread and is
 * brought back to the loop), or sends the probe (an upstream exchange on
 * the loop). The reconciler's list holds every job, so that a key is probed
 * by one job of this process, and so that stopping finds those waiting. */
#include "idemproxy/reconciler.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/metrics.h"
#include "idemproxy/reconcile.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"
#include "idemproxy/store.h"

#define LATER_SLACK_MS 20 /* a claim the store put off is tried this long after it said */

/* Probes that cannot be built, as each duplicate finds them: said once,
 * then counted (log.h). */
static struct log_burst unbuildable = LOG_BURST_INIT("keys whose probe cannot be built");

struct reconciler {
    struct store *st;
    reconciler_submit_fn *submit;
    void *submit_ctx;
    const char *proto;
    uint64_t holder_ms;
    atomic_bool stopping; /* no new job, and a job that would wait ends */
    pthread_mutex_t mu;   /* guards what follows */
    struct list jobs;
    unsigned njobs;
};

enum job_state {
    JOB_WAITING,  /* its timer is armed */
    JOB_STORE,    /* a claim or a note is out */
    JOB_UPSTREAM, /* the probe is out */
};

struct job {
    struct list_node node; /* the reconciler's */
    struct reconciler *rc;
    struct route_table *routes; /* reference */
    const struct route *rt;
    struct loop *loop;
    enum job_state state;
    char *store_key;
    struct buf target;           /* the expanded target, NUL-terminated */
    struct http_header *headers; /* owned array of nheaders: copies, in <strings> */
    size_t nheaders;
    struct buf strings; /* the headers' names and values, the Host, the client */
    struct span host;   /* into <strings> */
    char client_ip[64];
    bool absent_counts;   /* every header listed is part of the key's scope */
    bool made;            /* its request made the key unknown */
    unsigned known_tries; /* made: claims that found the key not unknown yet */
    uint64_t settle_ms;   /* the route's settle, and for a lost holder its wait */
    struct loop_timer timer;
    bool timer_added;
    struct loop_task task;      /* a store callback brought back to the loop */
    enum store_probe_step step; /* the store call out */
    int err;                    /* its result */
    struct store_result res;
    uint64_t sent_ms;       /* the claim's store time */
    uint64_t first_wait_ms; /* before its first claim */
    unsigned probes;
    struct upstream_request up;
    struct upstream_why why;
};

int reconciler_new(struct store *st, reconciler_submit_fn *submit, void *submit_ctx,
                   const char *proto, uint64_t holder_ms, struct reconciler **ret)
{
    struct reconciler *rc = calloc(1, sizeof(*rc));

    if (!rc)
        return -ENOMEM;
    rc->st = st;
    rc->submit = submit;
    rc->submit_ctx = submit_ctx;
    rc->proto = proto;
    rc->holder_ms = holder_ms;
    pthread_mutex_init(&rc->mu, NULL);
    list_init(&rc->jobs);
    *ret = rc;
    return 0;
}

/* Frees <j>, in no list and holding no table. */
static void job_drop(struct job *j)
{
    free(j->store_key);
    buf_done(&j->target);
    free(j->headers);
    buf_done(&j->strings);
    free(j->why.more);
    free(j);
}

static void job_free(struct job *j)
{
    struct reconciler *rc = j->rc;

    pthread_mutex_lock(&rc->mu);
    list_remove(&j->node);
    rc->njobs--;
    pthread_mutex_unlock(&rc->mu);
    route_table_unref(j->routes);
    job_drop(j);
}

/* Ends <j> on its loop: its timer goes first. */
static void job_end(struct job *j)
{
    if (j->timer_added)
        loop_timer_del(j->loop, &j->timer);
    j->timer_added = false;
    job_free(j);
}

static void job_claim(void *ctx);

/* <j> waits <ms>, then claims its next probe; once stopping it ends. Loop
 * thread (or any, once the loops stopped). */
static void job_wait(struct job *j, uint64_t ms)
{
    if (atomic_load(&j->rc->stopping)) {
        job_end(j);
        return;
    }
    j->state = JOB_WAITING;
    j->timer.due_ms = now_ms() + ms;
    if (!j->timer_added)
        loop_timer_add(j->loop, &j->timer);
    j->timer_added = true;
}

static const char *verdict_name(enum reconcile_verdict v)
{
    return v == RECONCILE_FOUND ? "found" : v == RECONCILE_ABSENT ? "absent" : "failed";
}

static void job_stored(void *ctx);

/* A store call's callback, on any thread: brought back to the loop. */
static void on_store(void *ctx, int err, const struct store_result *res)
{
    struct job *j = ctx;

    j->err = err;
    if (res)
        j->res = *res;
    j->res.rec = NULL;
    j->task = (struct loop_task){ .fn = job_stored, .ctx = j };
    if (loop_post(j->loop, &j->task) < 0)
        job_free(j); /* the loops stopped: the proxy is going */
}

/* Starts the store call <p> for <j>; a refused one is retried after every. */
static void job_store(struct job *j, struct store_probe *p)
{
    int err;

    j->state = JOB_STORE;
    j->step = p->step;
    err = store_probe(j->rc->st, span_from_cstr(j->store_key), p, on_store, j);
    if (err < 0)
        job_wait(j, j->rt->reconcile->every_ms);
}

static void job_claim(void *ctx)
{
    struct job *j = ctx;
    const struct reconcile_config *c = j->rt->reconcile;
    struct store_probe p = { .step = STORE_PROBE_CLAIM,
                             .settle_ms = j->settle_ms,
                             .every_ms = c->every_ms,
                             .attempts = c->attempts };

    loop_timer_del(j->loop, &j->timer); /* registered only while it waits */
    j->timer_added = false;
    job_store(j, &p);
}

/* The probe's answer: judged, counted, logged and noted. Loop thread. */
static void on_answer(void *ctx, int err, struct record *ans)
{
    struct job *j = ctx;
    const struct reconcile_config *c = j->rt->reconcile;
    struct store_probe p = { .sent_ms = j->sent_ms, .ttl_ms = j->rt->settings.ttl_ms };
    const char *why = NULL;
    char status[48] = "";
    int v = RECONCILE_FAILED;

    if (err == -ECANCELED || err == -ESHUTDOWN || atomic_load(&j->rc->stopping)) {
        /* the proxy is stopping: a probe it cut proves nothing, and is not counted */
        record_unref(ans);
        job_end(j);
        return;
    }
    if (ans) {
        snprintf(status, sizeof(status), "%u, ", ans->status);
        v = reconcile_judge(c, ans, j->rt->settings.max_response_bytes, &p.rec, &why);
    } else {
        why = j->why.cause ? j->why.cause : "the upstream did not answer it";
    }
    if (v < 0) {
        v = RECONCILE_FAILED;
        why = "out of memory";
    }
    if (v == RECONCILE_ABSENT && !j->absent_counts) {
        v = RECONCILE_FAILED;
        why = "its answer matches absent, but it was sent without a listed header that is not "
              "part of the key's scope: only found counts";
    }
    metrics_reconcile(j->rt->metrics_id, v == RECONCILE_FOUND    ? METRICS_RECONCILE_FOUND
                                         : v == RECONCILE_ABSENT ? METRICS_RECONCILE_ABSENT
                                                                 : METRICS_RECONCILE_FAILED);
    log_info("key %s: reconcile probe %u of %u (%s %s): %s%s: %s", j->store_key, j->probes,
             c->attempts, c->method, j->target.data, status,
             verdict_name((enum reconcile_verdict)v), why);
    record_unref(ans);
    p.step = v == RECONCILE_FOUND    ? STORE_PROBE_FOUND
             : v == RECONCILE_ABSENT ? STORE_PROBE_ABSENT
                                     : STORE_PROBE_FAILED;
    job_store(j, &p);
    record_unref(p.rec); /* the store took its own */
}

/* Sends the claimed probe. Loop thread. */
static void job_send(struct job *j)
{
    int err;

    j->up = (struct upstream_request){
        .method = span_from_cstr(j->rt->reconcile->method),
        .target = span_from_cstr(j->target.data),
        .host = j->host,
        .headers = j->headers,
        .nheaders = j->nheaders,
        .client_ip = j->client_ip,
        .proto = j->rc->proto,
        .why = &j->why,
    };
    free(j->why.more);
    j->why = (struct upstream_why){ 0 };
    j->state = JOB_UPSTREAM;
    err = j->rc->submit(j->rc->submit_ctx, j->loop, &j->up, on_answer, j);
    if (err < 0)
        on_answer(j, err, NULL);
}

/* What the store said of a claim. Loop thread. */
static void claimed(struct job *j)
{
    const struct reconcile_config *c = j->rt->reconcile;

    switch (j->res.probe) {
    case STORE_PROBE_CLAIMED:
        j->sent_ms = j->res.probe_ms;
        j->probes = j->res.probes;
        job_send(j);
        return;
    case STORE_PROBE_LATER:
        job_wait(j, j->res.probe_ms + LATER_SLACK_MS);
        return;
    case STORE_PROBE_SPENT:
        if (j->probes == 0 && !j->made) /* a duplicate's job: its maker said so */
            break;
        log_warn("key %s: reconcile gave up after %u probes: the outcome stays unknown; an "
                 "operator resolves it (/keys?state=unknown)",
                 j->store_key, c->attempts);
        break;
    default: /* known: completed, released or resolved meanwhile */
        if (j->made && j->probes == 0 && j->known_tries++ < 3) {
            job_wait(j, 1000); /* or its own unknown write is still on its way (lease.h) */
            return;
        }
        break;
    }
    job_end(j);
}

/* A store call has called back: <j> goes on. Loop thread. */
static void job_stored(void *ctx)
{
    struct job *j = ctx;
    const struct reconcile_config *c = j->rt->reconcile;

    if (j->err == -ENOENT) { /* the key is gone: released or expired meanwhile */
        job_end(j);
        return;
    }
    if (j->err < 0) {
        job_wait(j, c->every_ms);
        return;
    }
    if (j->step == STORE_PROBE_CLAIM) {
        claimed(j);
        return;
    }
    if (j->res.probe == STORE_PROBE_NOTED && j->step == STORE_PROBE_FOUND)
        log_warn("key %s: reconciled: found, the key is completed with its answer (replays carry "
                 "%s: true)",
                 j->store_key, RECONCILE_HEADER);
    else if (j->res.probe == STORE_PROBE_RELEASED)
        log_warn("key %s: reconciled: absent twice, the key is released: its next retry runs",
                 j->store_key);
    if (j->res.probe == STORE_PROBE_NOTED && j->step != STORE_PROBE_FOUND)
        job_wait(j, c->every_ms);
    else
        job_end(j);
}

/* Copies into <j> the headers of <rq> that the probe takes: listed, and
 * part of the key's scope; <j>->absent_counts says whether each listed one
 * was. Returns 0 or -ENOMEM. */
static int copy_headers(struct job *j, const struct route *rt, const struct request *rq,
                        bool principal)
{
    const struct reconcile_config *c = rt->reconcile;
    size_t n = 0, at = 0, most = rq->nheaders * c->nheaders + 1;
    size_t *offs = calloc(2 * most, sizeof(*offs));
    int err = 0;

    j->absent_counts = true;
    if (!offs || !(j->headers = calloc(most, sizeof(*j->headers)))) {
        free(offs);
        return -ENOMEM;
    }
    for (size_t h = 0; h < c->nheaders; h++) {
        bool in_scope = false;
        if (rt->scope) /* its value made the principal */
            in_scope = principal && strcasecmp(c->headers[h], scope_header(rt->scope)) == 0;
        for (size_t s = 0; !rt->scope && s < rt->settings.nscope_headers; s++)
            in_scope |= strcasecmp(c->headers[h], rt->settings.scope_headers[s]) == 0;
        if (!in_scope) {
            j->absent_counts = false;
            continue;
        }
        for (size_t i = 0; i < rq->nheaders && err == 0; i++) {
            const struct http_header *f = &rq->headers[i];

            if (f->name.len != strlen(c->headers[h]) ||
                strncasecmp(f->name.base, c->headers[h], f->name.len) != 0)
                continue;
            offs[2 * n] = j->strings.len;
            err = buf_append(&j->strings, f->name.base, f->name.len);
            offs[2 * n + 1] = j->strings.len;
            if (err == 0)
                err = buf_append(&j->strings, f->value.base, f->value.len);
            j->headers[n].name.len = f->name.len;
            j->headers[n++].value.len = f->value.len;
        }
    }
    for (size_t i = 0; i < rq->nheaders && err == 0; i++) {
        const struct http_header *f = &rq->headers[i];

        if (f->name.len == 4 && strncasecmp(f->name.base, "Host", 4) == 0 && !j->host.len) {
            at = j->strings.len;
            err = buf_append(&j->strings, f->value.base, f->value.len);
            j->host.len = f->value.len;
        }
    }
    for (size_t i = 0; i < n && err == 0; i++) { /* <strings> has stopped moving */
        j->headers[i].name.base = j->strings.data + offs[2 * i];
        j->headers[i].value.base = j->strings.data + offs[2 * i + 1];
    }
    j->host.base = j->host.len ? j->strings.data + at : NULL;
    j->nheaders = n;
    free(offs);
    return err;
}

/* A new job for <k>, or NULL (out of memory, or its target cannot be built:
 * that is counted and logged as a failed probe). */
static struct job *job_new(struct reconciler *rc, const struct reconciler_key *k)
{
    const struct reconcile_config *c = k->route->reconcile;
    struct job *j = calloc(1, sizeof(*j));
    const char *why = NULL;
    int err;

    if (!j)
        return NULL;
    j->rc = rc;
    j->rt = k->route;
    j->loop = k->rq->loop;
    j->target = (struct buf)BUF_INIT(RECONCILE_TARGET_MAX + 1);
    j->strings = (struct buf)BUF_INIT(SIZE_MAX);
    j->timer = (struct loop_timer){ .fn = job_claim, .ctx = j, .due_ms = UINT64_MAX };
    snprintf(j->client_ip, sizeof(j->client_ip), "%s", k->rq->client_ip);
    err = (j->store_key = strdup(k->store_key)) ? 0 : -ENOMEM;
    if (err == 0)
        err = reconcile_target_expand(c->target, k->key, k->body, &j->target, &why);
    if (err == 0)
        err = buf_append(&j->target, "", 1);
    if (err == 0)
        err = copy_headers(j, k->route, k->rq, k->principal);
    if (err < 0) {
        if (err != -ENOMEM)
            metrics_reconcile(k->route->metrics_id, METRICS_RECONCILE_FAILED);
        if (err != -ENOMEM && log_enabled(LOG_LEVEL_WARN) &&
            log_burst_admit(&unbuildable, why ? why : "")) {
            log_warn("key %s: reconcile cannot probe it: %s; it stays unknown for an operator",
                     k->store_key, why ? why : "its target cannot be built");
        }
        job_drop(j);
        return NULL;
    }
    j->target.len--; /* the NUL stays, out of the length */
    return j;
}

/* Arms a new job on its loop. */
static void job_begin(void *ctx)
{
    struct job *j = ctx;

    job_wait(j, j->first_wait_ms);
}

/* Whether a job of <rc> probes <store_key> (its lock held). */
static bool has_job(const struct reconciler *rc, const char *store_key)
{
    for (struct list_node *n = list_first(&rc->jobs); n; n = list_next(&rc->jobs, n)) {
        if (strcmp(list_entry(n, struct job, node)->store_key, store_key) == 0)
            return true;
    }
    return false;
}

void reconciler_start(struct reconciler *rc, const struct reconciler_key *k)
{
    struct job *j;
    bool taken;

    if (!rc || !k->route->reconcile || !k->rq->loop || atomic_load(&rc->stopping))
        return;
    pthread_mutex_lock(&rc->mu);
    taken = has_job(rc, k->store_key) || rc->njobs >= RECONCILER_JOBS_MAX;
    pthread_mutex_unlock(&rc->mu);
    if (taken || !(j = job_new(rc, k)))
        return;
    j->made = k->made;
    j->settle_ms =
        k->route->reconcile->settle_ms + (k->cause == STORE_CAUSE_HOLDER_LOST ? rc->holder_ms : 0);
    j->first_wait_ms = k->made ? j->settle_ms : 0;
    j->task = (struct loop_task){ .fn = job_begin, .ctx = j };
    pthread_mutex_lock(&rc->mu); /* looked at again: another loop may have begun one */
    taken = has_job(rc, k->store_key) || rc->njobs >= RECONCILER_JOBS_MAX;
    if (!taken) {
        j->routes = route_table_ref(k->routes);
        list_append(&rc->jobs, &j->node);
        rc->njobs++;
    }
    pthread_mutex_unlock(&rc->mu);
    if (taken)
        job_drop(j);
    else if (loop_post(j->loop, &j->task) < 0)
        job_free(j);
}

unsigned reconciler_jobs(struct reconciler *rc)
{
    unsigned n;

    pthread_mutex_lock(&rc->mu);
    n = rc->njobs;
    pthread_mutex_unlock(&rc->mu);
    return n;
}

void reconciler_stop(struct reconciler *rc)
{
    struct list waiting;
    struct list_node *n, *tmp;

    if (!rc)
        return;
    list_init(&waiting);
    atomic_store(&rc->stopping, true);
    pthread_mutex_lock(&rc->mu);
    list_for_each_safe(&rc->jobs, n, tmp)
    {
        struct job *j = list_entry(n, struct job, node);

        if (j->state == JOB_WAITING) {
            list_remove(&j->node);
            list_append(&waiting, &j->node);
        }
    }
    pthread_mutex_unlock(&rc->mu);
    list_for_each_safe(&waiting, n, tmp)
    {
        struct job *j = list_entry(n, struct job, node);

        list_remove(&j->node);
        list_append(&rc->jobs, &j->node); /* job_end() takes it out again */
        job_end(j);
    }
}

void reconciler_free(struct reconciler *rc)
{
    if (!rc)
        return;
    reconciler_stop(rc);
    pthread_mutex_destroy(&rc->mu);
    free(rc);
}
