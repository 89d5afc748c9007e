/* SPDX-License-Identifier: MIT */
/* GET /keys/<key> and DELETE /keys/<key>?scope=<hash> on the admin listener:
 * what an operator reaches for when a client is stuck. Runs on the admin MHD
 * thread, which waits (bounded) for the store: admin traffic is rare, and the
 * front end's thread is never involved. */
#include "idemproxy/admin_keys.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/config.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/log.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/store.h"

#define WAIT_MS 10000 /* a SCAN of a large Redis may take a while */

/* A store call the admin thread waits for. Two owners: the waiting thread and
 * the callback; the last one frees it (the wait may give up first). */
struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool done;
    int err;
    struct store_info_list list; /* inspect: taken from the callback */
};

static struct waiter *waiter_new(void)
{
    struct waiter *w = calloc(1, sizeof(*w));
    pthread_condattr_t attr;

    if (!w)
        return NULL;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&w->mu, NULL);
    w->refs = 2;
    return w;
}

static void waiter_unref(struct waiter *w)
{
    bool last;

    pthread_mutex_lock(&w->mu);
    last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (!last)
        return;
    store_info_list_done(&w->list);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static void waiter_finish(struct waiter *w, int err, struct store_info_list *list)
{
    pthread_mutex_lock(&w->mu);
    w->err = err;
    if (list) {
        w->list = *list; /* taken over: the store frees an empty list */
        *list = (struct store_info_list){ 0 };
    }
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    waiter_unref(w);
}

static void on_listed(void *ctx, int err, struct store_info_list *list)
{
    waiter_finish(ctx, err, list);
}

static void on_purged(void *ctx, int err, const struct store_result *res)
{
    (void)res;
    waiter_finish(ctx, err, NULL);
}

/* Waits for <w>'s callback. Returns its error, or -ETIMEDOUT. */
static int waiter_wait(struct waiter *w)
{
    uint64_t due = now_ms() + WAIT_MS;
    struct timespec ts = { .tv_sec = (time_t)(due / 1000),
                           .tv_nsec = (long)(due % 1000) * 1000000L };
    int err;

    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0)
        ;
    err = w->done ? w->err : -ETIMEDOUT;
    pthread_mutex_unlock(&w->mu);
    return err;
}

static enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned status, json_t *obj)
{
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    size_t len;

    json_decref(obj);
    if (!text)
        return MHD_NO;
    len = strlen(text);
    resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    (void)MHD_add_response_header(resp, "Content-Type", "application/json");
    (void)MHD_add_response_header(resp, "Cache-Control", "no-store");
    ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *conn, enum problem p, const char *msg)
{
    return admin_keys_problem(conn, p, msg, NULL);
}

/* The longest key the proxy stores: a composite of CONFIG_MAX_LIST header
 * values of IDEMKEY_MAX bytes, one space apart (doc/configuration.md, Key sources). */
#define KEY_MAX (CONFIG_MAX_LIST * (IDEMKEY_MAX + 1))

/* Decodes the key of the raw target <raw> ("/keys/<key>[?query]", as the
 * client sent it) into <ret> (KEY_MAX + 1 bytes): %XX decoded, the result a
 * key as the proxy stores it: 1-255 bytes of 0x21-0x7E (unquoted), or a
 * composite key's parts of those (at most CONFIG_MAX_LIST) joined by single
 * spaces. Decoded here, not by the HTTP
 * layer, whose C string would end at a %00. Returns 0 or -EINVAL. */
static int decode_key(const char *raw, char *ret)
{
    size_t n, at = strlen(ADMIN_KEYS_PATH);
    struct span in = { .base = raw, .len = strcspn(raw, "?") };
    char path[3 * KEY_MAX + 64];

    if (in.len > sizeof(path) || http_percent_decode(in, path, &n) < 0)
        return -EINVAL;
    if (n < at || memcmp(path, ADMIN_KEYS_PATH, at) != 0 || n - at == 0 || n - at > KEY_MAX)
        return -EINVAL;
    for (size_t i = at, part = 0, parts = 1; i < n; i++) {
        unsigned char c = (unsigned char)path[i];

        if (c == ' ' && i > at && i + 1 < n && path[i - 1] != ' ' && parts < CONFIG_MAX_LIST) {
            part = 0; /* between two parts of a composite key */
            parts++;
            continue;
        }
        if (c < 0x21 || c > 0x7e || ++part > IDEMKEY_MAX)
            return -EINVAL;
    }
    memcpy(ret, path + at, n - at);
    ret[n - at] = '\0';
    return 0;
}

