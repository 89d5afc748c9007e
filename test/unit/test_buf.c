#include "check.h"
static void t(void) { CHECK(1); }
TEST_MAIN(t)
