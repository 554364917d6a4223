/* quant_x86.c -- AVX2 and AVX-512 fast paths for quant.h (stub: no fast
 * path yet; the reference table is used). */
#include "quant/quant.h"

const rlm_quant_kernels *rlm__quant_kernels_avx2(void) { return NULL; }
const rlm_quant_kernels *rlm__quant_kernels_avx512(void) { return NULL; }