static json_t *base64_json(const struct buf *b)
{
    size_t n = 4 * ((b->len + 2) / 3) + 1;
    unsigned char *out = malloc(n);
    json_t *v;

    if (!out)
        return NULL;
    EVP_EncodeBlock(out, (const unsigned char *)(b->data ? b->data : ""), (int)b->len);
    v = json_string((const char *)out);
    free(out);
    return v;
}

/* <n> bytes of a request (its target) as a JSON string: bytes that are not
 * UTF-8 percent-encoded, as in a URI. */
static json_t *bytes_json(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    char *out;

    if (v)
        return v;
    out = malloc(3 * n + 1);
    if (!out)
        return NULL;
    for (size_t i = 0, j = 0; i <= n; i++) {
        unsigned char c = i < n ? (unsigned char)s[i] : 0;

        if (i == n)
            out[j] = '\0';
        else if (c < 0x80)
            out[j++] = (char)c;
        else
            j += (size_t)snprintf(out + j, 4, "%%%02X", c);
    }
    v = json_string(out);
    free(out);
    return v;
}

/* Adds the route, method and target an unknown record keeps ("<route>
 * <method> <target>") to <o>. */
static void about_json(json_t *o, const char *about)
{
    static const char *const names[] = { "route", "method", "target" };
    const char *p = about;

    for (size_t i = 0; i < ARRAY_SIZE(names) && p; i++) {
        const char *end = i + 1 < ARRAY_SIZE(names) ? strchr(p, ' ') : NULL;
        size_t n = end ? (size_t)(end - p) : strlen(p);

        json_object_set_new(o, names[i], bytes_json(p, n));
        p = end ? end + 1 : NULL;
    }
}

/* Adds the completed answer of <info> to <o>: its status, and its headers
 * and body when <with_body>; the key id that sealed it; or why it does not
 * open (store_seal.h). */
static void answer_json(json_t *o, const struct store_info *info, bool with_body)
{
    const struct record *rec = info->rec;

    if (info->sealed_by)
        json_object_set_new(o, "key_id", json_string(info->sealed_by));
    if (info->unreadable || !rec) {
        json_object_set_new(o, "unreadable", json_string(info->unreadable ? info->unreadable : ""));
        return;
    }
    json_object_set_new(o, "status", json_integer(rec->status));
    json_object_set_new(o, "too_large", json_boolean(rec->too_large));
    if (with_body) {
        json_t *hs = json_array();

        for (size_t i = 0; hs && i < rec->nheaders; i++)
            json_array_append_new(hs,
                                  json_pack("[s,s]", rec->headers[i].name, rec->headers[i].value));
        json_object_set_new(o, "headers", hs);
        json_object_set_new(o, "body_base64", base64_json(&rec->body));
    }
}

static json_t *info_json(const struct store_info *info, size_t prefix_len, bool with_body)
{
    json_t *o = json_pack("{s:s, s:s#, s:s, s:s, s:I, s:I}", "store_key", info->store_key, "scope",
                          info->store_key + prefix_len, (int)IDEMKEY_SCOPE_HEX, "state",
                          info->tombstone   ? "tombstone"
                          : info->completed ? "completed"
                          : info->unknown   ? "unknown"
                                            : "locked",
                          "fingerprint", info->fp_hex, "age_ms", (json_int_t)info->age_ms, "ttl_ms",
                          (json_int_t)info->ttl_ms);

    if (o && !info->completed && !info->unknown)
        json_object_set_new(o, "lease_ms", json_integer((json_int_t)info->lease_ms));
    if (o && info->unknown) {
        json_object_set_new(o, "cause", json_string(store_cause_name(info->cause)));
        if (info->about)
            about_json(o, info->about);
        /* its probes (doc/configuration.md, Reconcile); last_result null: none ended yet */
        json_object_set_new(o, "probes", json_integer((json_int_t)info->probes));
        json_object_set_new(o, "last_result",
                            info->last_result == STORE_PROBE_NONE
                                ? json_null()
                                : json_string(store_probe_result_name(info->last_result)));
    }
    if (o && info->completed && (info->rec || info->unreadable))
        answer_json(o, info, with_body);
    if (o && info->resource)
        json_object_set_new(o, "resource", bytes_json(info->resource, strlen(info->resource)));
    return o;
}

