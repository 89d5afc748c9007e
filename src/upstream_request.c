/* SPDX-License-Identifier: MIT */
/* What every upstream exchange is made of before it leaves, pure: the
 * upstream URL's parts, the request line's target, and the header list sent
 * (hop-by-hop fields dropped, X-Forwarded-* and the request id set). Any
 * thread; the header list with a caller's scratch buffers. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "idemproxy/buf.h"
#include "idemproxy/flow.h"
#include "idemproxy/http.h"
#include "idemproxy/resolve.h"
#include "idemproxy/upstream.h"

#include "upstream_impl.h"

/* Appends "<name>: <value>", or "<name>;" for an empty value (curl's syntax:
 * "<name>:" would remove the header instead). */
struct curl_lines {
    struct curl_slist *list;
    struct buf *scratch; /* reused */
};

static int add_line(void *ctx, struct span name, struct span value)
{
    struct curl_lines *c = ctx;
    struct buf *scratch = c->scratch;
    struct curl_slist *l;

    scratch->len = 0;
    if (buf_append(scratch, name.base, name.len) < 0 ||
        (value.len ? buf_append(scratch, ": ", 2) : buf_append(scratch, ";", 1)) < 0 ||
        buf_append(scratch, value.base, value.len) < 0 || buf_append(scratch, "", 1) < 0)
        return -ENOMEM;
    l = curl_slist_append(c->list, scratch->data);
    if (!l)
        return -ENOMEM;
    c->list = l;
    return 0;
}

/* Appends a raw line such as "Expect:" that tells curl to leave a header out. */
static int add_raw(struct curl_lines *c, const char *line)
{
    struct curl_slist *l = curl_slist_append(c->list, line);

    if (!l)
        return -ENOMEM;
    c->list = l;
    return 0;
}

/* Appends <s> to <b>, after ", " unless <b> is empty. */
static int join(struct buf *b, struct span s)
{
    if (b->len > 0 && buf_append(b, ", ", 2) < 0)
        return -ENOMEM;
    return buf_append(b, s.base, s.len) < 0 ? -ENOMEM : 0;
}

/* Whether the client's field <name> is left out: hop-by-hop, named in
 * Connection (<conn>), Expect, or one the proxy sets itself. */
static bool left_out(const struct upstream_request *req, const char *conn, struct span name)
{
    static const struct span h_expect = SPAN_LIT("Expect"), h_xfp = SPAN_LIT("X-Forwarded-Proto"),
                             h_xfh = SPAN_LIT("X-Forwarded-Host");

    static const struct span h_traceparent = SPAN_LIT("traceparent");

    return http_is_hop_by_hop(name) || http_is_connection_listed(conn, name) ||
           span_eq_nocase(name, h_expect) || span_eq_nocase(name, h_xfp) ||
           span_eq_nocase(name, h_xfh) ||
           (req->id_header.len > 0 && span_eq_nocase(name, req->id_header)) ||
           (req->traceparent && span_eq_nocase(name, h_traceparent));
}

int upstream_each_field(const struct upstream_request *req, struct upstream_scratch *s,
                        upstream_field_fn *fn, void *ctx, struct upstream_fields_seen *seen)
{
    static const struct span h_connection = SPAN_LIT("Connection"),
                             h_xff = SPAN_LIT("X-Forwarded-For"),
                             h_xfp = SPAN_LIT("X-Forwarded-Proto"),
                             h_xfh = SPAN_LIT("X-Forwarded-Host"), h_host = SPAN_LIT("Host"),
                             h_accept = SPAN_LIT("Accept"), h_ctype = SPAN_LIT("Content-Type");
    struct buf *conn = &s->conn, *xff = &s->xff;
    const struct span *host = req->host.base ? &req->host : NULL;
    int r;

    *seen = (struct upstream_fields_seen){ 0 };
    conn->len = xff->len = 0;
    /* Every Connection header counts, as if they were one comma-separated list. */
    for (size_t i = 0; i < req->nheaders; i++) {
        if (span_eq_nocase(req->headers[i].name, h_connection) &&
            join(conn, req->headers[i].value) < 0)
            return -ENOMEM;
    }
    if (buf_append(conn, "", 1) < 0)
        return -ENOMEM;

    for (size_t i = 0; i < req->nheaders; i++) {
        const struct http_header *h = &req->headers[i];

        if (left_out(req, conn->data, h->name))
            continue;
        if (span_eq_nocase(h->name, h_xff)) {
            if (h->value.len > 0 && join(xff, h->value) < 0)
                return -ENOMEM;
            continue; /* one merged X-Forwarded-For goes out below */
        }
        if (span_eq_nocase(h->name, h_host)) {
            if (req->host.base)
                continue; /* replaced by the absolute-form target's authority, below */
            host = &h->value;
            seen->host = true;
        }
        seen->accept = seen->accept || span_eq_nocase(h->name, h_accept);
        seen->content_type = seen->content_type || span_eq_nocase(h->name, h_ctype);
        if ((r = fn(ctx, h->name, h->value)) < 0)
            return r;
    }
    if (req->host.base) {
        if ((r = fn(ctx, h_host, req->host)) < 0)
            return r;
        seen->host = true;
    }
    if (req->client_ip && join(xff, span_from_cstr(req->client_ip)) < 0)
        return -ENOMEM;
    if (xff->len > 0 && (r = fn(ctx, h_xff, buf_span(xff))) < 0)
        return r;
    if ((r = fn(ctx, h_xfp, span_from_cstr(req->proto ? req->proto : "http"))) < 0)
        return r;
    if (host && (r = fn(ctx, h_xfh, *host)) < 0)
        return r;
    if (req->id_header.len > 0 && (r = fn(ctx, req->id_header, req->id)) < 0)
        return r;
    if (req->traceparent &&
        (r = fn(ctx, span_from_cstr("traceparent"), span_from_cstr(req->traceparent))) < 0)
        return r;
    return 0;
}

