/* api.c -- (being written) */
#include "base/base.h"
