/* test_safetensors.c -- the safetensors reader and writer: round trips (a
 * single file, a folder with model.safetensors, a sharded folder), every
 * malformed-header rule of safetensors.h with its exact status and a
 * message naming the file and the tensor, the sharded-index rules, writer
 * argument checks, and allocation fault injection over save and open.
 * Malformed files are written byte by byte (write_st) so that each case is
 * exactly the bytes a broken or hostile exporter would produce. */
#include "model/safetensors.h"
#include "test.h"

#include <ftw.h>
#include <sys/stat.h>

static char g_dir[256]; /* this run's temp folder, removed at the end */

static void path_in(char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/%s", g_dir, name);
}

/* A fresh folder under g_dir. */
static void subdir(char *out, size_t n, const char *name) {
  path_in(out, n, name);
  if (mkdir(out, 0755) != 0) {
    perror(out);
    exit(2);
  }
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n)) {
    perror(path);
    exit(2);
  }
  fclose(f);
}

static void write_text(const char *path, const char *text) {
  write_bytes(path, text, strlen(text));
}

/* A safetensors file by hand: u64 hdr_len little-endian, json, data. */
static void write_st_len(const char *path, uint64_t hdr_len, const char *json,
                         const void *data, size_t ndata) {
  size_t nj = strlen(json);
  uint8_t *buf = malloc(8 + nj + ndata);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hdr_len >> (8 * i));
  memcpy(buf + 8, json, nj);
  if (ndata) memcpy(buf + 8 + nj, data, ndata);
  write_bytes(path, buf, 8 + nj + ndata);
  free(buf);
}

static void write_st(const char *path, const char *json, const void *data, size_t ndata) {
  write_st_len(path, strlen(json), json, data, ndata);
}

/* Opening path must fail with `want`, leave *out NULL, and say where. */
static void check_open_fails(const char *path, rlm_status want, const char *needle1,
                             const char *needle2) {
  rlm_safetensors *st = (rlm_safetensors *)(uintptr_t)1;
  rlm_error err = {0};
  rlm_status rc = rlm__st_open(&st, path, &err);
  CHECK_EQ(rc, want);
  CHECK_EQ(err.code, want);
  CHECK(st == NULL);
  CHECK_STR_CONTAINS(err.msg, path);
  if (needle1) CHECK_STR_CONTAINS(err.msg, needle1);
  if (needle2) CHECK_STR_CONTAINS(err.msg, needle2);
  if (rc == RLM_OK) rlm__st_free(st);
}

static rlm_safetensors *open_ok(const char *path) {
  rlm_safetensors *st = NULL;
  rlm_error err = {0};
  rlm_status rc = rlm__st_open(&st, path, &err);
  CHECK_EQ(rc, RLM_OK);
  if (rc) fprintf(stderr, "  open %s: %s\n", path, err.msg);
  return st;
}

/* ---- malformed headers --------------------------------------------------- */

typedef struct bad_case {
  const char *json;   /* the header                                  */
  size_t ndata;       /* zero bytes of data buffer after it          */
  const char *tensor; /* "'name'" the message must name, or NULL     */
  const char *what;   /* a phrase saying what is wrong, or NULL      */
} bad_case;

static void run_bad_cases(const char *file, const bad_case *cases, size_t n) {
  static const uint8_t zeros[64];
  char path[512];
  path_in(path, sizeof path, file);
  for (size_t i = 0; i < n; i++) {
    test_note("case %zu: %s", i, cases[i].json);
    write_st(path, cases[i].json, zeros, cases[i].ndata);
    check_open_fails(path, RLM_ERR_FORMAT, cases[i].tensor, cases[i].what);
  }
  t_note[0] = 0;
}

/* One header entry: "name": {"dtype": dt, "shape": shape, "data_offsets": offs}. */
#define ENTRY(name, dt, shape, offs)                                          \
  "\"" name "\": {\"dtype\": " dt ", \"shape\": " shape ", \"data_offsets\": " offs "}"

