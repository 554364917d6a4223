/* test_tensor.c -- IEEE half and bfloat16 conversions (exhaustive where the
 * domain is small, hand-derived at the boundaries) and strided views. */
#include "tensor/tensor.h"
#include "test.h"

TEST(f16_roundtrip_exhaustive) {
  /* Every non-NaN half converts to f32 and back to itself. */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (nan) {
      bad += !isnan(rlm__f16_to_f32((uint16_t)h));
      continue;
    }
    bad += rlm__f32_to_f16(rlm__f16_to_f32((uint16_t)h)) != h;
  }
  CHECK_EQ(bad, 0);
}

TEST(f16_known_values) {
  CHECK(rlm__f16_to_f32(0x3c00) == 1.0f);
  CHECK(rlm__f16_to_f32(0x7bff) == 65504.0f);
  CHECK(rlm__f16_to_f32(0x0001) == 0x1p-24f);      /* smallest subnormal */
  CHECK(rlm__f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(rlm__f16_to_f32(0x0400) == 0x1p-14f);      /* smallest normal */
  CHECK(isinf(rlm__f16_to_f32(0x7c00)));
  CHECK(signbit(rlm__f16_to_f32(0x8000)));
  CHECK_EQ(rlm__f32_to_f16(65504.0f), 0x7bff);
  CHECK_EQ(rlm__f32_to_f16(65519.0f), 0x7bff);     /* below the midpoint */
  CHECK_EQ(rlm__f32_to_f16(65520.0f), 0x7c00);     /* midpoint: to even = inf */
  CHECK_EQ(rlm__f32_to_f16(1e10f), 0x7c00);
  CHECK_EQ(rlm__f32_to_f16(-INFINITY), 0xfc00);
  CHECK(((rlm__f32_to_f16(NAN) & 0x7c00) == 0x7c00) && (rlm__f32_to_f16(NAN) & 0x3ff));
  CHECK_EQ(rlm__f32_to_f16(0x1p-25f), 0x0000);     /* tie to even: 0 */
  CHECK_EQ(rlm__f32_to_f16(0x1.000002p-25f), 0x0001);
  CHECK_EQ(rlm__f32_to_f16(3 * 0x1p-25f), 0x0002); /* 1.5 ulp: tie to even 2 */
  CHECK_EQ(rlm__f32_to_f16(1023.5f * 0x1p-24f), 0x0400); /* carry to normal */
  CHECK_EQ(rlm__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);    /* tie: stays even */
  CHECK_EQ(rlm__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie: up to even */
  CHECK_EQ(rlm__f32_to_f16(-2.0f), 0xc000);
}

TEST(f16_matches_double_rounding) {
  /* For random floats, the f16 result is the nearest half (checked in
   * double against its neighbours). */
  uint64_t seed = 7;
  int bad = 0;
  for (int i = 0; i < 200000; i++) {
    float f = rlm__bits_f32((uint32_t)t_rng_next(&seed));
    if (isnan(f) || fabsf(f) >= 65520.0f) continue;
    uint16_t h = rlm__f32_to_f16(f);
    double v = rlm__f16_to_f32(h), d = fabs((double)f - v);
    uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
    if ((up & 0x7c00) != 0x7c00 && fabs((double)f - rlm__f16_to_f32(up)) < d) bad++;
    if ((h & 0x7fff) && fabs((double)f - rlm__f16_to_f32(dn)) < d) bad++;
  }
  CHECK_EQ(bad, 0);
}

TEST(bf16_rounding) {
  CHECK_EQ(rlm__f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ(rlm__f32_to_bf16(rlm__bits_f32(0x3f808000)), 0x3f80); /* tie: even */
  CHECK_EQ(rlm__f32_to_bf16(rlm__bits_f32(0x3f818000)), 0x3f82); /* tie: up */
  CHECK_EQ(rlm__f32_to_bf16(rlm__bits_f32(0x3f808001)), 0x3f81);
  CHECK_EQ(rlm__f32_to_bf16(INFINITY), 0x7f80);
  CHECK_EQ(rlm__f32_to_bf16(rlm__bits_f32(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
  uint16_t n = rlm__f32_to_bf16(NAN);
  CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f));
  CHECK(rlm__bf16_to_f32(0xc020) == -2.5f);
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = rlm__bf16_to_f32((uint16_t)h);
    if (!isnan(f)) bad += rlm__f32_to_bf16(f) != h;
  }
  CHECK_EQ(bad, 0);
}

TEST(views) {
  float data[2 * 3 * 4];
  for (int i = 0; i < 24; i++) data[i] = (float)i;
  rlm_tensor t, s, tr, r;
  CHECK(rlm__tensor_init(&t, RLM_DTYPE_F32, 3, (int64_t[]){2, 3, 4}, data));
  CHECK_EQ(t.stride[0], 12);
  CHECK_EQ(t.stride[2], 1);
  CHECK(rlm__tensor_is_contiguous(&t));
  CHECK(rlm__tensor_slice(&s, &t, 1, 1, 2)); /* t[:, 1:3, :] */
  CHECK(!rlm__tensor_is_contiguous(&s));
  CHECK(*(float *)rlm__tensor_at(&s, (int64_t[]){1, 0, 2}) == 12 + 4 + 2);
  CHECK(rlm__tensor_transpose(&tr, &t, 1, 2));
  CHECK(*(float *)rlm__tensor_at(&tr, (int64_t[]){0, 3, 1}) == 4 + 3);
  float out[24];
  rlm__tensor_copy_to(&tr, out, RLM_DTYPE_F32); /* [2][4][3] */
  CHECK(out[1 * 12 + 2 * 3 + 1] == 12 + 1 * 4 + 2);
  CHECK(!rlm__tensor_reshape(&r, &tr, 2, (int64_t[]){6, 4})); /* not contiguous */
  CHECK(rlm__tensor_reshape(&r, &t, 2, (int64_t[]){6, 4}));
  CHECK(!rlm__tensor_reshape(&r, &t, 2, (int64_t[]){5, 4}));
  CHECK(!rlm__tensor_slice(&s, &t, 1, 2, 2));
  CHECK(!rlm__tensor_slice(&s, &t, 3, 0, 1));
  CHECK_EQ(rlm__shape_nbytes(RLM_DTYPE_BF16, 2, (int64_t[]){3, 5}), 30);
  CHECK_EQ(rlm__shape_nbytes(RLM_DTYPE_F32, 2, (int64_t[]){INT64_MAX / 2, 3}), -1);
  CHECK_EQ(rlm__shape_nbytes(RLM_DTYPE_F32, 1, (int64_t[]){-1}), -1);
  CHECK_EQ(rlm__shape_nbytes(RLM_DTYPE_F32, 0, NULL), 4);
}

TEST(bulk_convert) {
  float f[5] = {1.0f, -0.5f, 3.14159f, 65504.0f, 1e-6f}, back[5];
  uint16_t h[5];
  rlm__convert(f, RLM_DTYPE_F32, h, RLM_DTYPE_BF16, 5);
  rlm__convert(h, RLM_DTYPE_BF16, back, RLM_DTYPE_F32, 5);
  for (int i = 0; i < 5; i++) CHECK(back[i] == rlm__bf16_to_f32(rlm__f32_to_bf16(f[i])));
  CHECK_EQ(rlm_dtype_size(RLM_DTYPE_BF16), 2);
  CHECK_EQ(rlm_dtype_size(RLM_DTYPE_COUNT), 0);
  CHECK(strcmp(rlm_dtype_name(RLM_DTYPE_U32), "U32") == 0);
}

int main(void) {
  RUN(f16_roundtrip_exhaustive);
  RUN(f16_known_values);
  RUN(f16_matches_double_rounding);
  RUN(bf16_rounding);
  RUN(views);
  RUN(bulk_convert);
  return test_summary();
}
