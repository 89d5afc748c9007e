/* SPDX-License-Identifier: MIT */
/* HTTP/1.1 grammar for what clients send. Every byte a client sends is
 * hostile: these checks run before the request reaches libcurl (which would
 * parse a URL again and put field lines on the wire as C strings), the store
 * or the logs. Pure, any thread. */
#include "idemproxy/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>

/* tchar of RFC 9110 section 5.6.2 */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c && strchr("!#$%&'*+-.^_`|~", c);
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static bool is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool http_is_token(struct span s)
{
    for (size_t i = 0; i < s.len; i++) {
        if (!is_tchar((unsigned char)s.base[i]))
            return false;
    }
    return s.len > 0;
}

bool http_is_visible(struct span s, size_t max)
{
    if (!s.base || s.len == 0 || s.len > max)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        if ((unsigned char)s.base[i] < 0x21 || (unsigned char)s.base[i] > 0x7e)
            return false;
    }
    return true;
}

bool http_is_field_value(struct span v)
{
    for (size_t i = 0; i < v.len; i++) {
        unsigned char c = (unsigned char)v.base[i];

        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

static int hex_value(unsigned char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int http_percent_decode(struct span in, char *out, size_t *ret_len)
{
    size_t n = 0;

    for (size_t i = 0; i < in.len; i++) {
        char c = in.base[i];

        if (c == '%') {
            int hi = i + 2 < in.len ? hex_value((unsigned char)in.base[i + 1]) : -1;
            int lo = hi >= 0 ? hex_value((unsigned char)in.base[i + 2]) : -1;

            if (lo < 0)
                return -EINVAL;
            c = (char)(hi << 4 | lo);
            i += 2;
        }
        out[n++] = c;
    }
    *ret_len = n;
    return 0;
}

/* unreserved / sub-delims of RFC 3986, the bytes of a reg-name besides %XX */
static bool is_regname_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
           (c && strchr("-._~!$&'()*+,;=", c));
}

bool http_is_authority(struct span a, bool allow_empty)
{
    size_t i = 0, host_end;

    if (a.len == 0)
        return allow_empty;
    if (a.base[0] == '[') {
        /* IP-literal: hex digits, ':' and '.' (an IPv4 tail), or a vX. future form */
        for (i = 1; i < a.len && a.base[i] != ']'; i++) {
            unsigned char c = (unsigned char)a.base[i];

            if (!is_hex(c) && c != ':' && c != '.' && c != 'v' && c != 'V')
                return false;
        }
        if (i == a.len || i == 1)
            return false; /* no ']', or "[]" */
        host_end = i + 1;
    } else {
        for (; i < a.len && a.base[i] != ':'; i++) {
            unsigned char c = (unsigned char)a.base[i];

            if (c == '%') {
                if (i + 2 >= a.len || !is_hex((unsigned char)a.base[i + 1]) ||
                    !is_hex((unsigned char)a.base[i + 2]))
                    return false;
                i += 2;
            } else if (!is_regname_byte(c)) {
                return false; /* '@' (user info), '/', '?', '#', space, controls */
            }
        }
        host_end = i;
    }
    if (host_end == a.len)
        return true;
    if (a.base[host_end] != ':')
        return false;
    for (i = host_end + 1; i < a.len; i++) {
        if (!is_digit((unsigned char)a.base[i]))
            return false;
    }
    return true; /* "host:" with an empty port is allowed by RFC 3986 */
}

/* The bytes that may follow a path's first '/' as idemproxy forwards it. */
static bool is_path_tail(struct span t)
{
    for (size_t i = 0; i < t.len; i++) {
        unsigned char c = (unsigned char)t.base[i];

        if (c <= 0x20 || c == 0x7f || c == '#')
            return false; /* would split the request line, or a fragment */
    }
    return true;
}

bool http_is_origin_form(struct span t) { return t.len > 0 && t.base[0] == '/' && is_path_tail(t); }

static bool starts_nocase(struct span s, struct span prefix)
{
    return s.len >= prefix.len &&
           span_eq_nocase((struct span){ .base = s.base, .len = prefix.len }, prefix);
}

/* Absolute-form (RFC 9112 section 3.2.2): http or https, then an authority. */
static const char *parse_absolute(struct span target, struct http_target *ret)
{
    static const struct span http = SPAN_LIT("http://"), https = SPAN_LIT("https://");
    struct span rest, authority;
    size_t skip, end;

    if (starts_nocase(target, http))
        skip = http.len;
    else if (starts_nocase(target, https))
        skip = https.len;
    else
        return "a request target that is neither a path (/...) nor an http or https URL";
    rest = (struct span){ .base = target.base + skip, .len = target.len - skip };
    for (end = 0; end < rest.len; end++) {
        if (rest.base[end] == '/' || rest.base[end] == '?' || rest.base[end] == '#')
            break;
    }
    authority = (struct span){ .base = rest.base, .len = end };
    if (memchr(authority.base, '@', authority.len))
        return "an absolute-form target with user info (user@host)";
    if (!http_is_authority(authority, false))
        return "an absolute-form target whose authority is empty or malformed";
    rest.base += end;
    rest.len -= end;
    if (!is_path_tail(rest))
        return "an absolute-form target with a control byte, space or '#' in its path";
    *ret = (struct http_target){
        .form = HTTP_TARGET_ABSOLUTE,
        .path = rest,
        .needs_slash = rest.len == 0 || rest.base[0] != '/',
        .authority = authority,
    };
    return NULL;
}

const char *http_check_request_line(struct span method, struct span target, struct http_target *ret,
                                    unsigned *ret_status)
{
    struct http_target t = { .form = HTTP_TARGET_ORIGIN, .path = target };
    const char *why = NULL;

    *ret_status = 400;
    if (!http_is_token(method))
        return "a method that is not a token";
    if (method.len == 7 && memcmp(method.base, "CONNECT", 7) == 0) {
        *ret_status = 501;
        return "CONNECT: this is a reverse proxy, not a tunnel";
    }
    if (target.len == 1 && target.base[0] == '*') {
        if (method.len != 7 || memcmp(method.base, "OPTIONS", 7) != 0)
            return "an asterisk-form target (*) with another method than OPTIONS";
        t.form = HTTP_TARGET_ASTERISK;
    } else if (target.len > 0 && target.base[0] == '/') {
        if (!is_path_tail(target))
            return "a request target with a control byte, space or '#'";
    } else {
        why = parse_absolute(target, &t);
    }
    if (why)
        return why;
    *ret = t;
    return NULL;
}

static bool is_digits(struct span s)
{
    for (size_t i = 0; i < s.len; i++) {
        if (!is_digit((unsigned char)s.base[i]))
            return false;
    }
    return s.len > 0;
}

const char *http_check_fields(const struct http_header *h, size_t n, bool host_required,
                              unsigned *ret_status)
{
    const struct span *cl = NULL, *te = NULL, *host = NULL;

    *ret_status = 400;
    for (size_t i = 0; i < n; i++) {
        struct span name = h[i].name, value = h[i].value;

        if (!http_is_token(name))
            return "a header field name that is not a token (a space before its colon, or a "
                   "folded line)";
        if (!http_is_field_value(value))
            return "a header field value with a control byte (CR, LF, NUL, ...)";
        if (span_eq_nocase(name, SPAN_LIT("Content-Length"))) {
            if (!is_digits(value))
                return "a Content-Length that is not a number";
            if (cl && (cl->len != value.len || memcmp(cl->base, value.base, value.len) != 0))
                return "two different Content-Length values";
            cl = &h[i].value;
        } else if (span_eq_nocase(name, SPAN_LIT("Transfer-Encoding"))) {
            if (te)
                return "two Transfer-Encoding fields";
            te = &h[i].value;
        } else if (span_eq_nocase(name, SPAN_LIT("Host"))) {
            if (host)
                return "two Host fields";
            if (!http_is_authority(value, true))
                return "a Host field that is not host[:port]";
            host = &h[i].value;
        }
    }
    if (!host && host_required)
        return "an HTTP/1.1 request without a Host field";
    if (te && cl)
        return "both Content-Length and Transfer-Encoding";
    if (te && !span_eq_nocase(*te, SPAN_LIT("chunked"))) {
        *ret_status = 501;
        return "a transfer coding other than chunked";
    }
    return NULL;
}

/* ---- what upstreams send ---- */

static const struct span hop_by_hop[] = {
    SPAN_LIT("Connection"),
    SPAN_LIT("Keep-Alive"),
    SPAN_LIT("Proxy-Connection"),
    SPAN_LIT("Transfer-Encoding"),
    SPAN_LIT("TE"),
    SPAN_LIT("Trailer"),
    SPAN_LIT("Upgrade"),
    SPAN_LIT("Proxy-Authenticate"),
    SPAN_LIT("Proxy-Authorization"),
    SPAN_LIT("Content-Length"),
};

bool http_is_hop_by_hop(struct span name)
{
    for (size_t i = 0; i < ARRAY_SIZE(hop_by_hop); i++) {
        if (span_eq_nocase(hop_by_hop[i], name))
            return true;
    }
    return false;
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

int http_parse_field_line(struct span line, struct span *ret_name, struct span *ret_value)
{
    const char *colon = line.len ? memchr(line.base, ':', line.len) : NULL;
    struct span name, value;

    if (!colon || colon == line.base)
        return -EINVAL; /* includes obs-fold, which starts with OWS */
    name = (struct span){ .base = line.base, .len = (size_t)(colon - line.base) };
    if (!http_is_token(name))
        return -EINVAL;
    value = (struct span){ .base = colon + 1, .len = line.len - name.len - 1 };
    while (value.len > 0 && is_ows(value.base[0])) {
        value.base++;
        value.len--;
    }
    while (value.len > 0 && is_ows(value.base[value.len - 1]))
        value.len--;
    if (!http_is_field_value(value))
        return -EINVAL; /* a stray CR or NUL would split or cut the replayed header */
    *ret_name = name;
    *ret_value = value;
    return 0;
}

int http_parse_status_line(struct span line, unsigned *ret_status)
{
    const char *p = line.base;
    size_t at, n = line.len;
    unsigned code;

    if (n < 5 || memcmp(p, "HTTP/", 5) != 0)
        return -EINVAL;
    if (n >= 8 && is_digit((unsigned char)p[5]) && p[6] == '.' && is_digit((unsigned char)p[7]))
        at = 8; /* HTTP/1.1 */
    else if (n >= 6 && (p[5] == '2' || p[5] == '3'))
        at = 6; /* HTTP/2, as curl writes it */
    else
        return -EINVAL;
    if (n < at + 4 || p[at] != ' ' || !is_digit((unsigned char)p[at + 1]) ||
        !is_digit((unsigned char)p[at + 2]) || !is_digit((unsigned char)p[at + 3]))
        return -EINVAL;
    if (n > at + 4 && p[at + 4] != ' ')
        return -EINVAL; /* a fourth digit, or anything glued to the code */
    code = (unsigned)(p[at + 1] - '0') * 100 + (unsigned)(p[at + 2] - '0') * 10 +
           (unsigned)(p[at + 3] - '0');
    if (code < 100)
        return -EINVAL;
    *ret_status = code;
    return 0;
}

bool http_is_connection_listed(const char *connection, struct span name)
{
    const char *p = connection;

    if (!connection)
        return false;
    while (*p) {
        const char *end = strchr(p, ',');
        struct span tok;

        if (!end)
            end = p + strlen(p);
        tok = (struct span){ .base = p, .len = (size_t)(end - p) };
        while (tok.len && is_ows(tok.base[0])) {
            tok.base++;
            tok.len--;
        }
        while (tok.len && is_ows(tok.base[tok.len - 1]))
            tok.len--;
        if (tok.len && span_eq_nocase(tok, name))
            return true;
        p = *end ? end + 1 : end;
    }
    return false;
}

void http_address_text(const struct sockaddr *sa, char *out, size_t len)
{
    out[0] = '\0';
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)len);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out,
                  (socklen_t)len);
}
