/* gguf_quant.c -- converting GGUF weight tensors into dense views or MLX
 * affine matrices, exactly (the table and the argument for exactness are in
 * gguf_quant.h; the block layouts were written from ggml's ggml-common.h
 * and dequantize_row_* descriptions, not copied).
 *
 * A tensor is a flat run of blocks, row after row (a row is whole blocks),
 * and an rlm_qmat is a flat run of packed codes, scales and biases in the
 * same element order. So block i of the tensor fills codes from byte
 * i * block * bits / 8 and scales from i * block / group, whatever its row:
 * the conversion is one loop over blocks, each turned into its codes,
 * scales and biases by a function per type. Codes are packed into bytes of
 * the LSB-first stream, which on a little-endian host are the bytes of the
 * u32 words (the GGUF reader assumes such a host too).
 */
#include "model/gguf_quant.h"

#include <stdatomic.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_quant.c packs codes byte by byte: little-endian hosts only"
#endif

/* One GGUF block -> its codes (block * bits / 8 bytes) and block / group
 * scales and biases. */
typedef void (*block_fn)(const uint8_t *blk, uint8_t *codes, float *s, float *b);

typedef struct gq_format {
  rlm_ggml_type type;
  int block;       /* elements of one GGUF block             */
  int bytes;       /* its bytes                              */
  int bits;        /* of the converted codes                 */
  int group;       /* elements per scale and bias            */
  block_fn convert;
  bool f16;        /* s and b are f16 values (or k * one): try f16 */
} gq_format;

/* ---- helpers -------------------------------------------------------------- */

static float f16_at(const uint8_t *p) { return rlm__f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* 8 one-byte codes (each < 2^bits, bits <= 8) -> their 8 * bits packed
 * bits, low first: neighbours merge in 16-bit, then 32-bit lanes, then the
 * halves (three shift-and-or steps instead of eight). */
static uint64_t squeeze8(uint64_t c, int bits) {
  c = (c & 0x00ff00ff00ff00ffull) | (c & 0xff00ff00ff00ff00ull) >> (8 - bits);
  c = (c & 0x0000ffff0000ffffull) | (c & 0xffff0000ffff0000ull) >> (16 - 2 * bits);
  return (c & 0xffffffffull) | (c >> 32) << (4 * bits);
}

/* Bit k of b -> bit 0 of byte k. */
static uint64_t spread8(uint32_t b) {
  const uint64_t t = (uint64_t)(b & 0xff) * 0x0101010101010101ull & 0x8040201008040201ull;
  return (t + 0x7f7f7f7f7f7f7f7full) >> 7 & 0x0101010101010101ull; /* no byte carries: t's are <= 0x80 */
}

/* n 4-bit codes (n a multiple of 8) from n bytes: their low nibbles
 * (shift 0) or high nibbles (shift 4) -> n / 2 bytes. */
static void nibbles(const uint8_t *q, int n, int shift, uint8_t *out) {
  for (int k = 0; k < n / 8; k++) {
    const uint32_t w = (uint32_t)squeeze8(load64(q + 8 * k) >> shift & 0x0f0f0f0f0f0f0f0full, 4);
    memcpy(out + 4 * k, &w, 4);
  }
}

/* 8 codes of `bits` (5 or 6) in bytes -> bits bytes at out. */
static void put8(uint64_t c, int bits, uint8_t *out) {
  const uint64_t w = squeeze8(c, bits);
  memcpy(out, &w, (size_t)bits);
}

/* ---- the 32-element formats ------------------------------------------------ */

static void conv_q8_0(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const float d = f16_at(blk);
  for (int i = 0; i < 32; i++) codes[i] = blk[2 + i] ^ 0x80; /* int8 q -> q + 128 */
  s[0] = d, b[0] = -128.0f * d;
}

/* Q4_0 / Q4_1: element j in the low nibble of qs[j], element j + 16 in the
 * high nibble; the stream wants elements 2k, 2k+1 in byte k. */
static void q4_codes(const uint8_t *qs, uint8_t *codes) {
  nibbles(qs, 16, 0, codes);
  nibbles(qs, 16, 4, codes + 8);
}

static void conv_q4_0(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const float d = f16_at(blk);
  q4_codes(blk + 2, codes);
  s[0] = d, b[0] = -8.0f * d;
}

static void conv_q4_1(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  q4_codes(blk + 4, codes);
  s[0] = f16_at(blk), b[0] = f16_at(blk + 2);
}

/* Q5_0 / Q5_1: as Q4 for the low 4 bits; bit j of the u32 qh is element
 * j's fifth bit. */
static void q5_codes(const uint8_t *qhp, const uint8_t *qs, uint8_t *codes) {
  uint32_t qh;
  memcpy(&qh, qhp, 4); /* little-endian, as the file */
  const uint64_t m = 0x0f0f0f0f0f0f0f0full;
  for (int k = 0; k < 4; k++) { /* elements 8k .. 8k+7 */
    const uint64_t lo = load64(qs + 8 * (k & 1)) >> (4 * (k >> 1)) & m;
    put8(lo | spread8(qh >> (8 * k)) << 4, 5, codes + 5 * k);
  }
}

static void conv_q5_0(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const float d = f16_at(blk);
  q5_codes(blk + 2, blk + 6, codes);
  s[0] = d, b[0] = -16.0f * d;
}

static void conv_q5_1(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  q5_codes(blk + 4, blk + 8, codes);
  s[0] = f16_at(blk), b[0] = f16_at(blk + 2);
}

/* ---- the K formats (super-blocks of 256) ---------------------------------- */

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 bytes.
 * Sub-blocks 0-3 have theirs in the low 6 bits of bytes j and j + 4; 4-7
 * have the low 4 bits in byte j + 4 (scale: low nibble, min: high) and
 * the top 2 bits in the spare top bits of bytes j - 4 (scale) and j (min). */
static void k_scale_min(const uint8_t *q, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
    *mn = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
  }
}

