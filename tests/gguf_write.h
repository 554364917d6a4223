/* gguf_write.h -- a tiny GGUF writer for tests (test_gguf,
 * test_cli_badinput, the fuzz seeds), written from ggml's docs/gguf.md and
 * independent of the reader under test: raw little-endian fields appended
 * to a growing buffer, so a test can write any file, valid or not, one
 * field at a time. gw_model() writes a whole valid file with keys of every
 * type and tensors of several types; gw_kvs collects keys whose count is
 * known only at the end (test_gguf_tok's vocabularies). Header-only; out
 * of memory exits. */
#ifndef RLM_GGUF_WRITE_H
#define RLM_GGUF_WRITE_H

#include "tensor/tensor.h" /* rlm__f32_bits */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gw {
  uint8_t *p;
  size_t n, cap;
} gw;

static inline void gw_bytes(gw *w, const void *src, size_t n) {
  if (w->n + n > w->cap) {
    w->cap = (w->n + n) * 2 + 64;
    w->p = realloc(w->p, w->cap);
    if (!w->p) exit(2);
  }
  if (n) memcpy(w->p + w->n, src, n);
  w->n += n;
}

static inline void gw_le(gw *w, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  gw_bytes(w, b, (size_t)bytes);
}
static inline void gw_u8(gw *w, uint8_t v) { gw_le(w, v, 1); }
static inline void gw_u32(gw *w, uint32_t v) { gw_le(w, v, 4); }
static inline void gw_u64(gw *w, uint64_t v) { gw_le(w, v, 8); }
static inline uint64_t gw_f64_bits(double f) {
  uint64_t u;
  memcpy(&u, &f, 8);
  return u;
}
/* A GGUF string: u64 length, the bytes. */
static inline void gw_strn(gw *w, const char *s, size_t n) {
  gw_u64(w, n);
  gw_bytes(w, s, n);
}
static inline void gw_str(gw *w, const char *s) { gw_strn(w, s, strlen(s)); }

/* Value type ids of the format. */
enum { GW_U8, GW_I8, GW_U16, GW_I16, GW_U32, GW_I32, GW_F32, GW_BOOL, GW_STR, GW_ARR, GW_U64,
       GW_I64, GW_F64 };
/* ggml type ids used here. */
enum { GW_T_F32 = 0, GW_T_F16 = 1, GW_T_Q4_0 = 2, GW_T_Q8_0 = 8, GW_T_Q4_K = 12, GW_T_Q6_K = 14,
       GW_T_BF16 = 30 };

static inline void gw_header(gw *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  gw_bytes(w, "GGUF", 4);
  gw_u32(w, version);
  gw_u64(w, n_tensors);
  gw_u64(w, n_kv);
}

/* A key and its value type; the caller writes the value. */
static inline void gw_key(gw *w, const char *key, uint32_t type) {
  gw_str(w, key);
  gw_u32(w, type);
}
/* A key with a fixed-size value: its `bytes` low bytes of bits. */
static inline void gw_kv_num(gw *w, const char *key, uint32_t type, uint64_t bits, int bytes) {
  gw_key(w, key, type);
  gw_le(w, bits, bytes);
}
static inline void gw_kv_u32(gw *w, const char *key, uint32_t v) {
  gw_kv_num(w, key, GW_U32, v, 4);
}
static inline void gw_kv_str(gw *w, const char *key, const char *v) {
  gw_key(w, key, GW_STR);
  gw_str(w, v);
}
static inline void gw_kv_bool(gw *w, const char *key, int v) {
  gw_kv_num(w, key, GW_BOOL, v ? 1 : 0, 1);
}
/* An array's element type and length; the caller writes the elements. */
static inline void gw_arr(gw *w, uint32_t type, uint64_t n) {
  gw_u32(w, type);
  gw_u64(w, n);
}

static inline void gw_tensor(gw *w, const char *name, uint32_t n_dims, const uint64_t *dims,
                             uint32_t type, uint64_t offset) {
  gw_str(w, name);
  gw_u32(w, n_dims);
  for (uint32_t d = 0; d < n_dims; d++) gw_u64(w, dims[d]);
  gw_u32(w, type);
  gw_u64(w, offset);
}

/* Zeros up to the next multiple of align. */
static inline void gw_pad(gw *w, uint64_t align) {
  static const uint8_t zero[256];
  while (w->n % align) {
    const uint64_t gap = align - w->n % align;
    gw_bytes(w, zero, (size_t)(gap > 256 ? 256 : gap));
  }
}

/* ---- keys first, header after ------------------------------------------- */

/* Keys written one by one (with gw_kv_* or gw_key + value into .w), each
 * counted with gw_kvs_next(), then gw_kvs_file() writes a file of them and
 * no tensors. */
typedef struct gw_kvs {
  gw w;
  uint64_t n;
} gw_kvs;

static inline gw *gw_kvs_next(gw_kvs *k) {
  k->n++;
  return &k->w;
}
static inline void gw_kvs_file(const gw_kvs *k, gw *out) {
  gw_header(out, 3, 0, k->n);
  gw_bytes(out, k->w.p, k->w.n);
}

