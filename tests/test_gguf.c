/* test_gguf.c -- the GGUF reader (src/model/gguf.h): valid v3 and v2 files
 * read back exactly (keys of every value type, arrays of strings, numbers
 * and arrays, tensors of several ggml types with their byte sizes and data
 * pointers, the default alignment and a custom general.alignment), from a
 * file and from memory, through the typed getters, the public calls and
 * `ringlm inspect`; the byte size of every ggml type; then every rule of
 * gguf.h broken one at a time, each refused with its status and a one-line
 * message naming the file and the key or tensor; every truncation of a
 * small file; and allocation fault injection over open. Files are written
 * field by field (tests/gguf_write.h), so each malformed case is exactly
 * the bytes a broken or hostile writer would produce. */
#include "model/gguf.h"
#include "gguf_write.h"
#include "test.h"

#include <sys/stat.h>

static char g_dir[256]; /* this run's temp folder, removed at the end */

#define IMG "bad.gguf" /* the name malformed images are opened under */

static void path_in(char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/%s", g_dir, name);
}

static void write_file(const char *path, const gw *w) {
  FILE *f = fopen(path, "wb");
  if (!f || (w->n && fwrite(w->p, 1, w->n, f) != w->n)) {
    perror(path);
    exit(2);
  }
  fclose(f);
}

/* Opening the image must fail with `want`, leave *out NULL and give one
 * line naming the file and each needle (NULL: none). */
static void check_fails(const uint8_t *p, size_t n, rlm_status want, const char *needle1,
                        const char *needle2) {
  rlm_gguf *g = (rlm_gguf *)(uintptr_t)1;
  rlm_error err = {0};
  rlm_status rc = rlm__gguf_open_memory(&g, IMG, p, n, &err);
  test_note("%s", err.msg);
  CHECK_EQ(rc, want);
  CHECK_EQ(err.code, want);
  CHECK(g == NULL);
  CHECK(strchr(err.msg, '\n') == NULL);
  CHECK(strncmp(err.msg, IMG ": ", strlen(IMG ": ")) == 0);
  if (needle1) CHECK_STR_CONTAINS(err.msg, needle1);
  if (needle2) CHECK_STR_CONTAINS(err.msg, needle2);
  if (rc == RLM_OK) rlm__gguf_free(g);
  t_note[0] = 0;
}

static void check_img_fails(gw *w, rlm_status want, const char *needle1, const char *needle2) {
  check_fails(w->p, w->n, want, needle1, needle2);
  free(w->p);
  *w = (gw){0};
}

static rlm_gguf *open_img(const gw *w) {
  rlm_gguf *g = NULL;
  rlm_error err = {0};
  rlm_status rc = rlm__gguf_open_memory(&g, "ok.gguf", w->p, w->n, &err);
  CHECK_EQ(rc, RLM_OK);
  if (rc) fprintf(stderr, "  open: %s\n", err.msg);
  return g;
}

/* ---- valid files ---------------------------------------------------------- */

static void check_scalars(const rlm_gguf *g) {
  const char *s = NULL;
  size_t len = 0;
  uint32_t u32 = 0;
  int32_t i32 = 0;
  uint64_t u64 = 0;
  float f32 = 0;
  bool b = false;
  CHECK_EQ(rlm__gguf_get_str(g, "general.architecture", &s, &len, NULL), RLM_OK);
  CHECK_STR_EQ(s, "llama");
  CHECK_EQ(len, 5);
  CHECK_EQ(rlm__gguf_get_str(g, "general.name", &s, &len, NULL), RLM_OK);
  CHECK_STR_EQ(s, "t\xc3\xa9st \"model\"\n");
  CHECK_EQ(len, 14);
  CHECK_EQ(rlm__gguf_kv_find(g, "test.u8")->v.u, 200);
  CHECK_EQ(rlm__gguf_kv_find(g, "test.i8")->v.i, -128);
  CHECK_EQ(rlm__gguf_kv_find(g, "test.u16")->v.u, 65535);
  CHECK_EQ(rlm__gguf_kv_find(g, "test.i16")->v.i, -2);
  CHECK_EQ(rlm__gguf_get_u32(g, "llama.context_length", &u32, NULL), RLM_OK);
  CHECK_EQ(u32, 4096);
  CHECK_EQ(rlm__gguf_get_i32(g, "test.i32", &i32, NULL), RLM_OK);
  CHECK_EQ(i32, -7);
  CHECK_EQ(rlm__gguf_get_f32(g, "llama.rope.freq_base", &f32, NULL), RLM_OK);
  CHECK(f32 == 500000.0f);
  CHECK_EQ(rlm__gguf_get_bool(g, "test.bool", &b, NULL), RLM_OK);
  CHECK(b);
  CHECK_EQ(rlm__gguf_get_u64(g, "test.u64", &u64, NULL), RLM_OK);
  CHECK(u64 == UINT64_MAX);
  CHECK(rlm__gguf_kv_find(g, "test.i64")->v.i == INT64_MIN);
  CHECK(rlm__gguf_kv_find(g, "test.f64")->v.f == 0.1);
  CHECK_EQ(rlm__gguf_get_uint(g, "test.u8", 255, &u64, NULL), RLM_OK);
  CHECK_EQ(u64, 200);
}