TEST(bad_length_prefix) {
  char path[512];
  path_in(path, sizeof path, "prefix.safetensors");
  write_bytes(path, "\x02\0\0", 3);
  check_open_fails(path, RLM_ERR_FORMAT, "truncated", NULL);
  write_bytes(path, "", 0);
  check_open_fails(path, RLM_ERR_FORMAT, "truncated", NULL);
  write_st_len(path, 64, "{}", NULL, 0);
  check_open_fails(path, RLM_ERR_FORMAT, "past the end", NULL);
  write_st_len(path, 1, "{}", NULL, 0); /* header "{", buffer "}" */
  check_open_fails(path, RLM_ERR_FORMAT, "invalid JSON", NULL);
  write_st_len(path, 200000000, "{}", NULL, 0);
  check_open_fails(path, RLM_ERR_FORMAT, "absurd", NULL);
  write_st_len(path, UINT64_MAX, "{}", NULL, 0);
  check_open_fails(path, RLM_ERR_FORMAT, "absurd", NULL);
  path_in(path, sizeof path, "does-not-exist.safetensors");
  check_open_fails(path, RLM_ERR_IO, NULL, NULL);
}

TEST(bad_json) {
  static const bad_case cases[] = {
      {"", 0, NULL, "invalid JSON"},
      {"{\"a\": ", 0, NULL, "invalid JSON"},
      {"{\"a\": {}} trailing", 0, NULL, "invalid JSON"},
      {"[1, 2]", 0, NULL, "not a JSON object"},
      {"{" ENTRY("w", "\"F32\"", "[1]", "[0, 4]") ", " ENTRY("w", "\"F32\"", "[1]", "[4, 8]") "}",
       8, NULL, "invalid JSON"}, /* duplicate name */
  };
  run_bad_cases("json.safetensors", cases, sizeof cases / sizeof *cases);
}

TEST(bad_entries) {
  static const bad_case cases[] = {
      {"{\"w\": 5}", 0, "'w'", "not an object"},
      {"{\"w\": [\"F32\"]}", 0, "'w'", "not an object"},
      {"{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "'w'", "\"dtype\""},
      {"{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "'w'", "\"shape\""},
      {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "'w'", "\"data_offsets\""},
      {"{" ENTRY("w", "5", "[1]", "[0, 4]") "}", 4, "'w'", "not a string"},
      {"{" ENTRY("w", "\"F8_E4M3\"", "[1]", "[0, 1]") "}", 1, "'w'", "'F8_E4M3'"},
      {"{" ENTRY("w", "\"f32\"", "[1]", "[0, 4]") "}", 4, "'w'", "'f32'"},
  };
  run_bad_cases("entries.safetensors", cases, sizeof cases / sizeof *cases);
}

TEST(bad_shapes) {
  static const bad_case cases[] = {
      {"{" ENTRY("w", "\"F32\"", "[-1]", "[0, 0]") "}", 0, "'w'", "shape[0]"},
      {"{" ENTRY("w", "\"F32\"", "[2, 1.5]", "[0, 4]") "}", 4, "'w'", "shape[1]"},
      {"{" ENTRY("w", "\"F32\"", "[\"2\"]", "[0, 8]") "}", 8, "'w'", "shape[0]"},
      {"{" ENTRY("w", "\"F32\"", "2", "[0, 8]") "}", 8, "'w'", "not an array"},
      {"{" ENTRY("w", "\"U8\"", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", "[0, 1]") "}", 1, "'w'",
       "9 dimensions"},
      /* 2^62 * 4 * 4 bytes wraps 64 bits: must be caught, not wrapped to 0 */
      {"{" ENTRY("w", "\"F32\"", "[4611686018427387904, 4]", "[0, 0]") "}", 0, "'w'", "overflow"},
  };
  run_bad_cases("shapes.safetensors", cases, sizeof cases / sizeof *cases);
}