int upstream_build_headers(const struct upstream_request *req, struct upstream_scratch *s,
                           struct curl_slist **ret)
{
    struct curl_lines c = { .scratch = &s->line };
    struct upstream_fields_seen seen;
    int r = upstream_each_field(req, s, add_line, &c, &seen);

    /* Keep curl from inventing headers the client did not send. */
    if (r == 0 &&
        ((!seen.accept && add_raw(&c, "Accept:") < 0) ||
         (!seen.content_type && add_raw(&c, "Content-Type:") < 0) || add_raw(&c, "Expect:") < 0))
        r = -ENOMEM;
    if (r < 0) {
        curl_slist_free_all(c.list);
        return r;
    }
    *ret = c.list;
    return 0;
}

enum upstream_framing upstream_body_framing(const struct upstream_request *req, uint64_t *ret_len)
{
    *ret_len = 0;
    if (upstream_method_is(req->method, "HEAD") ||
        (upstream_method_is(req->method, "GET") && req->body.len == 0 && !req->body_flow))
        return UPSTREAM_NO_BODY;
    if (req->body_flow) {
        uint64_t len = req->body_flow->length;

        if (len == FLOW_LENGTH_UNKNOWN || len > INT64_MAX)
            return UPSTREAM_CHUNKED;
        *ret_len = len;
        return UPSTREAM_LENGTH;
    }
    /* An empty body of a method that carries one still says Content-Length: 0. */
    if (req->body.len > 0 || upstream_method_is(req->method, "POST") ||
        upstream_method_is(req->method, "PUT") || upstream_method_is(req->method, "PATCH")) {
        *ret_len = req->body.len;
        return UPSTREAM_LENGTH;
    }
    return UPSTREAM_NO_BODY;
}

int upstream_base_parse(const char *url, struct upstream_base *ret)
{
    static const CURLUPart gone[] = { CURLUPART_USER, CURLUPART_PASSWORD, CURLUPART_OPTIONS,
                                      CURLUPART_QUERY, CURLUPART_FRAGMENT };
    CURLU *u = curl_url();
    char *scheme = NULL, *path = NULL, *origin = NULL, *prefix = NULL, *part;
    const char *authority;
    size_t len;
    int r = -EINVAL;

    if (!u)
        return -ENOMEM;
    /* libcurl reads "http:///api" as the host "api": an authority must be there. */
    authority = url ? strstr(url, "://") : NULL;
    if (!authority || strchr("/:?#", authority[3]))
        goto out;
    if (curl_url_set(u, CURLUPART_URL, url, CURLU_PATH_AS_IS) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
        goto out;
    for (size_t i = 0; i < ARRAY_SIZE(gone); i++) {
        part = NULL;
        if (curl_url_get(u, gone[i], &part, 0) == CURLUE_OK) {
            curl_free(part);
            goto out; /* user info, query or fragment: no place in an upstream */
        }
    }
    if (curl_url_get(u, CURLUPART_HOST, &part, 0) != CURLUE_OK)
        goto out;
    curl_free(part);
    if (curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
        goto out;
    r = -ENOMEM;
    if (curl_url_set(u, CURLUPART_PATH, "/", 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_URL, &part, 0) != CURLUE_OK)
        goto out;
    origin = strdup(part);
    curl_free(part);
    len = strlen(path);
    while (len > 0 && path[len - 1] == '/')
        len--; /* the target brings its own '/' */
    prefix = strndup(path, len);
    if (!origin || !prefix)
        goto out;
    *ret = (struct upstream_base){ .origin = origin, .prefix = prefix };
    origin = prefix = NULL;
    r = 0;
out:
    free(origin);
    free(prefix);
    curl_free(scheme);
    curl_free(path);
    curl_url_cleanup(u);
    return r;
}

int upstream_base_resolve(const char *url, char *why, size_t why_len)
{
    CURLU *u = curl_url();
    char *host = NULL;
    struct resolve_addr a;
    size_t len;
    int r = -ENOMEM, g = 0;

    if (!u)
        return -ENOMEM;
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK)
        goto out;
    len = strlen(host);
    if (len >= 2 && host[0] == '[') { /* an IPv6 address: no lookup to speak of */
        r = 0;
        goto out;
    }
    r = resolve_host(host, NULL, 0, &a, 1, &g) == 1 ? 0 : -ENOENT;
    if (r < 0)
        snprintf(why, why_len, "the host %s does not resolve now (%s)", host,
                 g ? gai_strerror(g) : "no address");
out:
    curl_free(host);
    curl_url_cleanup(u);
    return r;
}

void upstream_base_done(struct upstream_base *b)
{
    if (!b)
        return;
    free(b->origin);
    free(b->prefix);
    b->origin = b->prefix = NULL;
}

int upstream_request_target(struct span prefix, struct span target, struct buf *out)
{
    size_t start = out->len;
    bool asterisk = target.len == 1 && target.base[0] == '*';
    int r;

    if (!asterisk && !http_is_origin_form(target))
        return -EINVAL;
    if (asterisk && prefix.len > 0)
        target = (struct span){ .base = "", .len = 0 };
    r = buf_append(out, prefix.base, prefix.len);
    if (r == 0)
        r = buf_append(out, target.base, target.len);
    if (r == 0)
        r = buf_append(out, "", 1);
    if (r < 0)
        out->len = start;
    return r;
}