static void check_arrays(const rlm_gguf *g) {
  const rlm_gguf_array *a = NULL;
  double f = 0;
  int64_t i = 0;
  CHECK_EQ(rlm__gguf_get_array(g, "tokenizer.ggml.tokens", RLM_GGUF_TYPE_STRING, &a, NULL), RLM_OK);
  CHECK_EQ(a->n, 3);
  CHECK_STR_EQ(a->strs[0].s, "<s>");
  CHECK_EQ(a->strs[1].n, 0);
  CHECK_STR_EQ(a->strs[1].s, "");
  CHECK_STR_EQ(a->strs[2].s, "\xe2\x96\x81the");
  CHECK_EQ(a->strs[2].n, 6);
  CHECK_EQ(rlm__gguf_get_array(g, "tokenizer.ggml.scores", RLM_GGUF_TYPE_FLOAT32, &a, NULL),
           RLM_OK);
  CHECK(rlm__gguf_arr_float(a, 1, &f) && f == -1.5);
  CHECK(rlm__gguf_arr_float(a, 2, &f) && f == 2.25);
  CHECK(!rlm__gguf_arr_float(a, 3, &f)); /* out of range */
  CHECK(!rlm__gguf_arr_int(a, 0, &i));   /* not integers */
  CHECK_EQ(rlm__gguf_get_array(g, "test.nested", RLM_GGUF_TYPE_COUNT, &a, NULL), RLM_OK);
  CHECK_EQ(a->type, RLM_GGUF_TYPE_ARRAY);
  CHECK_EQ(a->n, 2);
  CHECK_EQ(a->arrs[0].type, RLM_GGUF_TYPE_INT32);
  CHECK(rlm__gguf_arr_int(&a->arrs[0], 1, &i) && i == -2);
  CHECK_EQ(a->arrs[1].type, RLM_GGUF_TYPE_BOOL);
  CHECK_EQ(a->arrs[1].n, 0);
}

/* Every tensor of gw_model at its offset, with its dims, type and bytes. */
static void check_tensors(const rlm_gguf *g, const uint8_t *base, const uint64_t *offsets,
                          uint32_t align) {
  CHECK_EQ(rlm__gguf_tensor_count(g), GW_MODEL_N_TENSORS);
  for (size_t i = 0; i < GW_MODEL_N_TENSORS && i < rlm__gguf_tensor_count(g); i++) {
    const gw_tensor_spec *s = &gw_model_tensors[i];
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(g, i);
    test_note("tensor %s", s->name);
    CHECK_STR_EQ(t->name, s->name);
    CHECK_EQ(t->type, s->type);
    CHECK_EQ(t->n_dims, s->n_dims);
    int64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
      CHECK_EQ(t->dims[d], d < (int)s->n_dims ? (int64_t)s->dims[d] : 1);
      n *= t->dims[d];
    }
    CHECK_EQ(t->n_elements, n);
    CHECK_EQ(t->nbytes, s->nbytes);
    CHECK_EQ(t->offset, offsets[i]);
    CHECK_EQ(t->offset % align, 0);
    CHECK((const uint8_t *)t->data == base + offsets[i]);
    CHECK_EQ(((const uint8_t *)t->data)[0], (uint8_t)(i * 31));
    CHECK_EQ(((const uint8_t *)t->data)[t->nbytes - 1], (uint8_t)(i * 31 + s->nbytes - 1));
    CHECK(rlm__gguf_tensor_find(g, s->name) == t);
  }
  t_note[0] = 0;
  const rlm_gguf_tensor *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm__gguf_tensor_get(g, "blk.0.attn_q.weight", &t, &err), RLM_OK);
  CHECK(t && t->type == RLM_GGML_TYPE_Q4_K);
  CHECK_EQ(rlm__gguf_tensor_get(g, "blk.9.attn_q.weight", &t, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_CONTAINS(err.msg, "tensor 'blk.9.attn_q.weight' is missing");
  CHECK(rlm__gguf_tensor_find(g, "blk.0") == NULL);
}

static void check_model(const rlm_gguf *g, uint32_t version, uint32_t align, const uint8_t *base,
                        const uint64_t *offsets) {
  CHECK_EQ(rlm__gguf_version(g), version);
  CHECK_EQ(rlm__gguf_alignment(g), align);
  CHECK_EQ(rlm__gguf_kv_count(g), GW_MODEL_N_KV - (align == 32 ? 1 : 0));
  CHECK_STR_EQ(rlm__gguf_kv_at(g, 0)->key, "general.architecture"); /* file order */
  CHECK_STR_EQ(rlm__gguf_kv_at(g, rlm__gguf_kv_count(g) - 1)->key, "test.nested");
  CHECK(rlm__gguf_kv_at(g, rlm__gguf_kv_count(g)) == NULL);
  check_scalars(g);
  check_arrays(g);
  check_tensors(g, base, offsets, align);
}

TEST(v3_default_alignment_reads_back) {
  gw w = {0};
  uint64_t offsets[GW_MODEL_N_TENSORS];
  gw_model(&w, 3, 0, offsets);
  rlm_gguf *g = open_img(&w);
  if (g) check_model(g, 3, 32, w.p, offsets);
  rlm__gguf_free(g);
  /* the same bytes as a mapped file */
  char path[512];
  path_in(path, sizeof path, "v3.gguf");
  write_file(path, &w);
  rlm_error err = {0};
  g = NULL;
  CHECK_EQ(rlm__gguf_open(&g, path, &err), RLM_OK);
  if (g) {
    const uint8_t *base = (const uint8_t *)rlm__gguf_tensor_at(g, 0)->data - offsets[0];
    check_model(g, 3, 32, base, offsets);
    CHECK_EQ((uintptr_t)rlm__gguf_tensor_at(g, 1)->data % 32, 0); /* the mapping is aligned */
    CHECK_STR_EQ(rlm__gguf_path(g), path);
  }
  rlm__gguf_free(g);
  free(w.p);
}

TEST(v2_custom_alignment_reads_back) {
  static const uint32_t aligns[] = {64, 8, 1, 4096};
  for (int k = 0; k < N_OF(aligns); k++) {
    gw w = {0};
    uint64_t offsets[GW_MODEL_N_TENSORS];
    gw_model(&w, 2, aligns[k], offsets);
    rlm_gguf *g = open_img(&w);
    if (g) check_model(g, 2, aligns[k], w.p, offsets);
    rlm__gguf_free(g);
    free(w.p);
  }
}

/* Files with no tensors (a vocabulary) end without padding; tensors may
 * leave gaps and bytes after the last one. */
TEST(keys_only_and_gaps_are_valid) {
  gw w = {0};
  gw_header(&w, 3, 0, 1);
  gw_kv_str(&w, "general.architecture", "llama");
  rlm_gguf *g = open_img(&w);
  CHECK(g && rlm__gguf_tensor_count(g) == 0 && rlm__gguf_tensor_find(g, "x") == NULL);
  rlm__gguf_free(g);
  free(w.p);
  w = (gw){0};
  gw_header(&w, 3, 0, 0);
  g = open_img(&w);
  CHECK(g && rlm__gguf_kv_count(g) == 0 && rlm__gguf_kv_find(g, "x") == NULL);
  rlm__gguf_free(g);
  free(w.p);
  w = (gw){0};
  const uint64_t d8[] = {8}, d4[] = {4};
  gw_header(&w, 3, 2, 0);
  gw_tensor(&w, "b", 1, d4, GW_T_F32, 96); /* after a gap of 64 bytes */
  gw_tensor(&w, "a", 1, d8, GW_T_F32, 0);
  gw_pad(&w, 32);
  for (int i = 0; i < 200; i++) gw_u8(&w, (uint8_t)i); /* 88 bytes more than needed */
  g = open_img(&w);
  CHECK(g && rlm__gguf_tensor_find(g, "b")->nbytes == 16);
  CHECK(g && rlm__gguf_tensor_at(g, 0) == rlm__gguf_tensor_find(g, "b")); /* file order */
  rlm__gguf_free(g);
  free(w.p);
}

/* ---- ggml types ------------------------------------------------------------- */

/* Elements and bytes per block of every ggml type, from ggml's block
 * layouts (0 bytes: removed from GGUF, so refused). */
static const struct {
  uint32_t id;
  const char *name;
  uint32_t block, bytes;
} types[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},       {4, "Q4_2", 0, 0},         {5, "Q4_3", 0, 0},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},
    {9, "Q8_1", 32, 36},       {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},
    {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},    {14, "Q6_K", 256, 210},
    {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},
    {21, "IQ3_S", 256, 110},   {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},
    {24, "I8", 1, 1},          {25, "I16", 1, 2},         {26, "I32", 1, 4},
    {27, "I64", 1, 8},         {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {31, "Q4_0_4_4", 0, 0},    {32, "Q4_0_4_8", 0, 0},
    {33, "Q4_0_8_8", 0, 0},    {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},
    {36, "IQ4_NL_4_4", 0, 0},  {37, "IQ4_NL_4_8", 0, 0},  {38, "IQ4_NL_8_8", 0, 0},
    {39, "MXFP4", 32, 17},
};