/* d*sc and dmin*m are exact in f32 (11 x 6 significant bits). */
static void k_params(const uint8_t *blk, float *s, float *b) {
  const float d = f16_at(blk), dmin = f16_at(blk + 2);
  for (int j = 0; j < 8; j++) {
    int sc, mn;
    k_scale_min(blk + 4, j, &sc, &mn);
    s[j] = d * (float)sc;
    b[j] = -(dmin * (float)mn);
  }
}

/* Sub-block j's 32 low bits: qs[32 (j/2) + l], low nibble for even j,
 * high for odd. */
static void conv_q4_k(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const uint8_t *qs = blk + 16;
  k_params(blk, s, b);
  for (int j = 0; j < 8; j++) nibbles(qs + 32 * (j / 2), 32, 4 * (j & 1), codes + 16 * j);
}

/* The fifth bits of sub-block j: bit j of qh[l], as 8 bytes from l0. */
static uint64_t k_fifth8(const uint8_t *qh, int l0, int j) {
  return load64(qh + l0) >> j & 0x0101010101010101ull;
}

static void conv_q5_k(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const uint8_t *qh = blk + 16, *qs = blk + 48;
  const uint64_t m = 0x0f0f0f0f0f0f0f0full;
  k_params(blk, s, b);
  for (int j = 0; j < 8; j++)
    for (int k = 0; k < 4; k++) {
      const uint64_t lo = load64(qs + 32 * (j / 2) + 8 * k) >> (4 * (j & 1)) & m;
      put8(lo | k_fifth8(qh, 8 * k, j) << 4, 5, codes + 20 * j + 5 * k);
    }
}

/* Q6_K: each half of 128 elements takes 64 bytes of ql and 32 of qh.
 * Element 32i + l of the half (i < 4, l < 32): low 4 bits from
 * ql[l + 32 (i & 1)], low nibble for i < 2, high for i >= 2; high 2 bits
 * from bits 2i, 2i+1 of qh[l]. Sub-block k of 16 has scale sc[k]. */