TEST(bad_offsets) {
  static const char *two = "two non-negative";
  const bad_case cases[] = {
      {"{" ENTRY("w", "\"F32\"", "[1]", "[0]") "}", 4, "'w'", two},
      {"{" ENTRY("w", "\"F32\"", "[1]", "[0, 4, 8]") "}", 8, "'w'", two},
      {"{" ENTRY("w", "\"F32\"", "[1]", "[-4, 0]") "}", 4, "'w'", two},
      {"{" ENTRY("w", "\"F32\"", "[1]", "[0, 4.0]") "}", 4, "'w'", two},
      {"{" ENTRY("w", "\"F32\"", "[1]", "\"0,4\"") "}", 4, "'w'", two},
      {"{" ENTRY("w", "\"F32\"", "[1]", "[8, 4]") "}", 8, "'w'", "begin > end"},
      /* end beyond the buffer: truncated file, or offsets out of range */
      {"{" ENTRY("w", "\"F32\"", "[2]", "[0, 8]") "}", 4, "'w'", "out of range"},
      {"{" ENTRY("w", "\"U8\"", "[1]", "[9223372036854775806, 9223372036854775807]") "}", 4,
       "'w'", "out of range"},
      /* byte count does not match the shape */
      {"{" ENTRY("w", "\"F32\"", "[3]", "[0, 8]") "}", 8, "'w'", "needs 12 bytes"},
      {"{" ENTRY("w", "\"BF16\"", "[]", "[0, 4]") "}", 4, "'w'", "needs 2 bytes"},
  };
  run_bad_cases("offsets.safetensors", cases, sizeof cases / sizeof *cases);
}

TEST(bad_coverage) {
  static const bad_case cases[] = {
      {"{" ENTRY("a", "\"F32\"", "[2]", "[0, 8]") ", " ENTRY("b", "\"F32\"", "[2]", "[4, 12]") "}",
       12, "'b'", "overlaps tensor 'a'"},
      {"{" ENTRY("b", "\"F32\"", "[2]", "[0, 8]") ", " ENTRY("a", "\"F32\"", "[2]", "[0, 8]") "}",
       8, NULL, "overlaps"},
      {"{" ENTRY("a", "\"F32\"", "[2]", "[0, 8]") ", " ENTRY("z", "\"F32\"", "[0]", "[4, 4]") "}",
       8, "'z'", "overlaps tensor 'a'"},
      {"{" ENTRY("a", "\"F32\"", "[1]", "[0, 4]") ", " ENTRY("b", "\"F32\"", "[1]", "[8, 12]") "}",
       12, "'b'", "hole"},
      {"{" ENTRY("a", "\"F32\"", "[1]", "[0, 4]") "}", 8, NULL, "[4, 8)"},
      {"{}", 4, NULL, "belong to no tensor"},
      {"{\"__metadata__\": {\"k\": \"v\"}}", 1, NULL, "belong to no tensor"},
  };
  run_bad_cases("cover.safetensors", cases, sizeof cases / sizeof *cases);
}

TEST(bad_metadata) {
  static const bad_case cases[] = {
      {"{\"__metadata__\": 5}", 0, "__metadata__", "not an object"},
      {"{\"__metadata__\": [\"a\"]}", 0, "__metadata__", "not an object"},
      {"{\"__metadata__\": {\"k\": 1}}", 0, "'k'", "not a string"},
      {"{\"__metadata__\": {\"a\": \"x\", \"k\": null}}", 0, "'k'", "not a string"},
  };
  run_bad_cases("meta.safetensors", cases, sizeof cases / sizeof *cases);
}

/* Well-formed edge cases written by hand: empty, metadata only, padded,
 * an unaligned data buffer, zero-size tensors at shared offsets. */