/* One tensor "w" of type id with dims {d0, 3}, its data all there. */
static void one_tensor(gw *w, uint32_t id, uint64_t d0, uint64_t nbytes) {
  const uint64_t dims[] = {d0, 3};
  gw_header(w, 3, 1, 0);
  gw_tensor(w, "w", 2, dims, id, 0);
  gw_pad(w, 32);
  for (uint64_t i = 0; i < nbytes; i++) gw_u8(w, 0x5a);
}

TEST(every_ggml_type_sized) {
  CHECK_EQ(N_OF(types), RLM_GGML_TYPE_COUNT);
  for (int k = 0; k < N_OF(types); k++) {
    gw w = {0};
    const uint32_t block = types[k].block ? types[k].block : 32;
    test_note("%s", types[k].name);
    CHECK_EQ(types[k].id, (uint32_t)k);
    one_tensor(&w, types[k].id, 2 * block, 2 * 3 * (uint64_t)types[k].bytes);
    if (!types[k].bytes) {
      CHECK(rlm__ggml_type_name(types[k].id) == NULL);
      check_img_fails(&w, RLM_ERR_FORMAT, "tensor 'w'", types[k].name);
      continue;
    }
    CHECK_STR_EQ(rlm__ggml_type_name(types[k].id), types[k].name);
    rlm_gguf *g = open_img(&w);
    CHECK(g && rlm__gguf_tensor_at(g, 0)->nbytes == 6 * types[k].bytes);
    rlm__gguf_free(g);
    free(w.p);
    if (block > 1) { /* a first dimension that is not a whole number of blocks */
      w = (gw){0};
      one_tensor(&w, types[k].id, block + 1, 4096);
      check_img_fails(&w, RLM_ERR_FORMAT, "tensor 'w'", "not a multiple of the");
    }
  }
  t_note[0] = 0;
  CHECK(rlm__ggml_type_name(RLM_GGML_TYPE_COUNT) == NULL);
}