static void conv_q6_k(const uint8_t *blk, uint8_t *codes, float *s, float *b) {
  const uint8_t *ql = blk, *qh = blk + 128;
  const int8_t *sc = (const int8_t *)(blk + 192);
  const float d = f16_at(blk + 208);
  const uint64_t m = 0x0f0f0f0f0f0f0f0full;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 4; i++)
      for (int k = 0; k < 4; k++) { /* elements 128h + 32i + 8k .. +8 */
        const uint64_t lo = load64(ql + 64 * h + 32 * (i & 1) + 8 * k) >> (4 * (i >> 1)) & m;
        const uint64_t hi = load64(qh + 32 * h + 8 * k) >> (2 * i) & 0x0303030303030303ull;
        put8(lo | hi << 4, 6, codes + 6 * (16 * h + 4 * i + k));
      }
  for (int k = 0; k < 16; k++) {
    s[k] = d * (float)sc[k];
    b[k] = -32.0f * s[k];
  }
}

static const gq_format FORMATS[] = {
    {RLM_GGML_TYPE_Q8_0, 32, 34, 8, 32, conv_q8_0, true},
    {RLM_GGML_TYPE_Q4_0, 32, 18, 4, 32, conv_q4_0, true},
    {RLM_GGML_TYPE_Q4_1, 32, 20, 4, 32, conv_q4_1, true},
    {RLM_GGML_TYPE_Q5_0, 32, 22, 5, 32, conv_q5_0, true},
    {RLM_GGML_TYPE_Q5_1, 32, 24, 5, 32, conv_q5_1, true},
    {RLM_GGML_TYPE_Q4_K, 256, 144, 4, 32, conv_q4_k, false},
    {RLM_GGML_TYPE_Q5_K, 256, 176, 5, 32, conv_q5_k, false},
    {RLM_GGML_TYPE_Q6_K, 256, 210, 6, 16, conv_q6_k, false},
};

static const gq_format *format_of(rlm_ggml_type type) {
  for (size_t i = 0; i < sizeof FORMATS / sizeof *FORMATS; i++)
    if (FORMATS[i].type == type) return &FORMATS[i];
  return NULL;
}

static rlm_dtype dense_dtype(rlm_ggml_type type) {
  switch (type) {
  case RLM_GGML_TYPE_F32: return RLM_DTYPE_F32;
  case RLM_GGML_TYPE_F16: return RLM_DTYPE_F16;
  case RLM_GGML_TYPE_BF16: return RLM_DTYPE_BF16;
  default: return RLM_DTYPE_COUNT;
  }
}

bool rlm__gguf_type_convertible(rlm_ggml_type type) {
  return format_of(type) || dense_dtype(type) != RLM_DTYPE_COUNT;
}

/* ---- the layer ---------------------------------------------------------- */

static rlm_status bind_dense(rlm_arena *arena, const rlm_gguf *g, const rlm_gguf_tensor *t, rlm_dtype dt,
                             rlm_linear *out, rlm_error *err) {
  const void *w = t->data;
  if ((uintptr_t)w % rlm_dtype_size(dt)) { /* a file with alignment 1, or an image in memory */
    void *copy = rlm__arena_alloc(arena, t->nbytes);
    if (!copy) return rlm__err_nomem(err, rlm__gguf_path(g), t->nbytes);
    memcpy(copy, t->data, t->nbytes);
    w = copy;
  }
  out->quant = false, out->dtype = dt, out->w = w;
  return RLM_OK;
}

/* Blocks [i0, i1) of one conversion (a range of the pool), scales and
 * biases stored as sd (f32, or f16 where every one is an f16 value). */
typedef struct convert_job {
  const gq_format *f;
  const uint8_t *src;
  uint8_t *codes;
  void *scales, *biases;
  rlm_dtype sd;
  _Atomic bool inexact;  /* f16: some value did not fit; redo in f32 */
} convert_job;

static void store_sb(convert_job *j, const float *v, int64_t n, void *dst, int64_t at) {
  if (j->sd == RLM_DTYPE_F32) {
    memcpy((float *)dst + at, v, (size_t)n * sizeof *v);
    return;
  }
  uint16_t *h = (uint16_t *)dst + at;
  bool exact = true;
  for (int64_t k = 0; k < n; k++) {
    h[k] = rlm__f32_to_f16(v[k]);
    exact &= rlm__f16_to_f32(h[k]) == v[k]; /* NaN too falls back */
  }
  if (!exact) atomic_store(&j->inexact, true);
}

