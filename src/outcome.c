/* SPDX-License-Identifier: MIT */
#include "idemproxy/outcome.h"

static const char *const outcome_labels[] = {
#define X(id, label) [OUTCOME_##id] = label,
    OUTCOME_LIST(X)
#undef X
};

static const unsigned problem_statuses[] = {
#define X(id, status, code, title, type) [PROBLEM_##id] = status,
    PROBLEM_LIST(X)
#undef X
};

static const char *const problem_codes[] = {
#define X(id, status, code, title, type) [PROBLEM_##id] = code,
    PROBLEM_LIST(X)
#undef X
};

const char *outcome_label(enum outcome o)
{
    if ((unsigned)o >= ARRAY_SIZE(outcome_labels))
        return "unknown";
    return outcome_labels[o];
}

unsigned problem_status(enum problem p)
{
    if ((unsigned)p >= ARRAY_SIZE(problem_statuses))
        return 500;
    return problem_statuses[p];
}

const char *problem_code(enum problem p)
{
    if ((unsigned)p >= ARRAY_SIZE(problem_codes))
        return "internal_error";
    return problem_codes[p];
}