/* ---- the header -------------------------------------------------------------- */

/* A valid v3 model image with bytes [at, at + n) replaced by v (LE). */
static void model_with(gw *w, size_t at, uint64_t v, int n) {
  gw_model(w, 3, 0, NULL);
  for (int i = 0; i < n; i++) w->p[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

TEST(header_rules) {
  gw w = {0};
  model_with(&w, 0, 'G' | 'G' << 8 | 'U' << 16 | 'X' << 24, 4);
  check_img_fails(&w, RLM_ERR_FORMAT, "bad magic", NULL);
  model_with(&w, 4, 1, 4);
  check_img_fails(&w, RLM_ERR_UNSUPPORTED, "GGUF version 1 is not supported", NULL);
  model_with(&w, 4, 4, 4);
  check_img_fails(&w, RLM_ERR_UNSUPPORTED, "GGUF version 4 is not supported", NULL);
  model_with(&w, 4, 0, 4);
  check_img_fails(&w, RLM_ERR_UNSUPPORTED, "version 0", NULL);
  model_with(&w, 4, 3u << 24, 4); /* 00 00 00 03: a big-endian v3 */
  check_img_fails(&w, RLM_ERR_UNSUPPORTED, "big-endian", NULL);
  model_with(&w, 8, 1ull << 60, 8);
  check_img_fails(&w, RLM_ERR_FORMAT, "1152921504606846976 tensors", "cannot fit");
  model_with(&w, 8, UINT64_MAX, 8);
  check_img_fails(&w, RLM_ERR_FORMAT, "cannot fit", NULL);
  model_with(&w, 16, 1ull << 62, 8);
  check_img_fails(&w, RLM_ERR_FORMAT, "4611686018427387904 keys", "cannot fit");
  model_with(&w, 16, 1000, 8); /* plausible alone, not with the file's size */
  check_img_fails(&w, RLM_ERR_FORMAT, "1000 keys", "cannot fit");
  check_fails(NULL, 0, RLM_ERR_FORMAT, "truncated: 0 bytes", NULL);
  check_fails((const uint8_t *)"GGU", 3, RLM_ERR_FORMAT, "truncated", NULL);
}

/* Every proper prefix of a valid file is refused as truncated. */
TEST(truncated_at_every_byte) {
  for (uint32_t v = 2; v <= 3; v++) {
    gw w = {0};
    gw_model(&w, v, v == 2 ? 64 : 0, NULL);
    for (size_t cut = 0; cut < w.n; cut++) {
      uint8_t *copy = malloc(cut ? cut : 1); /* exactly cut bytes: ASan sees any over-read */
      memcpy(copy, w.p, cut);
      test_note("version %u cut at %zu of %zu", v, cut, w.n);
      check_fails(copy, cut, RLM_ERR_FORMAT, "truncated", NULL);
      free(copy);
    }
    free(w.p);
  }
}

/* ---- keys and values ---------------------------------------------------------- */

/* An image of one key `key` of value type `type`, whose value the caller
 * writes next; n_tensors 0. */
static void one_key(gw *w, const char *key, uint32_t type) {
  gw_header(w, 3, 0, 1);
  gw_key(w, key, type);
}

TEST(string_rules) {
  gw w = {0};
  one_key(&w, "general.name", GW_STR);
  gw_u64(&w, 1ull << 62);
  gw_bytes(&w, "abc", 3);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'general.name': truncated: the string value", NULL);
  one_key(&w, "general.name", GW_STR);
  gw_str(&w, "caf\xe9"); /* Latin-1, not UTF-8 */
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'general.name': the string value is not UTF-8", NULL);
  one_key(&w, "general.name", GW_STR);
  gw_str(&w, "\xed\xa0\x80"); /* a surrogate */
  check_img_fails(&w, RLM_ERR_FORMAT, "not UTF-8", NULL);
  one_key(&w, "k\xff", GW_U8);
  gw_u8(&w, 1);
  check_img_fails(&w, RLM_ERR_FORMAT, "key #0: the key is not UTF-8", NULL);
  one_key(&w, "", GW_U16); /* 14 bytes, what the smallest valid key takes */
  gw_le(&w, 1, 2);
  check_img_fails(&w, RLM_ERR_FORMAT, "key #0: the key is empty", NULL);
  gw_header(&w, 3, 0, 1);
  gw_strn(&w, "a\0b", 3);
  gw_u32(&w, GW_U8);
  gw_u8(&w, 1);
  check_img_fails(&w, RLM_ERR_FORMAT, "key #0: the key holds a NUL byte", NULL);
  gw_header(&w, 3, 0, 1);
  gw_u64(&w, 70000);
  for (int i = 0; i < 70000; i++) gw_u8(&w, 'k');
  gw_u32(&w, GW_U8);
  gw_u8(&w, 1);
  check_img_fails(&w, RLM_ERR_FORMAT, "key #0: the key is 70000 bytes long (at most 65535)", NULL);
  gw_header(&w, 3, 0, 1);
  gw_u64(&w, UINT64_MAX);
  gw_bytes(&w, "0123456789abcdef", 16);
  check_img_fails(&w, RLM_ERR_FORMAT, "key #0", "at most 65535");
}

TEST(value_rules) {
  gw w = {0};
  one_key(&w, "a.b", 13);
  gw_u64(&w, 0);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.b': unknown value type 13", NULL);
  one_key(&w, "a.b", UINT32_MAX);
  gw_u64(&w, 0);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.b': unknown value type 4294967295", NULL);
  one_key(&w, "a.b", GW_BOOL);
  gw_u8(&w, 2);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.b': bool value 2 is neither 0 nor 1", NULL);
  gw_header(&w, 3, 0, 3);
  gw_kv_u32(&w, "a.b", 1);
  gw_kv_u32(&w, "c.d", 2);
  gw_kv_str(&w, "a.b", "again");
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.b': appears twice", NULL);
  gw_header(&w, 3, 0, 2);
  gw_kv_u32(&w, "a.b", 1);
  gw_kv_num(&w, "a.c", GW_F64, 0, 7); /* one byte short, at the end */
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.c': truncated: the value", NULL);
}

TEST(array_rules) {
  gw w = {0};
  one_key(&w, "a.u32", GW_ARR);
  gw_arr(&w, GW_U32, 1ull << 61);
  gw_u32(&w, 1);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.u32': truncated: an array of ",
                  "2305843009213693952 uint32 runs past the end");
  one_key(&w, "a.str", GW_ARR);
  gw_arr(&w, GW_STR, 1ull << 60);
  gw_str(&w, "x");
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.str': truncated: an array of ",
                  "1152921504606846976 strings runs past the end");
  one_key(&w, "a.str", GW_ARR);
  gw_arr(&w, GW_STR, 2);
  gw_str(&w, "x");
  gw_u64(&w, 1ull << 40);
  gw_bytes(&w, "0123456789", 10);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.str': truncated: string 1 of the array", NULL);
  one_key(&w, "a.str", GW_ARR);
  gw_arr(&w, GW_STR, 2);
  gw_str(&w, "x");
  gw_str(&w, "\xc0\xaf"); /* overlong '/' */
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.str': string 1 of the array is not UTF-8", NULL);
  one_key(&w, "a.arr", GW_ARR);
  gw_arr(&w, GW_ARR, UINT64_MAX);
  gw_arr(&w, GW_U8, 0);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.arr': truncated: an array of", "arrays");
  one_key(&w, "a.t", GW_ARR);
  gw_arr(&w, 13, 0);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.t': array of unknown value type 13", NULL);
  one_key(&w, "a.b", GW_ARR);
  gw_arr(&w, GW_BOOL, 3);
  gw_bytes(&w, "\x01\x00\x07", 3);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.b': element 2 of the array: bool value 7", NULL);
}