TEST(valid_by_hand) {
  char path[512];
  path_in(path, sizeof path, "hand.safetensors");
  write_st(path, "{}", NULL, 0);
  rlm_safetensors *st = open_ok(path);
  CHECK_EQ(rlm__st_count(st), 0);
  CHECK(rlm__st_at(st, 0) == NULL);
  CHECK(rlm__st_find(st, "x") == NULL);
  CHECK(rlm__st_metadata(st, "k") == NULL);
  rlm__st_free(st);

  write_st(path, "{\"__metadata__\": {\"k\": \"v\"}}      ", NULL, 0);
  st = open_ok(path);
  CHECK_EQ(rlm__st_count(st), 0);
  CHECK(st && strcmp(rlm__st_metadata(st, "k"), "v") == 0);
  rlm__st_free(st);

  const uint8_t data[5] = {1, 2, 3, 4, 5};
  write_st(path, "{" ENTRY("e", "\"F32\"", "[0, 3]", "[4, 4]") ", "
                 ENTRY("f", "\"F16\"", "[0]", "[0, 0]") ", "
                 "\"w\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4], \"x\": 1}, "
                 ENTRY("b", "\"BOOL\"", "[1]", "[4, 5]") "}", data, sizeof data);
  st = open_ok(path);
  CHECK_EQ(rlm__st_count(st), 4);
  const rlm_st_tensor *w = rlm__st_find(st, "w"), *b = rlm__st_find(st, "b");
  CHECK(w && w->dtype == RLM_DTYPE_I32 && w->nbytes == 4 && memcmp(w->data, data, 4) == 0);
  CHECK(b && b->dtype == RLM_DTYPE_BOOL && *(const uint8_t *)b->data == 5);
  rlm__st_free(st);
}

TEST(dtype_names) {
  for (int t = 0; t < RLM_DTYPE_COUNT; t++) {
    rlm_dtype got = RLM_DTYPE_COUNT;
    CHECK(rlm__dtype_from_name(rlm_dtype_name((rlm_dtype)t), &got));
    CHECK_EQ(got, t);
  }
  rlm_dtype d;
  CHECK(!rlm__dtype_from_name("f32", &d));
  CHECK(!rlm__dtype_from_name("F8_E4M3", &d));
  CHECK(!rlm__dtype_from_name("", &d));
  CHECK(!rlm__dtype_from_name(NULL, &d));
}

/* ---- writer and round trips -------------------------------------------- */

typedef struct expect_tensor {
  const char *name;
  rlm_dtype dtype;
  int ndim;
  int64_t shape[3];
  const void *data;
  size_t nbytes;
} expect_tensor;

static void check_tensor(const rlm_st_tensor *t, const expect_tensor *e) {
  test_note("tensor %s", e->name);
  CHECK(t != NULL);
  if (!t) return;
  CHECK(strcmp(t->name, e->name) == 0);
  CHECK_EQ(t->dtype, e->dtype);
  CHECK_EQ(t->ndim, e->ndim);
  for (int d = 0; d < e->ndim; d++) CHECK_EQ(t->shape[d], e->shape[d]);
  CHECK_EQ(t->nbytes, e->nbytes);
  CHECK(e->nbytes == 0 || memcmp(t->data, e->data, e->nbytes) == 0);
  t_note[0] = 0;
}

static uint64_t file_header_len(const char *path, long *size) {
  uint8_t b[8] = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  if (fread(b, 1, 8, f) != 8) memset(b, 0, 8);
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fclose(f);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
  return n;
}

static const float k_f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
static const uint32_t k_u32[3] = {7, 8, 0xffffffffu};
static const uint16_t k_bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
static const float k_scalar = 3.5f;

static const expect_tensor k_round[] = { /* name order */
    {"a.bf16", RLM_DTYPE_BF16, 1, {4}, k_bf16, sizeof k_bf16},
    {"e.empty", RLM_DTYPE_F16, 2, {0, 5}, NULL, 0},
    {"m.u32", RLM_DTYPE_U32, 1, {3}, k_u32, sizeof k_u32},
    {"s.scalar", RLM_DTYPE_F32, 0, {0}, &k_scalar, sizeof k_scalar},
    {"z.f32", RLM_DTYPE_F32, 2, {2, 3}, k_f32, sizeof k_f32},
};

