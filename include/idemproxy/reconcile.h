/* SPDX-License-Identifier: MIT */
/* A route's reconcile: block (doc/configuration.md, Reconcile), pure: what
 * a probe of an unknown key asks the API (its target expanded from the key
 * and the request's JSON body, percent-encoded, so that client bytes never
 * change where it goes), and what its answer proves (found, absent, or
 * nothing), with the answer a found key keeps. Thread-safe: no state. The
 * probes themselves are reconciler.h's. */
#ifndef IDEMPROXY_RECONCILE_H
#define IDEMPROXY_RECONCILE_H

#include "idemproxy/common.h"
#include "idemproxy/config.h"

struct buf;
struct record;

#define RECONCILE_STATUS_MAX 16                     /* statuses in one rule */
#define RECONCILE_TARGET_MAX 8192                   /* an expanded target is at most this long */
#define RECONCILE_HEADER "X-Idempotency-Reconciled" /* on every replay of a found answer */

/* found or absent: the statuses it takes, and a JSON pointer that must
 * exist in the answer's body (found's json) or be missing from it
 * (absent's json-missing; a body that is not JSON has no pointer). */
struct reconcile_rule {
    unsigned status[RECONCILE_STATUS_MAX];
    size_t nstatus; /* 0: the rule is not given (absent only) */
    char *pointer;  /* owned, checked; NULL: the status alone */
};

struct reconcile_config {
    char *method;                   /* owned: a token, GET by default */
    char *target;                   /* owned: the template, reconcile_target_check()ed */
    char *headers[CONFIG_MAX_LIST]; /* owned: names copied from the request at hand */
    size_t nheaders;
    struct reconcile_rule found, absent;
    unsigned answer_status;       /* answer.status: what a found key's duplicates get */
    uint64_t settle_ms, every_ms; /* no probe before settle, then one per every */
    unsigned attempts;            /* probes in all */
};

#define RECONCILE_SETTLE_MS 10000
#define RECONCILE_EVERY_MS 30000
#define RECONCILE_ATTEMPTS 20

/* Fills <c> with the defaults (method GET, answer 200, settle 10 s, every
 * 30 s, 20 attempts), nothing else. */
void reconcile_config_init(struct reconcile_config *c);

/* Frees what <c> owns. NULL-safe, idempotent. */
void reconcile_config_done(struct reconcile_config *c);

/* Checks a target template: it begins with '/', holds bytes 0x21-0x7E, and
 * each '{' opens "{key}" or "{body:POINTER}" (an RFC 6901 pointer without
 * '{' or '}'); no '}' stands alone, no '#'. Returns 0, or -EINVAL with why
 * in <why>. */
int reconcile_target_check(const char *tmpl, char *why, size_t whylen);

/* Whether a {body:P} of the checked <tmpl> reads what the JSON pointer
 * <pointer> names: P is <pointer> or lies below it. */
bool reconcile_target_reads(const char *tmpl, const char *pointer);

/* Appends to <out> the target of checked <tmpl> for the key <key> and the
 * request body <body>: "{key}" becomes the key, "{body:P}" the string at P
 * in the body (JSON), each percent-encoded but for RFC 3986's unreserved
 * bytes (so a '/', '?', '#', '&' or '%' of theirs is data, never syntax).
 * Returns 0, or -ENOENT when the body is not JSON or P finds no string
 * there (<why> says which), -E2BIG past RECONCILE_TARGET_MAX, -ENOMEM. */
int reconcile_target_expand(const char *tmpl, struct span key, struct span body, struct buf *out,
                            const char **why);

enum reconcile_verdict {
    RECONCILE_FOUND,
    RECONCILE_ABSENT,
    RECONCILE_FAILED,
};

/* What the probe's answer <ans> proves under <c>: found when only found's
 * rule matches (then <ret> gets the answer to keep: answer.status, the JSON
 * at found's pointer, or the whole body, as application/json, with
 * RECONCILE_HEADER: true; over <max_body> bytes it is failed), absent when
 * only absent's does, else failed; <why> says why in words for the log.
 * Returns the verdict; -ENOMEM when the answer cannot be built. */
int reconcile_judge(const struct reconcile_config *c, const struct record *ans, size_t max_body,
                    struct record **ret, const char **why);

#endif
