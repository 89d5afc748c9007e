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

static enum MHD_Result reply_error(struct MHD_Connection *conn, unsigned status, const char *msg)
{
    return reply_json(conn, status, json_pack("{s:s}", "error", msg));
}

/* The longest key the proxy stores: a composite of CONFIG_MAX_LIST header
 * values of IDEMKEY_MAX bytes, one space apart (SPEC §6). */
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

static json_t *info_json(const struct store_info *info, size_t prefix_len, bool with_body)
{
    json_t *o = json_pack("{s:s, s:s#, s:s, s:s, s:I, s:I}", "store_key", info->store_key, "scope",
                          info->store_key + prefix_len, (int)IDEMKEY_SCOPE_HEX, "state",
                          info->completed ? "completed"
                          : info->unknown ? "unknown"
                                          : "locked",
                          "fingerprint", info->fp_hex, "age_ms", (json_int_t)info->age_ms,
                          "ttl_ms", (json_int_t)info->ttl_ms);

    if (o && !info->completed && !info->unknown)
        json_object_set_new(o, "lease_ms", json_integer((json_int_t)info->lease_ms));
    if (o && info->unknown) {
        json_object_set_new(o, "cause", json_string(store_cause_name(info->cause)));
        if (info->about)
            about_json(o, info->about);
    }
    if (!o || !info->completed || !info->rec)
        return o;
    json_object_set_new(o, "status", json_integer(info->rec->status));
    json_object_set_new(o, "too_large", json_boolean(info->rec->too_large));
    if (with_body) {
        json_t *hs = json_array();

        for (size_t i = 0; hs && i < info->rec->nheaders; i++)
            json_array_append_new(
                hs, json_pack("[s,s]", info->rec->headers[i].name, info->rec->headers[i].value));
        json_object_set_new(o, "headers", hs);
        json_object_set_new(o, "body_base64", base64_json(&info->rec->body));
    }
    return o;
}

static enum MHD_Result list_keys(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *key, bool with_body)
{
    struct waiter *w = waiter_new();
    json_t *records;
    int err;

    if (!w)
        return reply_error(conn, 500, "out of memory");
    err = store_inspect(st, span_from_cstr(prefix), span_from_cstr(key), with_body, on_listed, w);
    if (err < 0) {
        waiter_unref(w);
        waiter_unref(w);
        return reply_error(conn, 503, "the store refused the call");
    }
    err = waiter_wait(w);
    if (err < 0) {
        waiter_unref(w);
        return reply_error(conn, 503,
                           err == -ETIMEDOUT ? "the store did not answer in time"
                                             : "the store is not answering");
    }
    records = json_array();
    for (size_t i = 0; records && i < w->list.n; i++)
        json_array_append_new(records, info_json(&w->list.items[i], strlen(prefix), with_body));
    waiter_unref(w);
    return reply_json(conn, 200, json_pack("{s:s, s:o}", "key", key, "records", records));
}

static enum MHD_Result purge_key(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *key, const char *scope)
{
    struct waiter *w;
    char *store_key;
    int err;

    if (!scope || !idemkey_is_scope(span_from_cstr(scope)))
        return reply_error(conn, 400,
                           "scope: give ?scope=<the 32 hex characters shown by GET /keys/<key>>");
    if (idemkey_store_key(span_from_cstr(prefix), scope, span_from_cstr(key), &store_key) < 0)
        return reply_error(conn, 500, "out of memory");
    w = waiter_new();
    if (!w) {
        free(store_key);
        return reply_error(conn, 500, "out of memory");
    }
    err = store_purge(st, span_from_cstr(store_key), on_purged, w);
    if (err < 0) {
        waiter_unref(w);
        waiter_unref(w);
    } else {
        err = waiter_wait(w);
        waiter_unref(w);
    }
    if (err == -ENOENT) {
        free(store_key);
        return reply_error(conn, 404, "no such key under this scope (expired, or never stored)");
    }
    if (err < 0) {
        free(store_key);
        return reply_error(conn, 503, "the store is not answering");
    }
    {
        json_t *o = json_pack("{s:s}", "deleted", store_key);

        free(store_key);
        return reply_json(conn, 200, o);
    }
}

enum MHD_Result admin_keys_serve(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *target, const char *method)
{
    char key[KEY_MAX + 1];
    const char *body = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "body");
    bool is_get = strcmp(method, "GET") == 0, is_delete = strcmp(method, "DELETE") == 0;

    if (!is_get && !is_delete)
        return reply_error(conn, 405, "GET or DELETE");
    if (!st)
        return reply_error(conn, 404, "enforcement is off (IDEMPOTENCY_ENABLED=false): no store");
    if (decode_key(target, key) < 0)
        return reply_error(conn, 400,
                           "key: 1 to 255 bytes of 0x21-0x7E, as stored (unquoted), or a "
                           "composite key's parts joined by single spaces, percent-encoded in "
                           "the path");
    if (is_get)
        return list_keys(conn, st, prefix, key, body && strcmp(body, "1") == 0);
    return purge_key(conn, st, prefix, key,
                     MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "scope"));
}