/* Adds k_round out of order (bf16 as an owned copy) plus metadata. */
static rlm_status fill_writer(rlm_st_writer *w, rlm_error *err) {
  const expect_tensor *t = k_round;
  rlm_status rc = rlm__st_writer_add(w, t[4].name, t[4].dtype, 2, t[4].shape, k_f32,
                                     sizeof k_f32, err);
  if (!rc)
    rc = rlm__st_writer_add(w, t[2].name, t[2].dtype, 1, t[2].shape, k_u32, sizeof k_u32, err);
  void *copy = rc ? NULL : rlm__malloc(sizeof k_bf16);
  if (!rc && !copy) return rlm__err_nomem(err, "test buffer", sizeof k_bf16);
  if (copy) memcpy(copy, k_bf16, sizeof k_bf16);
  if (!rc)
    rc = rlm__st_writer_add_owned(w, t[0].name, t[0].dtype, 1, t[0].shape, copy, sizeof k_bf16,
                                  err);
  if (!rc) rc = rlm__st_writer_add(w, t[3].name, t[3].dtype, 0, NULL, &k_scalar, 4, err);
  if (!rc) rc = rlm__st_writer_add(w, t[1].name, t[1].dtype, 2, t[1].shape, NULL, 0, err);
  if (!rc) rc = rlm__st_writer_set_metadata(w, "format", "pt", err);
  if (!rc) rc = rlm__st_writer_set_metadata(w, "k", "v1", err);
  if (!rc) rc = rlm__st_writer_set_metadata(w, "k", "v2", err);
  return rc;
}

static rlm_status save_round(const char *path, rlm_error *err) {
  rlm_st_writer *w = NULL;
  rlm_status rc = rlm__st_writer_create(&w, err);
  if (!rc) rc = fill_writer(w, err);
  if (!rc) rc = rlm__st_writer_save(w, path, err);
  rlm__st_writer_free(w);
  return rc;
}

TEST(round_trip) {
  char path[512];
  path_in(path, sizeof path, "round.safetensors");
  rlm_error err = {0};
  CHECK_EQ(save_round(path, &err), RLM_OK);
  rlm_safetensors *st = open_ok(path);
  size_t n = sizeof k_round / sizeof *k_round;
  CHECK_EQ(rlm__st_count(st), n);
  for (size_t i = 0; i < n && i < rlm__st_count(st); i++) {
    check_tensor(rlm__st_at(st, i), &k_round[i]);
    CHECK(rlm__st_find(st, k_round[i].name) == rlm__st_at(st, i));
    CHECK_EQ(rlm__st_at(st, i)->file_index, 0);
  }
  CHECK(rlm__st_at(st, n) == NULL);
  CHECK(rlm__st_find(st, "nope") == NULL);
  CHECK(rlm__st_find(st, "") == NULL);
  CHECK(st && strcmp(rlm__st_metadata(st, "format"), "pt") == 0);
  CHECK(st && strcmp(rlm__st_metadata(st, "k"), "v2") == 0);
  CHECK(rlm__st_metadata(st, "missing") == NULL);
  CHECK_EQ(rlm__st_file_count(st), 1);
  CHECK(st && strcmp(rlm__st_file_path(st, 0), path) == 0);
  CHECK(rlm__st_file_path(st, 1) == NULL);
  rlm__st_free(st);
  long size = 0;
  uint64_t hdr = file_header_len(path, &size);
  CHECK_EQ((8 + hdr) % 8, 0); /* the data buffer starts 8-aligned */
  CHECK_EQ((uint64_t)size, 8 + hdr + sizeof k_f32 + sizeof k_u32 + sizeof k_bf16 + 4);
}

TEST(writer_empty_and_metadata_only) {
  char path[512];
  path_in(path, sizeof path, "empty.safetensors");
  rlm_st_writer *w = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm__st_writer_create(&w, &err), RLM_OK);
  CHECK_EQ(rlm__st_writer_save(w, path, &err), RLM_OK);
  rlm_safetensors *st = open_ok(path);
  CHECK_EQ(rlm__st_count(st), 0);
  rlm__st_free(st);
  CHECK_EQ(rlm__st_writer_set_metadata(w, "only", "meta", &err), RLM_OK);
  CHECK_EQ(rlm__st_writer_save(w, path, &err), RLM_OK);
  rlm__st_writer_free(w);
  st = open_ok(path);
  CHECK_EQ(rlm__st_count(st), 0);
  CHECK(st && strcmp(rlm__st_metadata(st, "only"), "meta") == 0);
  rlm__st_free(st);
}

static void check_invalid(rlm_status rc, const rlm_error *err, const char *needle) {
  CHECK_EQ(rc, RLM_ERR_INVALID);
  CHECK_EQ(err->code, RLM_ERR_INVALID);
  if (needle) CHECK_STR_CONTAINS(err->msg, needle);
}

