/* SPDX-License-Identifier: MIT */
/* SHA-256 fetched once for the process (digest.h). */
#include "idemproxy/digest.h"

#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256; /* never freed: the process's */

static void fetch(void) { sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL); }

const EVP_MD *digest_sha256(void)
{
    (void)pthread_once(&once, fetch);
    return sha256;
}
