/* SPDX-License-Identifier: MIT */
/* The outcomes' labels (outcome.h). */
#include "idemproxy/outcome.h"

static const char *const outcome_labels[] = {
#define X(id, label) [OUTCOME_##id] = label,
    OUTCOME_LIST(X)
#undef X
};

const char *outcome_label(enum outcome o)
{
    if ((unsigned)o >= ARRAY_SIZE(outcome_labels))
        return "unknown";
    return outcome_labels[o];
}