/* Arrays nest GGUF_MAX_DEPTH deep, not deeper. */
TEST(nesting_is_bounded) {
  for (int depth = GGUF_MAX_DEPTH; depth <= GGUF_MAX_DEPTH + 1; depth++) {
    gw w = {0};
    one_key(&w, "a.deep", GW_ARR);
    for (int d = 1; d < depth; d++) gw_arr(&w, GW_ARR, 1);
    gw_arr(&w, GW_I16, 1);
    gw_le(&w, 0xffff, 2);
    if (depth > GGUF_MAX_DEPTH) {
      check_img_fails(&w, RLM_ERR_FORMAT, "key 'a.deep': arrays nested more than 8 deep", NULL);
      continue;
    }
    rlm_gguf *g = open_img(&w);
    const rlm_gguf_array *a = g ? &rlm__gguf_kv_at(g, 0)->v.a : NULL;
    for (int d = 1; a && d < depth; d++) a = &a->arrs[0];
    int64_t v = 0;
    CHECK(a && rlm__gguf_arr_int(a, 0, &v) && v == -1);
    rlm__gguf_free(g);
    free(w.p);
  }
}

TEST(alignment_rules) {
  static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
  for (int i = 0; i < N_OF(bad); i++) {
    gw w = {0};
    gw_model(&w, 3, 64, NULL);
    const char *key = "general.alignment";
    uint8_t *at = memmem(w.p, w.n, key, strlen(key));
    CHECK(at != NULL);
    if (!at) return;
    for (int b = 0; b < 4; b++) at[strlen(key) + 4 + (size_t)b] = (uint8_t)(bad[i] >> (8 * b));
    check_img_fails(&w, RLM_ERR_FORMAT, "key 'general.alignment': alignment", "not a power of two");
  }
  gw w = {0};
  one_key(&w, "general.alignment", GW_STR);
  gw_str(&w, "32");
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'general.alignment': is string, expected uint32", NULL);
  one_key(&w, "general.alignment", GW_U64);
  gw_u64(&w, 32);
  check_img_fails(&w, RLM_ERR_FORMAT, "key 'general.alignment': is uint64, expected uint32", NULL);
}

/* ---- tensors ------------------------------------------------------------------- */

typedef struct tspec {
  const char *name;
  uint32_t n_dims;
  uint64_t dims[5];
  uint32_t type;
  uint64_t offset;
} tspec;

/* Tensor infos as given, the padding, then `data` bytes of data. */
static void tensors_img(gw *w, const tspec *t, int n, uint64_t data) {
  gw_header(w, 3, (uint64_t)n, 0);
  for (int i = 0; i < n; i++)
    gw_tensor(w, t[i].name, t[i].n_dims, t[i].dims, t[i].type, t[i].offset);
  gw_pad(w, 32);
  for (uint64_t i = 0; i < data; i++) gw_u8(w, 0);
}

static void check_tensors_fail(const tspec *t, int n, uint64_t data, const char *needle1,
                               const char *needle2) {
  gw w = {0};
  tensors_img(&w, t, n, data);
  check_img_fails(&w, RLM_ERR_FORMAT, needle1, needle2);
}