TEST(writer_rejects_bad_arguments) {
  rlm_st_writer *w = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm__st_writer_create(&w, &err), RLM_OK);
  int64_t s2[1] = {2}, neg[1] = {-1}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  float x[2] = {1, 2};
#define BAD_ADD(name, dt, nd, sh, p, nb, needle) \
  check_invalid(rlm__st_writer_add(w, name, dt, nd, sh, p, nb, &err), &err, needle)
  CHECK_EQ(rlm__st_writer_add(w, "x", RLM_DTYPE_F32, 1, s2, x, 8, &err), RLM_OK);
  BAD_ADD("x", RLM_DTYPE_F32, 1, s2, x, 8, "'x' added twice");
  BAD_ADD("", RLM_DTYPE_F32, 1, s2, x, 8, "empty");
  BAD_ADD(NULL, RLM_DTYPE_F32, 1, s2, x, 8, NULL);
  BAD_ADD("__metadata__", RLM_DTYPE_F32, 1, s2, x, 8, "reserved");
  BAD_ADD("bad\xff", RLM_DTYPE_F32, 1, s2, x, 8, "UTF-8");
  BAD_ADD("y", (rlm_dtype)99, 1, s2, x, 8, "'y': invalid dtype");
  BAD_ADD("y", RLM_DTYPE_F32, 1, s2, x, 4, "needs 8 bytes");
  BAD_ADD("y", RLM_DTYPE_F32, 1, s2, NULL, 8, "'y'");
  BAD_ADD("y", RLM_DTYPE_F32, 1, neg, x, 0, "negative");
  BAD_ADD("y", RLM_DTYPE_U8, 9, s9, x, 1, "ndim 9");
  BAD_ADD("y", RLM_DTYPE_U8, 1, NULL, x, 1, "ndim 1");
  /* add_owned frees its buffer when it fails (ASan reports a leak if not) */
  void *owned = rlm__malloc(8);
  rlm_status rc = rlm__st_writer_add_owned(w, "x", RLM_DTYPE_F32, 1, s2, owned, 8, &err);
  check_invalid(rc, &err, "twice");
  check_invalid(rlm__st_writer_set_metadata(w, "", "v", &err), &err, NULL);
  check_invalid(rlm__st_writer_set_metadata(w, "k", NULL, &err), &err, "'k'");
  check_invalid(rlm__st_writer_set_metadata(w, "k", "\xc3", &err), &err, "UTF-8");
  check_invalid(rlm__st_writer_save(w, NULL, &err), &err, NULL);
#undef BAD_ADD
  char path[512];
  path_in(path, sizeof path, "no-such-folder/x.safetensors");
  CHECK_EQ(rlm__st_writer_save(w, path, &err), RLM_ERR_IO);
  CHECK_STR_CONTAINS(err.msg, "no-such-folder");
  rlm__st_writer_free(w);
  rlm__st_writer_free(NULL);
  rlm__st_free(NULL);
}

TEST(folder_with_model_safetensors) {
  char dir[512], path[600];
  subdir(dir, sizeof dir, "plain");
  check_open_fails(dir, RLM_ERR_NOT_FOUND, "neither", NULL);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  rlm_error err = {0};
  CHECK_EQ(save_round(path, &err), RLM_OK);
  rlm_safetensors *st = open_ok(dir);
  CHECK_EQ(rlm__st_count(st), sizeof k_round / sizeof *k_round);
  check_tensor(rlm__st_find(st, "z.f32"), &k_round[4]);
  CHECK(st && strcmp(rlm__st_file_path(st, 0), path) == 0);
  rlm__st_free(st);
  write_st(path, "{\"w\": 1}", NULL, 0); /* errors name the file, not the folder */
  check_open_fails(dir, RLM_ERR_FORMAT, path, "'w'");
}

/* ---- sharded folders ---------------------------------------------------- */

static const char *k_shard1 = "model-00001-of-00002.safetensors";
static const char *k_shard2 = "model-00002-of-00002.safetensors";

