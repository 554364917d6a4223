/* dtype.c -- dtype sizes and names, IEEE half conversions, bulk convert.
 * The f16 routines are integer-only so they do not depend on the FPU's
 * rounding mode and agree bit for bit with F16C's vcvtps2ph (RNE). */
#include "tensor/tensor.h"

static const struct {
  const char *name;
  size_t size;
} dtype_table[RLM_DTYPE_COUNT] = {
    [RLM_DTYPE_F32] = {"F32", 4},   [RLM_DTYPE_F16] = {"F16", 2},
    [RLM_DTYPE_BF16] = {"BF16", 2}, [RLM_DTYPE_U32] = {"U32", 4},
    [RLM_DTYPE_F64] = {"F64", 8},   [RLM_DTYPE_I8] = {"I8", 1},
    [RLM_DTYPE_U8] = {"U8", 1},     [RLM_DTYPE_I16] = {"I16", 2},
    [RLM_DTYPE_U16] = {"U16", 2},   [RLM_DTYPE_I32] = {"I32", 4},
    [RLM_DTYPE_I64] = {"I64", 8},   [RLM_DTYPE_U64] = {"U64", 8},
    [RLM_DTYPE_BOOL] = {"BOOL", 1},
};

size_t rlm_dtype_size(rlm_dtype t) {
  return (unsigned)t < RLM_DTYPE_COUNT ? dtype_table[t].size : 0;
}

const char *rlm_dtype_name(rlm_dtype t) {
  return (unsigned)t < RLM_DTYPE_COUNT ? dtype_table[t].name : NULL;
}

float rlm__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
    float v = (float)mant * 0x1p-24f;
    return rlm__bits_f32(rlm__f32_bits(v) | sign);
  }
  if (exp == 31) return rlm__bits_f32(sign | 0x7f800000u | (mant << 13));
  return rlm__bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t rlm__f32_to_f16(float f) {
  uint32_t x = rlm__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* NaN */
  if (ax >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
  if (ax >= 0x38800000u) {                     /* normal: >= 2^-14 */
    uint32_t v = ax - (112u << 23);
    uint32_t r = v >> 13, rem = v & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t e = ax >> 23;
  if (e < 102) return sign; /* below 2^-25: rounds to zero */
  /* Subnormal: the value in units of 2^-24 is m >> (126 - e), rounded to
   * nearest even; a carry into 0x400 correctly yields the smallest normal. */
  uint32_t m = (ax & 0x7fffff) | 0x800000, shift = 126 - e;
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) r++;
  return sign | (uint16_t)r;
}

void rlm__convert(const void *src, rlm_dtype st, void *dst, rlm_dtype dt,
                  int64_t n) {
  if (st == dt) {
    memcpy(dst, src, (size_t)n * rlm_dtype_size(st));
    return;
  }
  for (int64_t i = 0; i < n; i++) rlm__store_f(dst, dt, i, rlm__load_f(src, st, i));
}