static void convert_range(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  convert_job *j = ctx;
  const gq_format *f = j->f;
  const int64_t spb = f->block / f->group;                       /* scales a block (<= 16) */
  const size_t cb = (size_t)f->block * (size_t)f->bits / 8;      /* code bytes a block     */
  float s[16], b[16];
  for (int64_t i = i0; i < i1; i++) {
    f->convert(j->src + (size_t)i * (size_t)f->bytes, j->codes + (size_t)i * cb, s, b);
    store_sb(j, s, spb, j->scales, i * spb);
    store_sb(j, b, spb, j->biases, i * spb);
  }
}

/* One pass with scales and biases of dtype sd; false if f16 lost a value. */
static bool convert_as(rlm_pool *pool, rlm_arena *arena, const rlm_gguf_tensor *t, const gq_format *f,
                       uint8_t *codes, rlm_dtype sd, rlm_qmat *q, bool *nomem) {
  const size_t sb_bytes = (size_t)(t->n_elements / f->group) * rlm_dtype_size(sd);
  convert_job j = {f, t->data, codes, rlm__arena_alloc_aligned(arena, sb_bytes, 64),
                   rlm__arena_alloc_aligned(arena, sb_bytes, 64), sd, false};
  if ((*nomem = !j.scales || !j.biases)) return false;
  rlm__pool_for(pool, t->n_elements / f->block, 64, (double)f->block, convert_range, &j);
  if (atomic_load(&j.inexact)) return false;
  *q = (rlm_qmat){(const uint32_t *)codes, j.scales, j.biases, sd, t->dims[1], t->dims[0], f->bits, f->group};
  return true;
}

/* f16 scales and biases when they are exactly f16 values (Q8_0, Q4_0,
 * Q5_0: d and k d, unless k d overflows; Q4_1, Q5_1: d and m), which
 * saves 1 bit a weight at group 32; else f32. The f16 attempt's arrays
 * stay in the arena when it fails, which only huge scales cause. */
static rlm_status convert(rlm_pool *pool, rlm_arena *arena, const rlm_gguf *g, const rlm_gguf_tensor *t,
                          const gq_format *f, rlm_linear *out, rlm_error *err) {
  const size_t code_bytes = (size_t)(t->n_elements / 32) * (size_t)f->bits * 4;
  RLM_ASSERT(t->nbytes == (size_t)(t->n_elements / f->block) * (size_t)f->bytes);
  uint8_t *codes = rlm__arena_alloc_aligned(arena, code_bytes, 64);
  bool nomem = !codes;
  if (!nomem && !(f->f16 && convert_as(pool, arena, t, f, codes, RLM_DTYPE_F16, &out->q, &nomem)) && !nomem)
    convert_as(pool, arena, t, f, codes, RLM_DTYPE_F32, &out->q, &nomem);
  if (nomem) return rlm__err_nomem(err, rlm__gguf_path(g), code_bytes);
  out->quant = true;
  RLM_ASSERT(rlm__qmat_format_ok(f->bits, f->group));
  return RLM_OK;
}

rlm_status rlm__gguf_linear(rlm_pool *pool, rlm_arena *arena, const rlm_gguf *g, const rlm_gguf_tensor *t,
                            rlm_linear *out, rlm_error *err) {
  memset(out, 0, sizeof *out);
  const char *path = rlm__gguf_path(g), *tn = rlm__ggml_type_name(t->type);
  if (!tn) tn = "?";
  const gq_format *f = format_of(t->type);
  const rlm_dtype dt = dense_dtype(t->type);
  if (!f && dt == RLM_DTYPE_COUNT)
    return rlm__err(err, RLM_ERR_UNSUPPORTED,
                    "%s: tensor '%s' has type %s, which ringlm cannot load (supported: F32, F16, BF16, Q8_0, "
                    "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)", path, t->name, tn);
  const int64_t block = f ? f->block : 1;
  if (t->n_dims != 2 || t->dims[0] % block)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' (%s, %d-D, %lld columns) is not a 2-D matrix of "
                    "whole %lld-element blocks", path, t->name, tn, t->n_dims, (long long)t->dims[0],
                    (long long)block);
  out->out = t->dims[1], out->in = t->dims[0];
  rlm_status rc = f ? convert(pool, arena, g, t, f, out, err) : bind_dense(arena, g, t, dt, out, err);
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}