/* Saves n F32 [2] tensors whose values are base + i, and a "shard" key. */
static void write_shard(const char *dir, const char *file, const char *const *names, int n,
                        float base) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  static float vals[16][2];
  rlm_st_writer *w = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm__st_writer_create(&w, &err), RLM_OK);
  for (int i = 0; i < n; i++) {
    int k = (int)(base + i) % 16;
    vals[k][0] = vals[k][1] = base + (float)i;
    int64_t shape[1] = {2};
    CHECK_EQ(rlm__st_writer_add(w, names[i], RLM_DTYPE_F32, 1, shape, vals[k], 8, &err), RLM_OK);
  }
  CHECK_EQ(rlm__st_writer_set_metadata(w, "shard", file, &err), RLM_OK);
  CHECK_EQ(rlm__st_writer_save(w, path, &err), RLM_OK);
  rlm__st_writer_free(w);
}

static void write_index(const char *dir, const char *weight_map) {
  char path[600], text[1024];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": %s}\n",
           weight_map);
  write_text(path, text);
}

/* A two-shard folder: a.w, b.w, extra.w in shard 1 (extra.w is not in the
 * weight_map), c.w in shard 2. */
static void make_sharded(char *dir, size_t n, const char *name) {
  subdir(dir, n, name);
  write_shard(dir, k_shard1, (const char *const[]){"b.w", "a.w", "extra.w"}, 3, 0);
  write_shard(dir, k_shard2, (const char *const[]){"c.w"}, 1, 10);
  write_index(dir, "{\"a.w\": \"model-00001-of-00002.safetensors\","
                   " \"c.w\": \"model-00002-of-00002.safetensors\","
                   " \"b.w\": \"model-00001-of-00002.safetensors\"}");
}

static void check_sharded(const rlm_safetensors *st) {
  CHECK_EQ(rlm__st_count(st), 4);
  CHECK_EQ(rlm__st_file_count(st), 2);
  const rlm_st_tensor *a = rlm__st_find(st, "a.w"), *c = rlm__st_find(st, "c.w");
  CHECK(a && a->file_index == 0 && ((const float *)a->data)[1] == 1.0f);
  CHECK(c && c->file_index == 1 && ((const float *)c->data)[0] == 10.0f);
  CHECK(rlm__st_find(st, "extra.w") != NULL); /* lenient: kept though unlisted */
  CHECK_STR_CONTAINS(rlm__st_file_path(st, 0), k_shard1);
  CHECK_STR_CONTAINS(rlm__st_file_path(st, 1), k_shard2);
  CHECK(st && strcmp(rlm__st_metadata(st, "shard"), k_shard1) == 0); /* first shard's */
  for (size_t i = 1; i < rlm__st_count(st); i++)
    CHECK(strcmp(rlm__st_at(st, i - 1)->name, rlm__st_at(st, i)->name) < 0);
}

TEST(sharded_round_trip) {
  char dir[512], index[600];
  make_sharded(dir, sizeof dir, "sharded");
  rlm_safetensors *st = open_ok(dir);
  check_sharded(st);
  rlm__st_free(st);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  st = open_ok(index);
  check_sharded(st);
  rlm__st_free(st);
}

TEST(sharded_errors) {
  char dir[512], index[600], shard[600];
  make_sharded(dir, sizeof dir, "sharded-bad");
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  snprintf(shard, sizeof shard, "%s/%s", dir, k_shard1);
  write_index(dir, "{\"a.w\": \"model-00001-of-00002.safetensors\","
                   " \"d.w\": \"model-00001-of-00002.safetensors\"}");
  check_open_fails(dir, RLM_ERR_FORMAT, "'d.w'", shard);
  write_index(dir, "{\"c.w\": \"model-00001-of-00002.safetensors\","
                   " \"a.w\": \"model-00002-of-00002.safetensors\"}");
  check_open_fails(index, RLM_ERR_FORMAT, "'c.w'", shard); /* in the other shard */
  write_index(dir, "{\"a.w\": \"model-00003-of-00002.safetensors\"}");
  check_open_fails(dir, RLM_ERR_IO, "model-00003-of-00002", NULL);
  write_index(dir, "{\"a.w\": 3}");
  check_open_fails(index, RLM_ERR_FORMAT, "'a.w'", "not a file name");
  write_index(dir, "[]");
  check_open_fails(index, RLM_ERR_FORMAT, "weight_map", NULL);
  write_text(index, "{\"weight_map\": ");
  check_open_fails(index, RLM_ERR_FORMAT, "invalid JSON", NULL);
  write_index(dir, "{}"); /* an empty weight_map: a model with no tensors */
  rlm_safetensors *st = open_ok(index);
  CHECK_EQ(rlm__st_count(st), 0);
  rlm__st_free(st);
}

