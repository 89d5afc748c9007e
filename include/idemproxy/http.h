/* SPDX-License-Identifier: MIT */
/* HTTP/1.1 grammar for what clients send (RFC 9110, RFC 9112): tokens, field
 * values, authorities, request-target forms, message framing. Pure functions
 * on borrowed bytes, any thread: they say what is well-formed and why not;
 * the pipeline decides what to answer. */
#ifndef IDEMPROXY_HTTP_H
#define IDEMPROXY_HTTP_H

#include "idemproxy/common.h"

/* One header field of a request, as received. */
struct http_header {
    struct span name, value;
};

/* True when <s> is an RFC 9110 token (a method, a field name): one or more
 * tchar. */
bool http_is_token(struct span s);

/* True when <s> is 1 to <max> visible ASCII characters (RFC 5234 VCHAR,
 * 0x21-0x7E): what a key, a request id and a resource id are. */
bool http_is_visible(struct span s, size_t max);

/* True when <v> may be a field value as received (RFC 9110 section 5.5): no
 * control byte but HTAB (no NUL, CR or LF), no DEL. obs-text (0x80-0xFF) is
 * allowed. */
bool http_is_field_value(struct span v);

/* True when <a> is an authority without user info (RFC 3986 uri-host and an
 * optional port): an IP-literal in brackets, or a reg-name / IPv4 of
 * unreserved, sub-delims and pct-encoded bytes, then ":" and digits. Empty
 * only when <allow_empty> (a Host field may be empty; an absolute-form target
 * may not). */
bool http_is_authority(struct span a, bool allow_empty);

/* True when <t> is a request target in origin-form as idemproxy forwards it:
 * '/' first, then no control byte, space, DEL or '#'. Other bytes outside
 * RFC 3986 (8-bit bytes, quotes, braces) are passed on as received, as most
 * servers do. */
bool http_is_origin_form(struct span t);

/* Percent-decodes <in> (RFC 3986 section 2.1) into <out>, which has room for
 * <in>.len bytes (decoding only shrinks). %00 decodes to a NUL like any other
 * byte: the caller judges what it may hold. Returns 0 with the decoded length
 * in <ret_len>, or -EINVAL for a '%' not followed by two hex digits. */
int http_percent_decode(struct span in, char *out, size_t *ret_len);

enum http_target_form {
    HTTP_TARGET_ORIGIN,   /* /path?query */
    HTTP_TARGET_ABSOLUTE, /* http://authority/path?query (or https) */
    HTTP_TARGET_ASTERISK, /* "*", OPTIONS only */
};

/* A request target, classified. */
struct http_target {
    enum http_target_form form;
    /* The path and query to forward, a view into the target: the target itself
     * (origin-form), what follows the authority (absolute-form: "", "/p?q" or
     * "?q"), or "*". */
    struct span path;
    bool needs_slash;      /* absolute-form whose path is "" or starts with '?': "/" goes first */
    struct span authority; /* absolute-form only: the Host it names */
};

/* Checks the request line's <method> and raw <target> (RFC 9112 section 3).
 * Returns NULL with the target in <ret>, or why the request is refused, with
 * the status in <ret_status>: 501 for CONNECT, 400 for a method that is not a
 * token, an asterisk-form target with another method than OPTIONS, an
 * absolute-form target with user info, an empty or malformed authority or a
 * malformed path, and any other form (authority-form, a bare word, control
 * bytes, space, '#'). <ret> is untouched on refusal. */
const char *http_check_request_line(struct span method, struct span target, struct http_target *ret,
                                    unsigned *ret_status);

/* Checks the <n> header fields <h> of a request (RFC 9110 section 5, RFC 9112
 * section 6): every name a token, every value a field value, at most one Host
 * (required when <host_required>, as for HTTP/1.1) and a valid one, and a
 * framing that no two parsers can read differently: at most one
 * Transfer-Encoding, not both it and Content-Length, Content-Length digits
 * only and the same in every copy. Returns NULL when the fields are clear, or
 * why not, with the status in <ret_status>: 501 for a transfer coding other
 * than chunked alone, 400 for the rest. */
const char *http_check_fields(const struct http_header *h, size_t n, bool host_required,
                              unsigned *ret_status);

/* ---- what upstreams send ---- */

/* Parses one response header line <line> as the upstream sent it, without
 * its CRLF or LF: a name of RFC 9110 tchar bytes, ':', then the value with the
 * optional whitespace around it trimmed. Returns 0 with views into <line> in
 * <ret_name> and <ret_value>, or -EINVAL (both untouched) when it is malformed:
 * no ':', an empty name or one holding a byte outside tchar (so an obs-fold
 * continuation, which starts with whitespace, is malformed), or a control
 * byte other than HTAB, or DEL, in the value. */
int http_parse_field_line(struct span line, struct span *ret_name, struct span *ret_value);

/* Checks one status line <line> as the upstream sent it, without its CRLF or
 * LF: "HTTP/" DIGIT "." DIGIT (or "HTTP/2", "HTTP/3"), SP, three digits from
 * 100, then the end or SP and any reason phrase. Returns 0 with the code in
 * <ret_status>, or -EINVAL (untouched). libcurl takes any line starting
 * with "HTTP/" for a 200 of an old server; this is what refuses that. */
int http_parse_status_line(struct span line, unsigned *ret_status);

/* True when <name> is a hop-by-hop header (Connection, Keep-Alive,
 * Proxy-Connection, Transfer-Encoding, TE, Trailer, Upgrade,
 * Proxy-Authenticate, Proxy-Authorization) or Content-Length. Case-insensitive. */
bool http_is_hop_by_hop(struct span name);

struct sockaddr;

/* Writes the IP address of <sa> (IPv4 or IPv6; NULL or another family:
 * nothing) into <out> (<len> bytes) as text, NUL-terminated; "" when none. */
void http_address_text(const struct sockaddr *sa, char *out, size_t len);

/* True when <name> is listed, case-insensitively, in the comma-separated
 * value <connection> of a Connection header (NULL: never). */
bool http_is_connection_listed(const char *connection, struct span name);

#endif
