/* attn_fused.c -- (being written) */
#include "attn/attn.h"
