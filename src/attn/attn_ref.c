/* attn_ref.c -- (being written) */
#include "attn/attn.h"