/* Waits for the listing that <w> was given to, <err> being what starting it
 * returned. Returns 0 with the list in <w>, or a negative errno: <w> is then
 * dropped. */
static int listed(struct waiter *w, int err)
{
    if (err < 0) {
        waiter_unref(w); /* no callback comes */
        waiter_unref(w);
        return -ECANCELED;
    }
    err = waiter_wait(w);
    if (err < 0)
        waiter_unref(w);
    return err;
}

/* The 503 of a listing that failed with <err> (from listed()). */
static enum MHD_Result reply_listing_error(struct MHD_Connection *conn, int err)
{
    return reply_error(conn, PROBLEM_STORE_UNAVAILABLE,
                       err == -ECANCELED   ? "the store refused the call"
                       : err == -ETIMEDOUT ? "the store did not answer in time"
                                           : "the store is not answering");
}

static enum MHD_Result list_keys(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *key, bool with_body)
{
    struct waiter *w = waiter_new();
    json_t *records;
    int err;

    if (!w)
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    err = store_inspect(st, span_from_cstr(prefix), span_from_cstr(key), with_body, on_listed, w);
    if ((err = listed(w, err)) < 0)
        return reply_listing_error(conn, err);
    records = json_array();
    for (size_t i = 0; records && i < w->list.n; i++)
        json_array_append_new(records, info_json(&w->list.items[i], strlen(prefix), with_body));
    waiter_unref(w);
    return reply_json(conn, 200, json_pack("{s:s, s:o}", "key", key, "records", records));
}

/* GET /keys?resource=ID[&scope=S][&body=1]: the records whose answer
 * created the resource ID (doc/configuration.md, Resource links), in any scope or in S. */
static enum MHD_Result find_resource(struct MHD_Connection *conn, struct store *st,
                                     const char *prefix, const char *resource)
{
    const char *scope = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "scope");
    const char *body = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "body");
    bool with_body = body && strcmp(body, "1") == 0;
    size_t plen = strlen(prefix);
    struct waiter *w;
    json_t *records;
    int err;

    if (!http_is_visible(span_from_cstr(resource), STORE_RESOURCE_MAX))
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "resource: 1 to 255 bytes of 0x21-0x7E, percent-encoded");
    if (scope && !idemkey_is_scope(span_from_cstr(scope)))
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "scope: the 32 hex characters GET /keys/<key> shows");
    if (!(w = waiter_new()))
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    err = store_find_resource(st, span_from_cstr(prefix), span_from_cstr(resource), with_body,
                              on_listed, w);
    if ((err = listed(w, err)) < 0)
        return reply_listing_error(conn, err);
    records = json_array();
    for (size_t i = 0; records && i < w->list.n; i++) {
        const struct store_info *in = &w->list.items[i];
        struct span k =
            idemkey_store_key_key(span_from_cstr(in->store_key), span_from_cstr(prefix));
        json_t *o;

        if (scope && strncmp(in->store_key + plen, scope, IDEMKEY_SCOPE_HEX) != 0)
            continue;
        o = info_json(in, plen, with_body);
        if (o && k.base)
            json_object_set_new(o, "key", bytes_json(k.base, k.len));
        json_array_append_new(records, o);
    }
    waiter_unref(w);
    return reply_json(conn, 200, json_pack("{s:s, s:o}", "resource", resource, "records", records));
}