TEST(tensor_rules) {
  const tspec past = {"a", 1, {8}, GW_T_F32, 64};
  check_tensors_fail(&past, 1, 95, "tensor 'a': its 32 bytes at offset 64 run past the end of "
                     "the data section (95 bytes)", NULL);
  const tspec far = {"a", 1, {8}, GW_T_F32, 1ull << 62};
  check_tensors_fail(&far, 1, 64, "tensor 'a'", "run past the end");
  const tspec odd = {"a", 1, {8}, GW_T_F32, 16};
  check_tensors_fail(&odd, 1, 64, "tensor 'a': offset 16 is not a multiple of the alignment 32",
                     NULL);
  const tspec overlap[] = {{"a", 1, {16}, GW_T_F32, 0}, {"b", 1, {8}, GW_T_F32, 32}};
  check_tensors_fail(overlap, 2, 128, "tensor 'b': overlaps tensor 'a'", NULL);
  const tspec same[] = {{"a", 1, {8}, GW_T_F32, 0}, {"b", 1, {8}, GW_T_F32, 0}};
  check_tensors_fail(same, 2, 128, "overlaps tensor", NULL);
  const tspec dup[] = {{"a", 1, {8}, GW_T_F32, 0}, {"a", 1, {8}, GW_T_F32, 32}};
  check_tensors_fail(dup, 2, 128, "tensor 'a': appears twice", NULL);
  const tspec unknown = {"a", 1, {8}, 40, 0};
  check_tensors_fail(&unknown, 1, 64, "tensor 'a': unknown ggml type 40", NULL);
  const tspec unknown2 = {"a", 1, {8}, UINT32_MAX, 0};
  check_tensors_fail(&unknown2, 1, 64, "tensor 'a': unknown ggml type 4294967295", NULL);
  const tspec removed = {"a", 1, {32}, 4, 0};
  check_tensors_fail(&removed, 1, 64, "tensor 'a': ggml type 4 (Q4_2) is no longer part of GGUF",
                     NULL);
  const tspec zero = {"a", 2, {8, 0}, GW_T_F32, 0};
  check_tensors_fail(&zero, 1, 64, "tensor 'a': dimension 1 is 0", NULL);
  const tspec nd0 = {"a", 0, {0}, GW_T_F32, 0};
  check_tensors_fail(&nd0, 1, 64, "tensor 'a': 0 dimensions (1 to 4)", NULL);
  const tspec nd5 = {"a", 5, {1, 1, 1, 1, 1}, GW_T_F32, 0};
  check_tensors_fail(&nd5, 1, 64, "tensor 'a': 5 dimensions (1 to 4)", NULL);
  const tspec big = {"a", 2, {1ull << 32, 1ull << 32}, GW_T_F32, 0};
  check_tensors_fail(&big, 1, 64, "tensor 'a': the element count overflows", NULL);
  const tspec huge_dim = {"a", 1, {1ull << 63}, GW_T_F32, 0};
  check_tensors_fail(&huge_dim, 1, 64, "tensor 'a': dimension 0 (9223372036854775808) is out of "
                     "range", NULL);
  const tspec bytes = {"a", 1, {1ull << 62}, GW_T_F32, 0};
  check_tensors_fail(&bytes, 1, 64, "tensor 'a': the byte size overflows", NULL);
  const tspec latin1 = {"caf\xe9", 1, {8}, GW_T_F32, 0};
  check_tensors_fail(&latin1, 1, 64, "tensor #0: the name is not UTF-8", NULL);
  const tspec empty = {"", 1, {8}, GW_T_F32, 0};
  check_tensors_fail(&empty, 1, 64, "tensor #0: the name is empty", NULL);
  const tspec second[] = {{"a", 1, {8}, GW_T_F32, 0}, {"b", 1, {8}, 99, 32}};
  check_tensors_fail(second, 2, 64, "tensor 'b': unknown ggml type 99", NULL);
}

/* The data section must begin inside the file when there are tensors. */
TEST(data_section_truncated) {
  gw w = {0};
  const uint64_t dims[] = {8};
  gw_header(&w, 3, 1, 0);
  gw_tensor(&w, "a", 1, dims, GW_T_F32, 0); /* ends at byte 57: no padding, no data */
  check_img_fails(&w, RLM_ERR_FORMAT, "truncated: the data section would start at 64", NULL);
}

/* ---- open, getters, faults --------------------------------------------------- */

