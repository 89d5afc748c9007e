/* SPDX-License-Identifier: MIT */
/* Canonical JSON (canonjson.h). A scanner of its own rather than jansson:
 * jansson turns every number into a json_int_t or a double (the literal,
 * which must stay when no double says it, is gone) and cannot tell a name's
 * duplicate apart once \u escapes differ as reliably as a sort of the names
 * as UTF-16 does. The body is scanned once into a flat array of values, in
 * order, without recursion (an open container keeps its parent's index where
 * its end will go); then each object's names are sorted and the values
 * written, recursing at most <max_depth> levels. */
#include "idemproxy/canonjson.h"

#include <assert.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/buf.h"
#include "idemproxy/keysource.h"

#define NONE UINT32_MAX
/* The widest decimal exponent a double's shortest text has (5e-324, and 17
 * digits below 1e-307 give down to -340); past it no literal can equal one. */
#define EXP_LIMIT 400

/* One value of the body: where it starts (its first byte tells its kind) and,
 * for an array or object, the index past its last descendant. A member is two
 * values in a row: its name (a string) then its value. */
struct node {
    uint32_t at;
    uint32_t end; /* while the container is open: its parent's index */
};

struct scan {
    const unsigned char *s;
    size_t len, pos;
    struct buf nodes; /* struct node[], owned */
};

/* Where a pointer of <ignore> stands on the path being written. */
struct ptr_state {
    size_t depth; /* tokens matched by the path so far */
    size_t at;    /* offset of the '/' that starts the next token */
};

struct writer {
    const unsigned char *s;
    size_t len;
    const struct node *nodes;
    struct buf *out;
    struct buf order; /* uint32_t: the names of the objects being written, owned */
    const char *const *ignore;
    struct ptr_state *ptrs; /* one per pointer, owned */
    size_t nignore;
    unsigned mute; /* > 0 inside a removed value: checked, not written */
    bool full;     /* <out> reached its limit: the rest is checked, not written */
};

/* ------------------------------------------------------------------ UTF-8 and strings */

/* Decodes the well-formed UTF-8 sequence (RFC 3629: no overlong form, no
 * surrogate, nothing past U+10FFFF) at <s>, of at most <avail> bytes. Returns
 * its length, or 0 when it is not one. */
static size_t utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp)
{
    unsigned char b = s[0], lo = 0x80, hi = 0xbf;
    size_t n;
    uint32_t v;

    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xc2 && b <= 0xdf) {
        n = 2;
        v = b & 0x1fu;
    } else if (b >= 0xe0 && b <= 0xef) {
        n = 3;
        v = b & 0x0fu;
        lo = b == 0xe0 ? 0xa0 : 0x80;
        hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
        n = 4;
        v = b & 0x07u;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3fu);
    }
    *cp = v;
    return n;
}