/* The operator's address, for the log. */
static void peer_address(struct MHD_Connection *conn, char *out, size_t outlen)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

    http_address_text(ci ? ci->client_addr : NULL, out, outlen);
    if (!out[0])
        snprintf(out, outlen, "?");
}

static enum MHD_Result purge_key(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *key, const char *scope)
{
    struct waiter *w;
    char *store_key;
    int err;

    if (!scope || !idemkey_is_scope(span_from_cstr(scope)))
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "scope: give ?scope=<the 32 hex characters shown by GET /keys/<key>>");
    if (idemkey_store_key(span_from_cstr(prefix), scope, span_from_cstr(key), &store_key) < 0)
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    w = waiter_new();
    if (!w) {
        free(store_key);
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    }
    err = store_purge(st, span_from_cstr(store_key), strlen(prefix), on_purged, w);
    if (err < 0) {
        waiter_unref(w);
        waiter_unref(w);
    } else {
        err = waiter_wait(w);
        waiter_unref(w);
    }
    if (err == -ENOENT) {
        free(store_key);
        return reply_error(conn, PROBLEM_ADMIN_NOT_FOUND,
                           "no such key under this scope (expired, or never stored)");
    }
    if (err < 0) {
        free(store_key);
        return reply_error(conn, PROBLEM_STORE_UNAVAILABLE, "the store is not answering");
    }
    {
        json_t *o = json_pack("{s:s}", "deleted", store_key);
        char peer[64];

        peer_address(conn, peer, sizeof(peer));
        log_warn("key %s deleted by the operator at %s: its next request runs", store_key, peer);
        free(store_key);
        return reply_json(conn, 200, o);
    }
}

/* GET /keys?state=unknown[&cursor=C]: a page of the unknown keys. */
static enum MHD_Result list_unknown(struct MHD_Connection *conn, struct store *st,
                                    const char *prefix)
{
    const char *state = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "state");
    const char *cursor = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "cursor");
    struct waiter *w;
    json_t *records, *next;
    int err;

    if (!state || strcmp(state, "unknown") != 0)
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "list with GET /keys?state=unknown (the keys whose outcome is "
                           "unknown) or GET /keys?resource=ID (the keys whose answer created "
                           "it); one key's records with GET /keys/<key>");
    w = waiter_new();
    if (!w)
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    err = store_list_unknown(st, span_from_cstr(prefix), cursor ? cursor : "", on_listed, w);
    if (err == -EINVAL) {
        waiter_unref(w);
        waiter_unref(w);
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "cursor: give the one the last page said");
    }
    if ((err = listed(w, err)) < 0)
        return reply_listing_error(conn, err);
    records = json_array();
    for (size_t i = 0; records && i < w->list.n; i++) {
        const struct store_info *in = &w->list.items[i];
        json_t *o = info_json(in, strlen(prefix), false); /* unknown: no answer */
        struct span k =
            idemkey_store_key_key(span_from_cstr(in->store_key), span_from_cstr(prefix));

        if (o && k.base)
            json_object_set_new(o, "key", bytes_json(k.base, k.len));
        json_array_append_new(records, o);
    }
    next = w->list.cursor[0] ? json_string(w->list.cursor) : json_null();
    waiter_unref(w);
    return reply_json(
        conn, 200,
        json_pack("{s:s, s:o, s:o}", "state", "unknown", "records", records, "next_cursor", next));
}

static void on_resolved(void *ctx, int err, const struct store_result *res)
{
    (void)res;
    waiter_finish(ctx, err, NULL);
}

/* The answer of a PUT body {"status": N, "headers": [[name, value], ...],
 * "body": "..." or "body_base64": "..."}, or NULL with <why> set. */
static struct record *answer_from_json(struct span text, const char **why)
{
    json_t *root = json_loadb(text.base ? text.base : "", text.len, JSON_REJECT_DUPLICATES, NULL);
    json_t *status, *headers, *body, *body64, *h;
    struct record *rec = NULL;
    size_t i;

