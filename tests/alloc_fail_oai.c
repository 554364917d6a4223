/* alloc_fail_oai.c -- the server's request parsing and response bodies
 * (src/server/oai.c), compiled into test_alloc_fail with their libc
 * allocations renamed to the library's counted ones, so that the sweep
 * fails those too. `ringlm serve` builds the same file with libc's: the
 * code paths that meet a NULL are the same. */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

#define malloc rlm__malloc
#define calloc rlm__calloc
#define realloc rlm__realloc
#define free rlm__free
#define strdup rlm__strdup
#include "server/oai.c"