static size_t utf8_encode(uint32_t cp, unsigned char *u)
{
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (unsigned char)(0xc0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (unsigned char)(0xe0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        u[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    u[0] = (unsigned char)(0xf0 | cp >> 18);
    u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    u[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The four hex digits at <s> (<avail> bytes), or -1. */
static long hex4(const unsigned char *s, size_t avail)
{
    long v = 0;

    if (avail < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d;

        if (c >= '0' && c <= '9')
            d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            d = (c | 0x20) - 'a' + 10;
        else
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The escape at s[*pos] (its '\\'): the code point it stands for, a
 * surrogate pair's escapes taken together. Returns 0 or -EINVAL. */
static int unescape(const unsigned char *s, size_t len, size_t *pos, uint32_t *cp)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    size_t i = *pos + 1;
    const char *e;
    long hi, lo;

    if (i >= len)
        return -EINVAL;
    if (s[i] != 'u') {
        e = s[i] ? strchr(from, s[i]) : NULL;
        if (!e)
            return -EINVAL;
        *cp = (unsigned char)to[e - from];
        *pos = i + 1;
        return 0;
    }
    hi = hex4(s + i + 1, len - i - 1);
    if (hi < 0 || (hi >= 0xdc00 && hi <= 0xdfff))
        return -EINVAL; /* a low surrogate alone */
    i += 5;
    if (hi >= 0xd800 && hi <= 0xdbff) {
        if (len - i < 6 || s[i] != '\\' || s[i + 1] != 'u')
            return -EINVAL; /* a high surrogate alone */
        lo = hex4(s + i + 2, len - i - 2);
        if (lo < 0xdc00 || lo > 0xdfff)
            return -EINVAL;
        hi = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
        i += 6;
    }
    *cp = (uint32_t)hi;
    *pos = i;
    return 0;
}

/* The character of the string at s[*pos] (not its closing quote): its code
 * point, *pos moved past it. Returns 0 or -EINVAL (a control byte, an invalid
 * escape or sequence, the end of the body). */
static int str_char(const unsigned char *s, size_t len, size_t *pos, uint32_t *cp)
{
    size_t n;

    if (*pos >= len || s[*pos] < 0x20)
        return -EINVAL;
    if (s[*pos] == '\\')
        return unescape(s, len, pos, cp);
    n = utf8_decode(s + *pos, len - *pos, cp);
    if (n == 0)
        return -EINVAL;
    *pos += n;
    return 0;
}

/* The first UTF-16 code unit of <cp>: names sort by these (RFC 8785 §3.2.3). */
static uint32_t utf16_first(uint32_t cp)
{
    return cp < 0x10000 ? cp : 0xd800 + ((cp - 0x10000) >> 10);
}

/* Compares the (scanned) strings at <a> and <b> as arrays of UTF-16 code
 * units. */
static int name_cmp(const unsigned char *s, size_t len, uint32_t a, uint32_t b)
{
    size_t i = a + 1, j = b + 1;

    for (;;) {
        bool end_a = s[i] == '"', end_b = s[j] == '"';
        uint32_t x = 0, y = 0; /* set by str_char(): a scanned string cannot fail */

        if (end_a || end_b)
            return end_a && end_b ? 0 : end_a ? -1 : 1;
        if (s[i] == s[j] && s[i] < 0x80 && s[i] != '\\') {
            i++, j++; /* the common case: the same ASCII character */
            continue;
        }
        (void)str_char(s, len, &i, &x); /* scanned: cannot fail */
        (void)str_char(s, len, &j, &y);
        if (x != y) {
            if (utf16_first(x) != utf16_first(y))
                return utf16_first(x) < utf16_first(y) ? -1 : 1;
            return x < y ? -1 : 1; /* two astral characters: their low units decide */
        }
    }
}

/* ------------------------------------------------------------------ the scan */

static int scan_string(struct scan *sc)
{
    uint32_t cp;

    sc->pos++; /* the opening quote */
    while (sc->pos < sc->len && sc->s[sc->pos] != '"') {
        if (sc->s[sc->pos] >= 0x20 && sc->s[sc->pos] < 0x80 && sc->s[sc->pos] != '\\') {
            sc->pos++;
            continue;
        }
        if (str_char(sc->s, sc->len, &sc->pos, &cp) < 0)
            return -EINVAL;
    }
    if (sc->pos >= sc->len)
        return -EINVAL;
    sc->pos++;
    return 0;
}

static size_t digits(const unsigned char *s, size_t len, size_t i)
{
    size_t k = i;

    while (k < len && s[k] >= '0' && s[k] <= '9')
        k++;
    return k - i;
}

/* RFC 8259 §6: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int scan_number(struct scan *sc)
{
    const unsigned char *s = sc->s;
    size_t i = sc->pos, n;

    if (s[i] == '-')
        i++;
    n = digits(s, sc->len, i);
    if (n == 0 || (n > 1 && s[i] == '0'))
        return -EINVAL;
    i += n;
    if (i < sc->len && s[i] == '.') {
        n = digits(s, sc->len, i + 1);
        if (n == 0)
            return -EINVAL;
        i += 1 + n;
    }
    if (i < sc->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < sc->len && (s[i] == '+' || s[i] == '-'))
            i++;
        n = digits(s, sc->len, i);
        if (n == 0)
            return -EINVAL;
        i += n;
    }
    sc->pos = i;
    return 0;
}

static int scan_word(struct scan *sc, const char *w)
{
    size_t n = strlen(w);

    if (sc->len - sc->pos < n || memcmp(sc->s + sc->pos, w, n) != 0)
        return -EINVAL;
    sc->pos += n;
    return 0;
}

static void skip_ws(struct scan *sc)
{
    while (sc->pos < sc->len && (sc->s[sc->pos] == ' ' || sc->s[sc->pos] == '\t' ||
                                 sc->s[sc->pos] == '\n' || sc->s[sc->pos] == '\r'))
        sc->pos++;
}

static struct node *node_at(struct scan *sc, uint32_t i)
{
    return (struct node *)(void *)sc->nodes.data + i;
}

/* Adds the value that starts at sc->pos. Returns its index or a negative errno. */
static int64_t add_node(struct scan *sc)
{
    uint32_t i = (uint32_t)(sc->nodes.len / sizeof(struct node));
    struct node n = { .at = (uint32_t)sc->pos, .end = i + 1 };
    int r = buf_append(&sc->nodes, &n, sizeof(n));

    return r < 0 ? r : (int64_t)i;
}

/* A scalar value at sc->pos (after a member's name and ':', or where a
 * value is due). */
static int scan_scalar(struct scan *sc)
{
    switch (sc->s[sc->pos]) {
    case '"':
        return scan_string(sc);
    case 't':
        return scan_word(sc, "true");
    case 'f':
        return scan_word(sc, "false");
    case 'n':
        return scan_word(sc, "null");
    default:
        return scan_number(sc);
    }
}

/* A member's name and its ':', at sc->pos after '{' or ','. */
static int scan_name(struct scan *sc)
{
    int64_t r;

    skip_ws(sc);
    if (sc->pos >= sc->len || sc->s[sc->pos] != '"')
        return -EINVAL;
    r = add_node(sc);
    if (r < 0)
        return (int)r;
    if (scan_string(sc) < 0)
        return -EINVAL;
    skip_ws(sc);
    if (sc->pos >= sc->len || sc->s[sc->pos] != ':')
        return -EINVAL;
    sc->pos++;
    return 0;
}

/* After a value: a ',' (then a name when in an object), or closes of
 * containers, or the end of the body. Returns 1 when a value is due next, 0
 * at the end of the document, or -EINVAL. */
static int scan_after(struct scan *sc, uint32_t *open, size_t *depth)
{
    for (;;) {
        unsigned char opener, c;
        uint32_t parent;
        int r;

        skip_ws(sc);
        if (*open == NONE)
            return sc->pos == sc->len ? 0 : -EINVAL;
        if (sc->pos >= sc->len)
            return -EINVAL;
        opener = sc->s[node_at(sc, *open)->at];
        c = sc->s[sc->pos++];
        if (c == ',') {
            r = opener == '{' ? scan_name(sc) : 0;
            return r < 0 ? r : 1;
        }
        if (c != (opener == '{' ? '}' : ']'))
            return -EINVAL;
        parent = node_at(sc, *open)->end;
        node_at(sc, *open)->end = (uint32_t)(sc->nodes.len / sizeof(struct node));
        *open = parent;
        (*depth)--;
    }
}

/* Scans the body into sc->nodes, without recursion. Returns 0, -EINVAL,
 * -ENOMEM. */
static int scan_document(struct scan *sc, size_t max_depth)
{
    uint32_t open = NONE;
    size_t depth = 0;
    int r;

    for (;;) {
        int64_t i;
        unsigned char c;

        skip_ws(sc);
        if (sc->pos >= sc->len)
            return -EINVAL;
        i = add_node(sc);
        if (i < 0)
            return (int)i;
        c = sc->s[sc->pos];
        if (c == '{' || c == '[') {
            if (++depth > max_depth)
                return -EINVAL;
            node_at(sc, (uint32_t)i)->end = open;
            open = (uint32_t)i;
            sc->pos++;
            skip_ws(sc);
            if (sc->pos < sc->len && sc->s[sc->pos] == (c == '{' ? '}' : ']'))
                r = 2; /* empty: scan_after() closes it */
            else
                r = c == '{' ? scan_name(sc) : 0;
            if (r < 0)
                return r;
            if (r == 0)
                continue;
        } else if (scan_scalar(sc) < 0) {
            return -EINVAL;
        }
        r = scan_after(sc, &open, &depth);
        if (r <= 0)
            return r;
    }
}

/* ------------------------------------------------------------------ numbers */

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale_obj;

static void c_locale_init(void) { c_locale_obj = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

/* The "C" locale (strtod and printf's '.'), or (locale_t)0 without memory. */
static locale_t c_locale(void)
{
    (void)pthread_once(&c_locale_once, c_locale_init);
    return c_locale_obj;
}

/* A decimal: <n> digits (no leading or trailing zero; 0 for zero) times ten
 * to the <exp>. */
struct decimal {
    char dig[18];
    size_t n;
    long exp;
};

/* Reads printf's "%.*e" text of a double (d.ddde±x, in any locale's radix
 * character) into <ret>, trailing zeros kept. */
static void read_e(const char *t, struct decimal *ret)
{
    ret->n = 0;
    for (; *t != 'e'; t++) {
        if (*t >= '0' && *t <= '9')
            ret->dig[ret->n++] = *t;
    }
    ret->exp = strtol(t + 1, NULL, 10) - (long)ret->n + 1;
}

static void strip_zeros(struct decimal *dec)
{
    while (dec->n > 1 && dec->dig[dec->n - 1] == '0') {
        dec->n--;
        dec->exp++;
    }
}

/* <dec> plus one unit in its last digit, when that keeps its digit count. */
static bool next_up(const struct decimal *dec, struct decimal *ret)
{
    *ret = *dec;
    for (size_t i = dec->n; i-- > 0;) {
        if (ret->dig[i] != '9') {
            ret->dig[i]++;
            return true;
        }
        ret->dig[i] = '0';
    }
    return false; /* 99..9 + 1: fewer digits, which were tried first */
}

static double decimal_value(const struct decimal *dec)
{
    char t[48];

    snprintf(t, sizeof(t), "%.*se%ld", (int)dec->n, dec->dig, dec->exp);
    return strtod(t, NULL);
}

/* The digits ECMAScript's Number::toString writes for the finite <d> > 0:
 * the fewest that read back as <d>, the nearest to <d> among those (printf
 * rounds to it, ties to even). printf's nearest can miss only below a power
 * of two, where the doubles below are twice as dense as those above: then the
 * next one up may read back though the nearest did not. In the current
 * locale (the caller's "C"). */
static void shortest(double d, struct decimal *ret)
{
    char t[48];
    struct decimal up;
    int e;

    for (int p = 1; p < 17; p++) {
        snprintf(t, sizeof(t), "%.*e", p - 1, d);
        if (strtod(t, NULL) == d) {
            read_e(t, ret);
            strip_zeros(ret);
            return;
        }
        if (frexp(d, &e) == 0.5 && strtod(t, NULL) < d) {
            read_e(t, ret);
            if (next_up(ret, &up) && decimal_value(&up) == d) {
                *ret = up;
                strip_zeros(ret);
                return;
            }
        }
    }
    snprintf(t, sizeof(t), "%.16e", d); /* 17 digits always read back */
    read_e(t, ret);
    strip_zeros(ret);
}

/* Lays out <neg> <dec> as Number::toString does (ECMA-262, 6.1.6.1.20). */
static size_t es_layout(bool neg, const struct decimal *dec, char *out)
{
    long k = (long)dec->n, n = dec->exp + k;
    size_t o = 0;

    if (neg)
        out[o++] = '-';
    if (k <= n && n <= 21) {
        memcpy(out + o, dec->dig, (size_t)k);
        o += (size_t)k;
        memset(out + o, '0', (size_t)(n - k));
        o += (size_t)(n - k);
    } else if (0 < n && n <= 21) {
        memcpy(out + o, dec->dig, (size_t)n);
        out[o + (size_t)n] = '.';
        memcpy(out + o + (size_t)n + 1, dec->dig + n, (size_t)(k - n));
        o += (size_t)k + 1;
    } else if (-6 < n && n <= 0) {
        memcpy(out + o, "0.", 2);
        memset(out + o + 2, '0', (size_t)-n);
        memcpy(out + o + 2 + (size_t)-n, dec->dig, (size_t)k);
        o += 2 + (size_t)(k - n);
    } else {
        out[o++] = dec->dig[0];
        if (k > 1) {
            out[o++] = '.';
            memcpy(out + o, dec->dig + 1, (size_t)k - 1);
            o += (size_t)k - 1;
        }
        o += (size_t)snprintf(out + o, 8, "e%c%ld", n - 1 < 0 ? '-' : '+', labs(n - 1));
    }
    out[o] = '\0';
    return o;
}

/* Caller in the "C" locale. */
static size_t format_double(double d, char out[CANONJSON_DOUBLE_MAX])
{
    struct decimal dec;

    if (d == 0) {
        memcpy(out, "0", 2); /* -0 too */
        return 1;
    }
    shortest(fabs(d), &dec);
    return es_layout(d < 0, &dec, out);
}

int canonjson_format_double(double d, char out[CANONJSON_DOUBLE_MAX])
{
    locale_t c = c_locale(), old;
    size_t n;

    if (!isfinite(d))
        return -EINVAL;
    if (c == (locale_t)0)
        return -ENOMEM;
    old = uselocale(c);
    n = format_double(d, out);
    uselocale(old);
    return (int)n;
}

/* The decimal value of the (scanned) number literal s[at, end), its sign in
 * <neg>. Returns 0, or 1 when no double's text has that value: more than 17
 * significant digits, or an exponent past EXP_LIMIT. */
static int literal_decimal(const unsigned char *s, size_t at, size_t end, bool *neg,
                           struct decimal *ret)
{
    size_t m = at + (s[at] == '-'), m_end = m, dot, first = SIZE_MAX, last = 0;
    long long place_last, e = 0;
    bool e_neg = false;

    *neg = s[at] == '-';
    while (m_end < end && s[m_end] != 'e' && s[m_end] != 'E')
        m_end++;
    for (dot = m; dot < m_end && s[dot] != '.'; dot++)
        ;
    for (size_t j = m; j < m_end; j++) {
        if (s[j] >= '1' && s[j] <= '9') {
            first = first == SIZE_MAX ? j : first;
            last = j;
        }
    }
    ret->n = 0;
    ret->exp = 0;
    if (first == SIZE_MAX)
        return 0; /* zero, whatever its sign and exponent */
    /* The digits from the first to the last nonzero one, the '.' left out. */
    if (last - first + 1 - (first < dot && dot < last) > 17)
        return 1;
    for (size_t j = first; j <= last; j++) {
        if (s[j] != '.')
            ret->dig[ret->n++] = (char)s[j];
    }
    place_last = last < dot ? (long long)(dot - last) - 1 : -(long long)(last - dot);
    for (size_t j = m_end + 1; j < end; j++) {
        if (s[j] == '-' || s[j] == '+')
            e_neg = s[j] == '-';
        else if (e < 1000000)
            e = e * 10 + (s[j] - '0'); /* saturates: far past EXP_LIMIT */
    }
    e = place_last + (e_neg ? -e : e);
    if (e < -EXP_LIMIT || e > EXP_LIMIT)
        return 1;
    ret->exp = (long)e;
    return 0;
}

/* ------------------------------------------------------------------ the writer */

static int write_value(struct writer *w, uint32_t i, size_t depth);

/* Whether what is being walked is written. A body that is not I-JSON gives
 * -EINVAL whatever is removed and whatever <out>'s limit. */
static bool writing(const struct writer *w) { return w->mute == 0 && !w->full; }

static int emit(struct writer *w, const void *p, size_t n)
{
    int r = writing(w) ? buf_append(w->out, p, n) : 0;

    w->full = w->full || r == -E2BIG;
    return r == -E2BIG ? 0 : r;
}

/* A number: an integer literal as it is ("-0" as "0"); another as its
 * double's text when that has the literal's very value, else as it is
 * (canonjson.h). In the "C" locale. */
static int write_number(struct writer *w, uint32_t at)
{
    const unsigned char *s = w->s;
    size_t end = at;
    bool integer = true, neg;
    struct decimal dec, sh;
    char text[CANONJSON_DOUBLE_MAX];
    double d;

    if (!writing(w))
        return 0;
    while (end < w->len && s[end] && strchr("-+.eE0123456789", s[end])) {
        integer = integer && s[end] != '.' && s[end] != 'e' && s[end] != 'E';
        end++;
    }
    if (integer)
        return end - at == 2 && s[at] == '-' && s[at + 1] == '0' ? emit(w, "0", 1)
                                                                 : emit(w, s + at, end - at);
    if (literal_decimal(s, at, end, &neg, &dec) != 0)
        return emit(w, s + at, end - at);
    if (dec.n == 0)
        return emit(w, "0", 1);
    /* At most DBL_DIG (15) digits in the normal range: two such decimals never
     * read as one double, so the shortest text of the literal's double is the
     * literal's own value (its digits, normalized), with no double to make. */
    if (dec.n <= DBL_DIG && dec.exp + (long)dec.n - 1 >= -307 && dec.exp + (long)dec.n - 1 <= 307)
        return emit(w, text, es_layout(neg, &dec, text));
    d = decimal_value(&dec);
    if (!isfinite(d) || d == 0)
        return emit(w, s + at, end - at);
    shortest(d, &sh);
    if (sh.n != dec.n || sh.exp != dec.exp || memcmp(sh.dig, dec.dig, dec.n) != 0)
        return emit(w, s + at, end - at);
    return emit(w, text, es_layout(neg, &dec, text));
}

/* One character of a string, escaped as RFC 8785 §3.2.2.2 says. */
static int emit_char(struct writer *w, uint32_t cp)
{
    static const char hex[] = "0123456789abcdef";
    static const char from[] = "\"\\\b\t\n\f\r", to[] = "\"\\btnfr";
    char e[6] = { '\\', 'u', '0', '0' };
    const char *p = cp && cp < 0x80 ? strchr(from, (int)cp) : NULL;
    unsigned char u[4];

    if (p) {
        e[1] = to[p - from];
        return emit(w, e, 2);
    }
    if (cp < 0x20) {
        e[4] = hex[cp >> 4];
        e[5] = hex[cp & 0xf];
        return emit(w, e, 6);
    }
    return emit(w, u, utf8_encode(cp, u));
}

/* The (scanned) string at <at>: runs without an escape are copied as they
 * are (scanned UTF-8, no control byte), each escape decoded and written anew. */
static int write_string(struct writer *w, uint32_t at)
{
    const unsigned char *s = w->s;
    size_t i = at + 1, run = i;
    int r;

    if (!writing(w))
        return 0;
    r = emit(w, "\"", 1);
    while (r == 0) {
        uint32_t cp;

        if (s[i] != '"' && s[i] != '\\') {
            i++;
            continue;
        }
        r = emit(w, s + run, i - run);
        if (r < 0 || s[i] == '"')
            break;
        (void)unescape(s, w->len, &i, &cp); /* scanned: cannot fail */
        r = emit_char(w, cp);
        run = i;
    }
    return r < 0 ? r : emit(w, "\"", 1);
}

/* True when the pointer token <t> (up to a '/' or the NUL; ~1 is '/', ~0 is
 * '~') is the name at <at>, byte for byte once both are unescaped. */
static bool token_is_name(const char *t, const unsigned char *s, size_t len, uint32_t at)
{
    size_t i = at + 1;

    while (s[i] != '"') {
        unsigned char u[4];
        uint32_t cp;
        size_t n;

        (void)str_char(s, len, &i, &cp); /* scanned: cannot fail */
        n = utf8_encode(cp, u);
        for (size_t k = 0; k < n; k++, t++) {
            char c = *t;

            if (c == '\0' || c == '/')
                return false;
            if (c == '~')
                c = *++t == '1' ? '/' : '~'; /* checked: ~0 or ~1 */
            if ((unsigned char)c != u[k])
                return false;
        }
    }
    return *t == '\0' || *t == '/';
}

/* True when the pointer token <t> is the array index <index> (RFC 6901 §4:
 * "0" or a decimal without leading zeros). */
static bool token_is_index(const char *t, size_t index)
{
    uint64_t v = 0;

    if (*t == '\0' || *t == '/' || (t[0] == '0' && t[1] != '\0' && t[1] != '/'))
        return false;
    for (; *t != '\0' && *t != '/'; t++) {
        if (*t < '0' || *t > '9' || v > index)
            return false; /* and v * 10 never wraps: index < 2^32 */
        v = v * 10 + (uint64_t)(*t - '0');
    }
    return v == index;
}

/* Before a child of the container at <depth>, the member named by the node
 * <name> or else the element <index>: the pointers that have matched the path
 * to the container and whose next token names the child move one token on.
 * Returns true when one of them ends there: the child is removed. */
static bool ptrs_enter(struct writer *w, size_t depth, uint32_t name, size_t index)
{
    bool removed = false;

    for (size_t k = 0; k < w->nignore; k++) {
        struct ptr_state *p = &w->ptrs[k];
        const char *t, *next;

        if (p->depth != depth || w->ignore[k][p->at] != '/')
            continue; /* off the path, or "" */
        t = w->ignore[k] + p->at + 1;
        if (name != NONE ? !token_is_name(t, w->s, w->len, w->nodes[name].at)
                         : !token_is_index(t, index))
            continue;
        next = strchr(t, '/');
        if (!next) {
            removed = true;
            continue;
        }
        p->depth = depth + 1;
        p->at = (size_t)(next - w->ignore[k]);
    }
    return removed;
}

/* After that child: the pointers that moved on move back. */
static void ptrs_leave(struct writer *w, size_t depth)
{
    for (size_t k = 0; k < w->nignore; k++) {
        struct ptr_state *p = &w->ptrs[k];

        if (p->depth != depth + 1)
            continue;
        p->depth = depth;
        do
            p->at--;
        while (w->ignore[k][p->at] != '/'); /* a token holds no '/' and ignore[k][0] is one */
    }
}

/* A member (<name> its name's node) or an element (<name> NONE) of the
 * container at <depth>, with the ',' before it unless it is the first one
 * written; a removed one is checked but not written. */
static int write_child(struct writer *w, uint32_t name, uint32_t value, size_t index, size_t depth,
                       bool *first)
{
    bool removed = w->mute == 0 && ptrs_enter(w, depth, name, index);
    int r = 0;

    w->mute += removed;
    if (!*first)
        r = emit(w, ",", 1);
    if (r == 0 && name != NONE) {
        r = write_string(w, w->nodes[name].at);
        if (r == 0)
            r = emit(w, ":", 1);
    }
    if (r == 0)
        r = write_value(w, value, depth + 1);
    *first = *first && w->mute > 0;
    w->mute -= removed;
    ptrs_leave(w, depth);
    return r;
}

static uint32_t next_sibling(const struct writer *w, uint32_t i)
{
    unsigned char c = w->s[w->nodes[i].at];

    return c == '{' || c == '[' ? w->nodes[i].end : i + 1;
}

static int write_array(struct writer *w, uint32_t idx, size_t depth)
{
    bool first = true;
    size_t k = 0;
    int r = emit(w, "[", 1);

    for (uint32_t i = idx + 1; r == 0 && i < w->nodes[idx].end; i = next_sibling(w, i))
        r = write_child(w, NONE, i, k++, depth, &first);
    return r < 0 ? r : emit(w, "]", 1);
}

static int names_cmp(const struct writer *w, uint32_t a, uint32_t b)
{
    return name_cmp(w->s, w->len, w->nodes[a].at, w->nodes[b].at);
}

static void sift_down(const struct writer *w, uint32_t *v, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        uint32_t t;

        if (c >= n)
            return;
        if (c + 1 < n && names_cmp(w, v[c], v[c + 1]) < 0)
            c++;
        if (names_cmp(w, v[i], v[c]) >= 0)
            return;
        t = v[i];
        v[i] = v[c];
        v[c] = t;
        i = c;
    }
}

/* Heapsort: in place, and n log n comparisons whatever order a client picks. */
static void sort_names(const struct writer *w, uint32_t *v, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(w, v, i, n);
    for (size_t end = n; end-- > 1;) {
        uint32_t t = v[0];

        v[0] = v[end];
        v[end] = t;
        sift_down(w, v, 0, end);
    }
}

static uint32_t *order_at(struct writer *w, size_t base)
{
    return (uint32_t *)(void *)w->order.data + base;
}

/* An object: its names pushed on w->order (the objects inside push theirs
 * above, and may move the buffer: hence order_at() each time), sorted,
 * checked for duplicates, then its members written in that order. */
static int write_object(struct writer *w, uint32_t idx, size_t depth)
{
    size_t base = w->order.len / sizeof(uint32_t), n = 0;
    bool first = true;
    int r = 0;

    for (uint32_t i = idx + 1; i < w->nodes[idx].end; i = next_sibling(w, i + 1), n++) {
        r = buf_append(&w->order, &i, sizeof(i));
        if (r < 0)
            return r;
    }
    if (n == 0)
        return emit(w, "{}", 2);
    sort_names(w, order_at(w, base), n);
    for (size_t k = 1; k < n; k++) {
        if (names_cmp(w, order_at(w, base)[k - 1], order_at(w, base)[k]) == 0)
            return -EINVAL; /* RFC 7493 §2.3 */
    }
    r = emit(w, "{", 1);
    for (size_t k = 0; r == 0 && k < n; k++) {
        uint32_t name = order_at(w, base)[k];

        r = write_child(w, name, name + 1, 0, depth, &first);
    }
    w->order.len = base * sizeof(uint32_t);
    return r < 0 ? r : emit(w, "}", 1);
}

static int write_value(struct writer *w, uint32_t i, size_t depth)
{
    uint32_t at = w->nodes[i].at;

    switch (w->s[at]) {
    case '{':
        return write_object(w, i, depth);
    case '[':
        return write_array(w, i, depth);
    case '"':
        return write_string(w, at);
    case 't':
        return emit(w, "true", 4);
    case 'f':
        return emit(w, "false", 5);
    case 'n':
        return emit(w, "null", 4);
    default:
        return write_number(w, at);
    }
}

int canonjson_write(struct span body, const char *const *ignore, size_t nignore, size_t max_depth,
                    struct buf *out)
{
    struct scan sc = { .s = (const unsigned char *)body.base, .len = body.len };
    struct writer w = { .out = out, .ignore = ignore, .nignore = nignore };
    size_t start = out->len;
    locale_t c = c_locale(), old;
    int r;

    for (size_t k = 0; k < nignore; k++)
        assert(keysource_pointer_check(ignore[k]) == 0); /* checked when the config was read */
    if (body.len >= UINT32_MAX || body.len > SIZE_MAX / sizeof(struct node))
        return -E2BIG; /* offsets are 32 bits */
    if (!body.base || body.len == 0)
        return -EINVAL;
    if (c == (locale_t)0)
        return -ENOMEM;
    /* Each value starts at a byte of its own: at most body.len of them. */
    sc.nodes = BUF_INIT(body.len * sizeof(struct node));
    w.order = BUF_INIT(body.len * sizeof(uint32_t));
    r = scan_document(&sc, max_depth < CANONJSON_DEPTH_MAX ? max_depth : CANONJSON_DEPTH_MAX);
    if (r < 0)
        goto out;
    if (nignore) {
        w.ptrs = calloc(nignore, sizeof(*w.ptrs));
        if (!w.ptrs) {
            r = -ENOMEM;
            goto out;
        }
    }
    for (size_t k = 0; k < nignore; k++)
        w.mute += ignore[k][0] == '\0'; /* "": the whole document */
    w.s = sc.s;
    w.len = sc.len;
    w.nodes = (const struct node *)(const void *)sc.nodes.data;
    old = uselocale(c);
    r = write_value(&w, 0, 0);
    uselocale(old);
    if (r == 0 && w.full)
        r = -E2BIG;
out:
    if (r < 0)
        out->len = start;
    free(w.ptrs);
    buf_done(&w.order);
    buf_done(&sc.nodes);
    return r;
}