    *why = "the body is {\"status\": N, \"headers\": [[name, value], ...], \"body\": \"...\"} "
           "(or \"body_base64\")";
    if (!json_is_object(root))
        goto out;
    status = json_object_get(root, "status");
    headers = json_object_get(root, "headers");
    body = json_object_get(root, "body");
    body64 = json_object_get(root, "body_base64");
    if (!json_is_integer(status) || json_integer_value(status) < 100 ||
        json_integer_value(status) > 599 || (headers && !json_is_array(headers)) ||
        (body && body64) || (body && !json_is_string(body)) || (body64 && !json_is_string(body64)))
        goto out;
    rec = record_new(SIZE_MAX);
    if (!rec) {
        *why = "out of memory";
        goto out;
    }
    rec->status = (unsigned)json_integer_value(status);
    json_array_foreach(headers, i, h)
    {
        json_t *n = json_array_get(h, 0), *v = json_array_get(h, 1);

        if (!json_is_array(h) || json_array_size(h) != 2 || !json_is_string(n) ||
            !json_is_string(v) ||
            !http_is_token((struct span){ json_string_value(n), json_string_length(n) }) ||
            !http_is_field_value((struct span){ json_string_value(v), json_string_length(v) }) ||
            record_add_header(rec, (struct span){ json_string_value(n), json_string_length(n) },
                              (struct span){ json_string_value(v), json_string_length(v) }) < 0) {
            *why = "headers: [[name, value], ...], a token and a field value without CR, LF or NUL";
            goto fail;
        }
    }
    record_filter_hop_by_hop(rec);
    record_ensure_date(rec); /* replays carry one Date: the answer's, or the resolution's */
    if (body && buf_append(&rec->body, json_string_value(body), json_string_length(body)) < 0)
        goto fail;
    if (body64) {
        size_t n = json_string_length(body64);
        unsigned char *out = malloc(n / 4 * 3 + 3);
        int len =
            out ? EVP_DecodeBlock(out, (const unsigned char *)json_string_value(body64), (int)n)
                : -1;

        if (len < 0 || n % 4 != 0) {
            free(out);
            *why = "body_base64: not base64";
            goto fail;
        }
        /* EVP_DecodeBlock() counts the padding as data */
        if (n >= 1 && json_string_value(body64)[n - 1] == '=')
            len--;
        if (n >= 2 && json_string_value(body64)[n - 2] == '=')
            len--;
        if (buf_append(&rec->body, (const char *)out, (size_t)len) < 0) {
            free(out);
            goto fail;
        }
        free(out);
    }
    *why = NULL;
    goto out;
fail:
    record_unref(rec);
    rec = NULL;
out:
    json_decref(root);
    return rec;
}

/* PUT /keys/<key>?scope=<hash>: an operator's answer completes an unknown key. */
static enum MHD_Result resolve_key(struct MHD_Connection *conn, struct store *st,
                                   const struct admin_keys_call *c, const char *key,
                                   const char *scope)
{
    struct waiter *w;
    struct record *rec;
    const char *why;
    char *store_key, peer[64];
    unsigned status;
    int err;

    if (!scope || !idemkey_is_scope(span_from_cstr(scope)))
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "scope: give ?scope=<the 32 hex characters shown by GET /keys/<key>>");
    if (c->body_too_large)
        return reply_error(conn, PROBLEM_ADMIN_TOO_LARGE,
                           "the answer is larger than --max-response allows");
    rec = answer_from_json(c->body, &why);
    if (!rec)
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST, why);
    status = rec->status;
    if (idemkey_store_key(span_from_cstr(c->prefix), scope, span_from_cstr(key), &store_key) < 0) {
        record_unref(rec);
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "out of memory");
    }
    w = waiter_new();
    err =
        w ? store_resolve(st, span_from_cstr(store_key), rec, c->ttl_ms, on_resolved, w) : -ENOMEM;
    record_unref(rec);
    if (err < 0 && w) {
        waiter_unref(w);
        waiter_unref(w);
    } else if (w) {
        err = waiter_wait(w);
        waiter_unref(w);
    }
    peer_address(conn, peer, sizeof(peer));
    if (err == 0)
        log_warn("key %s resolved by the operator at %s: completed with the answer given "
                 "(status %u); duplicates get it as a replay",
                 store_key, peer, status);
    free(store_key);
    if (err == -ENOENT)
        return reply_error(conn, PROBLEM_ADMIN_NOT_FOUND,
                           "no such key under this scope (expired, or never stored)");
    if (err == -EBUSY)
        return admin_keys_problem(conn, PROBLEM_ADMIN_CONFLICT,
                                  "The key's outcome is not unknown: it is in flight or completed "
                                  "(see GET /keys/<key>); only an unknown key takes an operator's "
                                  "answer.",
                                  NULL);
    if (err == -E2BIG)
        return reply_error(conn, PROBLEM_ADMIN_TOO_LARGE,
                           "the answer is larger than the store takes");
    if (err == -EIO) /* the sealing filter could not seal it (store_seal.h) */
        return reply_error(conn, PROBLEM_ADMIN_INTERNAL, "cannot seal the answer");
    if (err < 0)
        return reply_error(conn, PROBLEM_STORE_UNAVAILABLE, "the store is not answering");
    return reply_json(conn, 200, json_pack("{s:s}", "resolved", "completed"));
}