TEST(open_arguments_and_files) {
  rlm_gguf *g = (rlm_gguf *)(uintptr_t)1;
  rlm_error err = {0};
  char path[512];
  path_in(path, sizeof path, "missing.gguf");
  CHECK_EQ(rlm__gguf_open(&g, path, &err), RLM_ERR_IO);
  CHECK(g == NULL);
  CHECK_STR_CONTAINS(err.msg, path);
  CHECK_EQ(rlm__gguf_open(&g, g_dir, &err), RLM_ERR_IO); /* a folder */
  CHECK_STR_CONTAINS(err.msg, "not a regular file");
  path_in(path, sizeof path, "empty.gguf");
  gw w = {0};
  write_file(path, &w);
  CHECK_EQ(rlm__gguf_open(&g, path, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "empty.gguf: truncated: 0 bytes");
  CHECK_EQ(rlm__gguf_open(NULL, path, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__gguf_open(&g, NULL, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__gguf_open_memory(&g, NULL, "x", 1, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__gguf_open_memory(&g, "x", NULL, 1, &err), RLM_ERR_INVALID);
  rlm__gguf_free(NULL);
  CHECK_EQ(rlm__gguf_kv_count(NULL), 0);
  CHECK(rlm__gguf_tensor_at(NULL, 0) == NULL);
}

TEST(getters_refuse_other_types) {
  gw w = {0};
  gw_model(&w, 3, 0, NULL);
  rlm_gguf *g = open_img(&w);
  rlm_error err = {0};
  uint32_t u = 7;
  uint64_t u64 = 0;
  float f = 0;
  const char *s = NULL;
  const rlm_gguf_array *a = NULL;
  if (!g) {
    free(w.p);
    return;
  }
  CHECK_EQ(rlm__gguf_get_u32(g, "general.architecture", &u, &err), RLM_ERR_FORMAT);
  CHECK_STR_EQ(err.msg, "ok.gguf: key 'general.architecture' is string, expected uint32");
  CHECK_EQ(u, 7); /* untouched */
  CHECK_EQ(rlm__gguf_get_str(g, "llama.context_length", &s, NULL, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "is uint32, expected string");
  CHECK_EQ(rlm__gguf_get_f32(g, "test.f64", &f, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "is float64, expected float32");
  CHECK_EQ(rlm__gguf_get_array(g, "tokenizer.ggml.tokens", RLM_GGUF_TYPE_INT32, &a, &err),
           RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg,
                     "key 'tokenizer.ggml.tokens' is array[string], expected array[int32]");
  CHECK_EQ(rlm__gguf_get_u32(g, "llama.block_count", &u, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_EQ(err.msg, "ok.gguf: key 'llama.block_count' is missing");
  CHECK_EQ(rlm__gguf_get_uint(g, "llama.context_length", 1000, &u64, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "is 4096, expected 0 to 1000");
  CHECK_EQ(rlm__gguf_get_uint(g, "test.i8", 1000, &u64, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "is -128, expected 0 to 1000");
  CHECK_EQ(rlm__gguf_get_uint(g, "test.bool", 1000, &u64, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "is bool, expected an integer");
  CHECK_EQ(rlm__gguf_get_uint(g, "llama.context_length", 1u << 20, &u64, &err), RLM_OK);
  CHECK_EQ(u64, 4096);
  CHECK_EQ(rlm__gguf_get_u32(g, NULL, &u, &err), RLM_ERR_INVALID);
  rlm__gguf_free(g);
  free(w.p);
}

/* Each allocation of open fails in turn: every one is RLM_ERR_NOMEM
 * (ASan: nothing leaks), until the open succeeds. */
TEST(allocation_failures) {
  gw w = {0};
  gw_model(&w, 3, 0, NULL);
  int64_t n = 0;
  for (; n < 1000; n++) {
    rlm_gguf *g = NULL;
    rlm_error err = {0};
    rlm__alloc_fail_at(n);
    rlm_status rc = rlm__gguf_open_memory(&g, "ok.gguf", w.p, w.n, &err);
    rlm__alloc_fail_at(-1);
    rlm__gguf_free(g);
    if (rc == RLM_OK) break;
    test_note("allocation %" PRId64 ": %s", n, err.msg);
    CHECK_EQ(rc, RLM_ERR_NOMEM);
    CHECK(g == NULL);
  }
  t_note[0] = 0;
  CHECK(n >= 5);
  CHECK(n < 1000);
  free(w.p);
}

/* ---- the public calls and the CLI --------------------------------------------- */

static void check_key(const rlm_gguf *g, const char *key, const char *type, const char *value) {
  for (size_t i = 0; i < rlm_gguf_key_count(g); i++) {
    rlm_gguf_key_info k;
    char buf[512];
    CHECK_EQ(rlm_gguf_key_get(g, i, &k, buf, sizeof buf, NULL), RLM_OK);
    if (strcmp(k.key, key)) continue;
    CHECK_STR_EQ(k.type, type);
    CHECK_STR_EQ(buf, value);
    return;
  }
  CHECK(!"key found");
}

TEST(public_api_renders_values) {
  gw w = {0};
  gw_model(&w, 3, 64, NULL);
  char path[512];
  path_in(path, sizeof path, "api.gguf");
  write_file(path, &w);
  rlm_gguf *g = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_gguf_open(&g, path, &err), RLM_OK);
  if (!g) {
    free(w.p);
    return;
  }
  CHECK_EQ(rlm_gguf_version(g), 3);
  CHECK_EQ(rlm_gguf_alignment(g), 64);
  CHECK_EQ(rlm_gguf_key_count(g), GW_MODEL_N_KV);
  check_key(g, "general.architecture", "string", "\"llama\"");
  check_key(g, "general.name", "string", "\"t\xc3\xa9st \\\"model\\\"\\n\"");
  check_key(g, "test.i8", "int8", "-128");
  check_key(g, "test.u64", "uint64", "18446744073709551615");
  check_key(g, "test.i64", "int64", "-9223372036854775808");
  check_key(g, "llama.rope.freq_base", "float32", "500000");
  check_key(g, "test.f64", "float64", "0.1");
  check_key(g, "test.bool", "bool", "true");
  check_key(g, "tokenizer.ggml.tokens", "array[string]", "[\"<s>\", \"\", \"\xe2\x96\x81the\"]");
  check_key(g, "tokenizer.ggml.scores", "array[float32]", "[0, -1.5, 2.25]");
  check_key(g, "test.nested", "array[array]", "[[1, -2], []]");
  rlm_gguf_key_info k;
  char small[6];
  CHECK_EQ(rlm_gguf_key_get(g, 0, &k, small, sizeof small, NULL), RLM_OK);
  CHECK_STR_EQ(small, "\"llam"); /* cut to fit, terminated */
  CHECK_EQ(k.n, 5);
  CHECK_EQ(rlm_gguf_key_get(g, 0, &k, NULL, 0, NULL), RLM_OK);
  CHECK_EQ(rlm_gguf_key_get(g, 99, &k, small, sizeof small, &err), RLM_ERR_INVALID);
  rlm_gguf_tensor_info t;
  CHECK_EQ(rlm_gguf_tensor_count(g), GW_MODEL_N_TENSORS);
  CHECK_EQ(rlm_gguf_tensor_get(g, 3, &t, NULL), RLM_OK);
  CHECK_STR_EQ(t.name, "blk.0.ffn_down.weight");
  CHECK_STR_EQ(t.type, "Q6_K");
  CHECK_EQ(t.type_id, 14);
  CHECK(t.n_dims == 3 && t.dims[0] == 256 && t.dims[1] == 1 && t.dims[2] == 2 && t.dims[3] == 1);
  CHECK_EQ(t.nbytes, 420);
  CHECK_EQ((uintptr_t)t.data % 64, 0);
  CHECK_EQ(rlm_gguf_tensor_get(g, GW_MODEL_N_TENSORS, &t, &err), RLM_ERR_INVALID);
  rlm_gguf_free(g);
  free(w.p);
}

TEST(long_values_are_cut) {
  gw w = {0};
  char s[101];
  memset(s, 'a', 100);
  s[100] = 0;
  gw_header(&w, 3, 0, 3);
  gw_kv_str(&w, "a.long", s);
  gw_key(&w, "a.many", GW_ARR);
  gw_arr(&w, GW_U16, 20);
  for (int i = 0; i < 20; i++) gw_le(&w, (uint64_t)i, 2);
  gw_key(&w, "a.strs", GW_ARR);
  gw_arr(&w, GW_STR, 1);
  gw_str(&w, s);
  char path[512];
  path_in(path, sizeof path, "long.gguf");
  write_file(path, &w);
  rlm_gguf *g = NULL;
  CHECK_EQ(rlm_gguf_open(&g, path, NULL), RLM_OK);
  if (g) {
    char want[200];
    snprintf(want, sizeof want, "\"%.64s...\" (100 bytes)", s);
    check_key(g, "a.long", "string", want);
    check_key(g, "a.many", "array[uint16]", "[0, 1, 2, 3, 4, 5, 6, 7, ...] (20 elements)");
    snprintf(want, sizeof want, "[\"%.24s...\"]", s);
    check_key(g, "a.strs", "array[string]", want);
  }
  rlm_gguf_free(g);
  free(w.p);
}

/* `ringlm inspect` on a valid file (the CLI's bad-file cases are in
 * test_cli_badinput). */
TEST(cli_inspect_lists_keys_and_tensors) {
  const char *bin = getenv("RINGLM_BIN");
  if (!bin || !*bin) {
    t_skip("RINGLM_BIN is not set: `ringlm inspect` on a GGUF file not run");
    return;
  }
  gw w = {0};
  gw_model(&w, 3, 0, NULL);
  char path[512], out[16384];
  path_in(path, sizeof path, "model.bin"); /* no .gguf: found by its magic */
  write_file(path, &w);
  free(w.p);
  CHECK_EQ(t_run_cmd(out, sizeof out, "%s inspect %s", bin, path), 0);
  test_note("%s", out);
  CHECK(strncmp(out, "GGUF version 3, alignment 32\n", 29) == 0);
  CHECK_STR_CONTAINS(out, "\ngeneral.architecture  string         \"llama\"\n");
  CHECK_STR_CONTAINS(out, "\ntokenizer.ggml.tokens array[string]  [\"<s>\", \"\", ");
  CHECK_STR_CONTAINS(out, "\ntest.nested           array[array]   [[1, -2], []]\n\n");
  CHECK_STR_CONTAINS(out, "\nblk.0.attn_q.weight ");
  CHECK_STR_CONTAINS(out, " Q4_K  [256, 2]     288\n");
  CHECK_STR_CONTAINS(out, " Q6_K  [256, 1, 2]  420\n");
  CHECK_STR_CONTAINS(out, " BF16  [2, 1, 3, 1]  12\n");
  CHECK_STR_CONTAINS(out, "\n16 keys, 7 tensors, 1284 bytes (0.00 MB, 1.3 KiB)\n");
}

int main(void) {
  t_tmpdir(g_dir, sizeof g_dir, "gguf");
  RUN(v3_default_alignment_reads_back);
  RUN(v2_custom_alignment_reads_back);
  RUN(keys_only_and_gaps_are_valid);
  RUN(every_ggml_type_sized);
  RUN(header_rules);
  RUN(truncated_at_every_byte);
  RUN(string_rules);
  RUN(value_rules);
  RUN(array_rules);
  RUN(nesting_is_bounded);
  RUN(alignment_rules);
  RUN(tensor_rules);
  RUN(data_section_truncated);
  RUN(open_arguments_and_files);
  RUN(getters_refuse_other_types);
  RUN(allocation_failures);
  RUN(public_api_renders_values);
  RUN(long_values_are_cut);
  RUN(cli_inspect_lists_keys_and_tensors);
  return t_finish(g_dir);
}