/* ---- a whole valid file ------------------------------------------------- */

/* The tensors of gw_model: name, ggml type, dims (dims[0] fastest), bytes
 * (worked out by hand from the block sizes: Q4_0 32 -> 18, Q8_0 32 -> 34,
 * Q4_K 256 -> 144, Q6_K 256 -> 210). */
typedef struct gw_tensor_spec {
  const char *name;
  uint32_t type;
  uint32_t n_dims;
  uint64_t dims[4];
  uint64_t nbytes;
} gw_tensor_spec;

static const gw_tensor_spec gw_model_tensors[] = {
    {"token_embd.weight", GW_T_Q8_0, 2, {64, 3}, 3 * 2 * 34},
    {"blk.0.attn_norm.weight", GW_T_F32, 1, {64}, 256},
    {"blk.0.attn_q.weight", GW_T_Q4_K, 2, {256, 2}, 2 * 144},
    {"blk.0.ffn_down.weight", GW_T_Q6_K, 3, {256, 1, 2}, 2 * 210},
    {"blk.0.ffn_up.weight", GW_T_Q4_0, 2, {32, 5}, 5 * 18},
    {"output_norm.weight", GW_T_F16, 1, {7}, 14},
    {"rope_freqs.weight", GW_T_BF16, 4, {2, 1, 3, 1}, 12},
};
#define GW_MODEL_N_TENSORS (sizeof gw_model_tensors / sizeof *gw_model_tensors)
#define GW_MODEL_N_KV 17 /* 16, plus general.alignment when align != 0 */

/* Keys of every value type, arrays (empty, of strings, nested), then the
 * tensors at aligned offsets, data byte j of tensor i = (i * 31 + j) & 0xff.
 * align 0: no general.alignment key, the default 32. offsets[i] (if not
 * NULL) receives each tensor's offset from the start of the file. */
static inline void gw_model(gw *w, uint32_t version, uint32_t align, uint64_t *offsets) {
  const uint64_t a = align ? align : 32;
  gw_header(w, version, GW_MODEL_N_TENSORS, GW_MODEL_N_KV - (align ? 0 : 1));
  gw_kv_str(w, "general.architecture", "llama");
  gw_kv_str(w, "general.name", "t\xc3\xa9st \"model\"\n");
  if (align) gw_kv_u32(w, "general.alignment", align);
  gw_kv_num(w, "test.u8", GW_U8, 200, 1);
  gw_kv_num(w, "test.i8", GW_I8, 0x80, 1); /* -128 */
  gw_kv_num(w, "test.u16", GW_U16, 65535, 2);
  gw_kv_num(w, "test.i16", GW_I16, 0xfffe, 2); /* -2 */
  gw_kv_u32(w, "llama.context_length", 4096);
  gw_kv_num(w, "test.i32", GW_I32, (uint32_t)-7, 4);
  gw_kv_num(w, "llama.rope.freq_base", GW_F32, rlm__f32_bits(500000.0f), 4);
  gw_kv_num(w, "test.bool", GW_BOOL, 1, 1);
  gw_kv_num(w, "test.u64", GW_U64, UINT64_MAX, 8);
  gw_kv_num(w, "test.i64", GW_I64, (uint64_t)INT64_MIN, 8);
  gw_kv_num(w, "test.f64", GW_F64, gw_f64_bits(0.1), 8);
  gw_key(w, "tokenizer.ggml.tokens", GW_ARR);
  gw_arr(w, GW_STR, 3);
  gw_str(w, "<s>");
  gw_str(w, "");
  gw_str(w, "\xe2\x96\x81the");
  gw_key(w, "tokenizer.ggml.scores", GW_ARR);
  gw_arr(w, GW_F32, 3);
  const float scores[3] = {0.0f, -1.5f, 2.25f};
  for (int i = 0; i < 3; i++) gw_u32(w, rlm__f32_bits(scores[i]));
  gw_key(w, "test.nested", GW_ARR);
  gw_arr(w, GW_ARR, 2);
  gw_arr(w, GW_I32, 2);
  gw_u32(w, 1);
  gw_u32(w, (uint32_t)-2);
  gw_arr(w, GW_BOOL, 0);
  uint64_t off = 0;
  for (size_t i = 0; i < GW_MODEL_N_TENSORS; i++) {
    const gw_tensor_spec *t = &gw_model_tensors[i];
    gw_tensor(w, t->name, t->n_dims, t->dims, t->type, off);
    off += (t->nbytes + a - 1) / a * a;
  }
  gw_pad(w, a);
  for (size_t i = 0; i < GW_MODEL_N_TENSORS; i++) {
    if (offsets) offsets[i] = w->n;
    for (uint64_t j = 0; j < gw_model_tensors[i].nbytes; j++) gw_u8(w, (uint8_t)(i * 31 + j));
    if (i + 1 < GW_MODEL_N_TENSORS) gw_pad(w, a); /* the file ends with the last byte of data */
  }
}

#endif /* RLM_GGUF_WRITE_H */