TEST(sharded_duplicate_and_bad_shard) {
  char dir[512], s1[600], s2[600];
  subdir(dir, sizeof dir, "sharded-dup");
  write_shard(dir, k_shard1, (const char *const[]){"a.w", "b.w"}, 2, 0);
  write_shard(dir, k_shard2, (const char *const[]){"a.w"}, 1, 5);
  write_index(dir, "{\"b.w\": \"model-00001-of-00002.safetensors\","
                   " \"a.w\": \"model-00002-of-00002.safetensors\"}");
  snprintf(s1, sizeof s1, "%s/%s", dir, k_shard1);
  snprintf(s2, sizeof s2, "%s/%s", dir, k_shard2);
  check_open_fails(dir, RLM_ERR_FORMAT, "'a.w'", s1);
  check_open_fails(dir, RLM_ERR_FORMAT, "two shards", s2);
  write_st(s2, "{" ENTRY("a.w", "\"F32\"", "[2]", "[0, 8]") "}", "1234", 4);
  check_open_fails(dir, RLM_ERR_FORMAT, s2, "out of range");
}

/* ---- fault injection ----------------------------------------------------- */

static rlm_status open_and_free(const char *path, rlm_error *err) {
  rlm_safetensors *st = NULL;
  rlm_status rc = rlm__st_open(&st, path, err);
  if (!rc && !rlm__st_find(st, "a.bf16") && !rlm__st_find(st, "c.w")) rc = RLM_ERR_INTERNAL;
  rlm__st_free(st);
  return rc;
}

/* Save, open a file, open a sharded folder: every path through them. */
static rlm_status fault_round(const char *file, const char *folder, rlm_error *err) {
  rlm_status rc = save_round(file, err);
  if (!rc) rc = open_and_free(file, err);
  if (!rc) rc = open_and_free(folder, err);
  return rc;
}

TEST(fault_injection) {
  char file[512], folder[512];
  path_in(file, sizeof file, "fault.safetensors");
  make_sharded(folder, sizeof folder, "sharded-fault");
  int64_t n = 0;
  for (; n < 10000; n++) {
    rlm_error err = {0};
    rlm__alloc_fail_at(n);
    rlm_status rc = fault_round(file, folder, &err);
    rlm__alloc_fail_at(-1);
    if (rc == RLM_OK) break;
    test_note("allocation %" PRId64 ": %s", n, err.msg);
    CHECK_EQ(rc, RLM_ERR_NOMEM);
    CHECK_EQ(err.code, RLM_ERR_NOMEM);
  }
  t_note[0] = 0;
  CHECK(n > 10);    /* the injection reached many allocations */
  CHECK(n < 10000); /* and the run finally succeeded          */
}

/* ---------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int main(void) {
  t_tmpdir(g_dir, sizeof g_dir, "st");
  RUN(bad_length_prefix);
  RUN(bad_json);
  RUN(bad_entries);
  RUN(bad_shapes);
  RUN(bad_offsets);
  RUN(bad_coverage);
  RUN(bad_metadata);
  RUN(valid_by_hand);
  RUN(dtype_names);
  RUN(round_trip);
  RUN(writer_empty_and_metadata_only);
  RUN(writer_rejects_bad_arguments);
  RUN(folder_with_model_safetensors);
  RUN(sharded_round_trip);
  RUN(sharded_errors);
  RUN(sharded_duplicate_and_bad_shard);
  RUN(fault_injection);
  nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return test_summary();
}