enum MHD_Result admin_keys_problem(struct MHD_Connection *conn, enum problem p, const char *detail,
                                   const char *allow)
{
    struct record *rec = problem_new(p, PROBLEM_DIALECT_PROBLEM, detail);
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (!rec)
        return MHD_NO;
    resp = MHD_create_response_from_buffer(rec->body.len, rec->body.data, MHD_RESPMEM_MUST_COPY);
    for (size_t i = 0; resp && i < rec->nheaders; i++)
        (void)MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value);
    if (resp && allow)
        (void)MHD_add_response_header(resp, "Allow", allow);
    if (resp && p == PROBLEM_ADMIN_UNAUTHORIZED)
        (void)MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"idemproxy admin\"");
    if (resp)
        (void)MHD_add_response_header(resp, "Cache-Control", "no-store");
    ret = resp ? MHD_queue_response(conn, problem_status(p), resp) : MHD_NO;
    MHD_destroy_response(resp);
    record_unref(rec);
    return ret;
}

enum MHD_Result admin_keys_serve(struct MHD_Connection *conn, struct store *st,
                                 const struct admin_keys_call *c)
{
    char key[KEY_MAX + 1];
    const char *body = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "body");
    const char *scope = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "scope");
    const char *method = c->method;
    bool is_get = strcmp(method, "GET") == 0, is_delete = strcmp(method, "DELETE") == 0,
         is_put = strcmp(method, "PUT") == 0;
    size_t path_len = strcspn(c->target, "?");

    if (!st)
        return reply_error(conn, PROBLEM_ADMIN_NOT_FOUND,
                           "enforcement is off (IDEMPOTENCY_ENABLED=false): no store");
    if (path_len == strlen(ADMIN_KEYS_LIST_PATH) &&
        memcmp(c->target, ADMIN_KEYS_LIST_PATH, path_len) == 0) {
        const char *resource = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "resource");

        if (!is_get)
            return admin_keys_problem(conn, PROBLEM_ADMIN_METHOD,
                                      "GET /keys?state=unknown or GET /keys?resource=ID", "GET");
        if (resource)
            return find_resource(conn, st, c->prefix, resource);
        return list_unknown(conn, st, c->prefix);
    }
    if (!is_get && !is_delete && !is_put)
        return admin_keys_problem(conn, PROBLEM_ADMIN_METHOD, "GET, DELETE or PUT",
                                  "GET, DELETE, PUT");
    if (decode_key(c->target, key) < 0)
        return reply_error(conn, PROBLEM_ADMIN_BAD_REQUEST,
                           "key: 1 to 255 bytes of 0x21-0x7E, as stored (unquoted), or a "
                           "composite key's parts joined by single spaces, percent-encoded in "
                           "the path");
    if (is_get)
        return list_keys(conn, st, c->prefix, key, body && strcmp(body, "1") == 0);
    if (is_put)
        return resolve_key(conn, st, c, key, scope);
    return purge_key(conn, st, c->prefix, key, scope);
}
