/* test_snapshot.c -- KV snapshots (src/model/snapshot.c, kv_state.c's
 * live slots, base's CRC-32C and atomic writes).
 *
 * Exact resume: a cache or a session row saved, restored elsewhere (a
 * fresh cache; another row of another session, through a file) and fed
 * the same continuation gives bit-identical outputs and logits to the one
 * never saved, for every cache kind (plain, quantized with K and V bits
 * apart, rings with and without sinks after wrap, rotating-quant, its
 * dense-first variant, KV-shared layers) on every fixture architecture and
 * the embedded model; rollback after a restore works as before it.
 * Compactness: a prefix many windows long stores a sliding layer's ring
 * (window + prefill_chunk - 1 positions) and a global layer's every
 * position, and the file's size is exactly the header plus that.
 * Bad files: every truncation and every single-bit flip of a small file,
 * another model (config, weights, architecture), other KV settings, a
 * future version, files that are not snapshots: each refused with
 * RLM_ERR_FORMAT naming the problem, the row unchanged.
 * Crash safety: a child saving two caches in turn is SIGKILLed at random
 * moments; the file is always one of them, whole. Injected ENOSPC and EIO
 * on every write and fsync, and a real EFBIG (RLIMIT_FSIZE), leave the old
 * file byte for byte.
 */
#include "kv/kv.h"
#include "model/model.h"
#include "test.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

static const char *g_src;
static char g_tmp[256];

static const char *const archs[] = {"llama", "qwen3", "mistral", "gemma3_text", "gemma4_text",
                                    "gemma4_keqv", "gemma4_moe"};
enum { N_ARCHS = sizeof archs / sizeof *archs, P = 60 };

static int32_t g_ids[200];

static rlm_model *load_dir(const char *dir) {
  rlm_model *m = NULL;
  rlm_error err;
  if (rlm_model_load(&m, dir, &err)) fprintf(stderr, "  %s: %s\n", dir, err.msg);
  CHECK(m != NULL);
  return m;
}

static rlm_model *load(const char *arch) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  return load_dir(dir);
}

static rlm_session *session(rlm_model *m, int kb, int vb, int64_t max_kv, int rows) {
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = rows, p.prefill_chunk = 8, p.k_bits = kb, p.v_bits = vb, p.max_kv = max_kv;
  p.kv_group_size = 32;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  return s;
}

/* Feeds ids to one row; logits of the last one into out (may be NULL). */
static void feed(rlm_session *s, int row, const int32_t *ids, int n, float *out) {
  int32_t rows[256];
  for (int i = 0; i < n; i++) rows[i] = row;
  rlm_error err;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, out, &err), RLM_OK);
}

/* ---- CRC-32C ------------------------------------------------------------ */

TEST(crc32c_check_value_and_reference) {
  CHECK_EQ(rlm__crc32c(0, "123456789", 9), 0xE3069283u); /* the CRC catalogue's check */
  CHECK_EQ(rlm__crc32c_ref(0, "123456789", 9), 0xE3069283u);
  uint8_t buf[600];
  uint64_t r = 7;
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(t_rng_next(&r) >> 24);
  for (size_t off = 0; off < 8; off++)
    for (size_t n = 0; n + off <= sizeof buf; n += 1 + n / 8) {
      const uint32_t a = rlm__crc32c(0, buf + off, n);
      CHECK_EQ(a, rlm__crc32c_ref(0, buf + off, n));
      CHECK_EQ(a, rlm__crc32c(rlm__crc32c(0, buf + off, n / 3), buf + off + n / 3, n - n / 3));
    }
}

/* ---- kv level: every kind ---------------------------------------------- */

typedef struct kv_case {
  rlm_kv_kind kind;
  int kb, vb, keep;
  bool dense_first;
} kv_case;

enum { H = 2, HQ = 4, D = 32, W = 16, CH = 8 };

/* One step on kv: n random tokens (appended with a query), then maybe a
 * rollback of some of them; outputs into out. Same rng, same step. */
static void kv_step(rlm_kv *kv, uint64_t *rng, float *out, bool rollback) {
  const int n = 1 + (int)(t_rng_next(rng) % CH);
  static float k[CH * H * D], v[CH * H * D], q[CH * HQ * D];
  for (int i = 0; i < n * H * D; i++) k[i] = t_rng_float(rng, -0.5f, 0.5f), v[i] = t_rng_float(rng, -0.5f, 0.5f);
  for (int i = 0; i < n * HQ * D; i++) q[i] = t_rng_float(rng, -0.5f, 0.5f);
  rlm_kv_batch b = {n, k, v, q, HQ, 0.2f, NULL, out};
  rlm_error err;
  CHECK_EQ(n == 1 ? rlm_kv_append_decode(kv, &b, &err) : rlm_kv_append_window(kv, &b, &err), RLM_OK);
  const int64_t drop = rollback ? (int64_t)(t_rng_next(rng) % (uint64_t)(n + 1)) : 0;
  if (drop) CHECK_EQ(rlm_kv_trim(kv, drop, &err), RLM_OK);
}

static rlm_kv *kv_copy_by_snapshot(const rlm_kv *kv, const rlm_kv_config *c) {
  rlm_error err;
  rlm_kv *t = NULL;
  CHECK_EQ(rlm_kv_create(&t, c, &err), RLM_OK);
  rlm_kv_live lv;
  CHECK_EQ(rlm__kv_live(kv, 0, &lv, &err), RLM_OK);
  void *arr[6] = {0};
  for (int a = 0; a < 6; a++) {
    const size_t n = rlm__kv_array_slot_bytes(kv, a) * H * (size_t)lv.n;
    if (!rlm__kv_array_slot_bytes(kv, a)) continue;
    arr[a] = malloc(n + 1);
    rlm__kv_export(kv, 0, &lv, a, arr[a]);
  }
  CHECK_EQ(rlm__kv_import(t, 0, &lv, (const void *const *)arr, &err), RLM_OK);
  for (int a = 0; a < 6; a++) free(arr[a]);
  return t;
}

TEST(kv_exact_resume_every_kind) {
  static const kv_case cases[] = {
      {RLM_KV_PLAIN, 0, 0, 0, false},         {RLM_KV_QUANT, 8, 4, 0, false},
      {RLM_KV_QUANT, 4, 4, 0, false},         {RLM_KV_ROTATING, 0, 0, 0, false},
      {RLM_KV_ROTATING, 0, 0, 3, false},      {RLM_KV_ROTATING_QUANT, 4, 4, 0, false},
      {RLM_KV_ROTATING_QUANT, 8, 4, 2, false}, {RLM_KV_ROTATING_QUANT, 4, 4, 0, true}};
  static float oa[CH * HQ * D], ob[CH * HQ * D];
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
    for (int before = 0; before < 70; before += 23) { /* empty, one window, several */
      const kv_case *kc = &cases[ci];
      rlm_kv_config c = rlm_kv_config_default(kc->kind);
      c.n_kv_heads = H, c.head_dim_k = D, c.dtype = RLM_DTYPE_BF16, c.k_bits = kc->kb, c.v_bits = kc->vb;
      c.group_size = 32, c.window = W, c.keep = kc->keep, c.max_chunk = CH, c.q_per_kv = HQ / H;
      c.dense_first = kc->dense_first;
      rlm_kv *a = NULL;
      rlm_error err;
      CHECK_EQ(rlm_kv_create(&a, &c, &err), RLM_OK);
      uint64_t r0 = 11 + ci;
      for (int i = 0; i < before; i++) kv_step(a, &r0, oa, true);
      rlm_kv *b = kv_copy_by_snapshot(a, &c);
      CHECK_EQ(rlm_kv_offset(b, 0), rlm_kv_offset(a, 0));
      int same = 1;
      for (int i = 0; i < 40; i++) {
        uint64_t ra = r0 + (uint64_t)i, rb = ra;
        memset(oa, 0, sizeof oa), memset(ob, 0, sizeof ob);
        kv_step(a, &ra, oa, true);
        kv_step(b, &rb, ob, true);
        same &= !memcmp(oa, ob, sizeof oa) && rlm_kv_offset(a, 0) == rlm_kv_offset(b, 0);
      }
      test_note("%s after %d steps", rlm_kv_signature(a), before);
      CHECK(same);
      rlm_kv_free(a), rlm_kv_free(b);
    }
}

/* ---- sessions: exact resume --------------------------------------------- */

/* Row 0 of a 3-row session is saved to a file after P tokens (rings
 * wrapped), loaded into row 2 of a fresh session, and both go on: steps,
 * a chunk, a rollback, more steps. Logits bit-identical throughout. */
static void check_resume(rlm_model *m, const char *what, int kb, int vb, int64_t max_kv) {
  const int V = rlm_model_vocab_size(m);
  rlm_session *s1 = session(m, kb, vb, max_kv, 3), *s2 = session(m, kb, vb, max_kv, 3);
  float *a = malloc(sizeof(float) * 2 * (size_t)V), *b = a + V;
  feed(s1, 1, g_ids + 100, 20, a); /* other rows hold other text */
  feed(s1, 0, g_ids, P, a);
  feed(s2, 0, g_ids + 120, 9, a);
  char path[300];
  snprintf(path, sizeof path, "%s/resume.safetensors", g_tmp);
  rlm_error err;
  CHECK_EQ(rlm_session_row_save_file(s1, 0, g_ids, P, path, &err), RLM_OK);
  rlm_snapshot *sn = NULL;
  CHECK_EQ(rlm_snapshot_open(&sn, path, &err), RLM_OK);
  if (!sn) return;
  int64_t nt;
  const int32_t *t = rlm_snapshot_tokens(sn, &nt);
  CHECK_EQ(nt, P);
  CHECK(t && !memcmp(t, g_ids, P * sizeof *t));
  CHECK_EQ(rlm_session_row_load(s2, 2, sn, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_position(s2, 2), P);
  rlm_snapshot_free(sn);
  /* back into the restored prefix at once (a prompt that diverges near
   * its end): rings need the slack the file kept */
  CHECK_EQ(rlm_session_rollback(s1, 0, 3, &err), RLM_OK);
  CHECK_EQ(rlm_session_rollback(s2, 2, 3, &err), RLM_OK);
  int same = 1;
  for (int i = 0; i < 12; i++) {
    const int n = i == 3 ? 6 : 1; /* steps and one chunk */
    feed(s1, 0, g_ids + P + i, n, a);
    feed(s2, 2, g_ids + P + i, n, b);
    same &= !memcmp(a, b, sizeof(float) * (size_t)V);
    if (i == 6) { /* a rollback after the restore, as speculative decoding does */
      CHECK_EQ(rlm_session_rollback(s1, 0, 4, &err), RLM_OK);
      CHECK_EQ(rlm_session_rollback(s2, 2, 4, &err), RLM_OK);
    }
  }
  test_note("%s k%dv%d max_kv %lld", what, kb, vb, (long long)max_kv);
  CHECK(same);
  CHECK_EQ(rlm_session_row_position(s1, 0), rlm_session_row_position(s2, 2));
  free(a);
  rlm_session_free(s1), rlm_session_free(s2);
}

TEST(session_exact_resume_every_arch) {
  for (int i = 0; i < N_ARCHS; i++) {
    rlm_model *m = load(archs[i]);
    if (!m) continue;
    check_resume(m, archs[i], 0, 0, 0);  /* plain (+ rings on sliding layers) */
    check_resume(m, archs[i], 8, 4, 0);  /* quantized, K and V bits apart */
    check_resume(m, archs[i], 4, 4, 24); /* every layer a quantized ring */
    check_resume(m, archs[i], 0, 0, 24); /* every layer a dense ring */
    rlm_model_free(m);
  }
}

TEST(session_exact_resume_embedded_model) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/models/brown-15m-4bit", g_src);
  rlm_model *m = load_dir(dir);
  if (!m) return;
  check_resume(m, "brown-15m-4bit", 0, 0, 0);
  check_resume(m, "brown-15m-4bit", 4, 4, 0);
  rlm_model_free(m);
}

/* ---- compact past the window -------------------------------------------- */

TEST(compact_past_the_window) {
  rlm_model *m = load("gemma3_text"); /* sliding window 16, layer 2 global */
  if (!m) return;
  rlm_session *s = session(m, 0, 0, 0, 1);
  const int N = 190; /* about twelve windows */
  for (int i = 0; i < N; i += 19) feed(s, 0, g_ids + i % 100, 19, NULL);
  void *img = NULL;
  size_t len = 0;
  rlm_error err;
  CHECK_EQ(rlm_session_row_save(s, 0, NULL, 0, &img, &len, &err), RLM_OK);
  rlm_snapshot *sn = NULL;
  CHECK_EQ(rlm_snapshot_open_memory(&sn, img, len, &err), RLM_OK);
  if (!sn) return;
  uint64_t hdr;
  memcpy(&hdr, img, 8);
  size_t data = 0, naive = 0;
  for (int i = 0; i < rlm_snapshot_layers(sn); i++) {
    rlm_snapshot_layer_info li;
    rlm_layer_info ml;
    CHECK_EQ(rlm_snapshot_layer(sn, i, &li, &err), RLM_OK);
    rlm_model_layer_info(m, i, &ml);
    const int64_t want = ml.sliding ? RLM_MIN(N, ml.window + 8 - 1) : N; /* + chunk - 1 */
    CHECK_EQ(li.stored, want);
    const size_t per = (size_t)ml.n_kv_heads * (size_t)ml.head_dim * 2 * rlm_dtype_size(li.dtype);
    CHECK_EQ(li.bytes, per * (size_t)want);
    data += per * (size_t)want, naive += per * N;
  }
  CHECK_EQ(len, 8 + hdr + data);
  CHECK(data * 2 < naive);
  test_note("%d tokens: %zu bytes of KV, %zu naive", N, data, naive);
  rlm_snapshot_free(sn);
  rlm_free(img);
  rlm_session_free(s);
  rlm_model_free(m);
}

/* ---- bad files ---------------------------------------------------------- */

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(p, 1, n, f) == n);
  if (f) fclose(f);
}

static bool one_line(const rlm_error *e) { return e->msg[0] && !strchr(e->msg, '\n'); }

/* The checksum of an image recomputed after an edit (as a writer would). */
static void fix_crc(uint8_t *img, size_t len) {
  const char *key = "\"1.ringlm_crc32c\":\"";
  uint8_t *at = memmem(img, len, key, strlen(key));
  CHECK(at != NULL);
  if (!at) return;
  at += strlen(key);
  memcpy(at, "00000000", 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", rlm__crc32c(0, img, len));
  memcpy(at, hex, 8);
}

/* Opening and loading must fail with a one-line FORMAT error. */
static bool refused(rlm_session *s, const void *img, size_t len) {
  rlm_snapshot *sn = NULL;
  rlm_error err = {0};
  rlm_status rc = rlm_snapshot_open_memory(&sn, img, len, &err);
  if (!rc) rc = rlm_session_row_load(s, 0, sn, &err);
  rlm_snapshot_free(sn);
  return rc == RLM_ERR_FORMAT && one_line(&err);
}

TEST(bad_files_truncated_and_flipped) {
  rlm_model *m = load("llama");
  if (!m) return;
  const int V = rlm_model_vocab_size(m);
  rlm_session *s = session(m, 0, 0, 0, 1), *ref = session(m, 0, 0, 0, 1);
  feed(s, 0, g_ids, 2, NULL);
  void *img = NULL;
  size_t len = 0;
  rlm_error err;
  CHECK_EQ(rlm_session_row_save(s, 0, g_ids, 2, &img, &len, &err), RLM_OK);
  feed(s, 0, g_ids + 2, 3, NULL); /* the row now differs from the file */
  feed(ref, 0, g_ids, 5, NULL);
  uint8_t *b = malloc(len);
  int n_trunc = 0, n_flip = 0;
  for (size_t k = 0; k < len; k++) n_trunc += refused(s, img, k);
  for (size_t bit = 0; bit < len * 8; bit++) {
    memcpy(b, img, len);
    b[bit / 8] ^= (uint8_t)(1u << bit % 8);
    n_flip += refused(s, b, len);
  }
  CHECK_EQ(n_trunc, (long long)len);
  CHECK_EQ(n_flip, (long long)len * 8);
  test_note("%zu-byte file", len);
  char path[300];
  snprintf(path, sizeof path, "%s/trunc.safetensors", g_tmp);
  for (size_t k = 0; k < len; k++) { /* files too: the message names the file */
    write_file(path, img, k);
    rlm_snapshot *sn = NULL;
    CHECK(rlm_snapshot_open(&sn, path, &err) != RLM_OK);
    CHECK(strstr(err.msg, path) == err.msg && one_line(&err));
  }
  /* the row is as it was: same logits as a session that never saw a file */
  float *x = malloc(sizeof(float) * 2 * (size_t)V);
  feed(s, 0, g_ids + 5, 1, x);
  feed(ref, 0, g_ids + 5, 1, x + V);
  CHECK(!memcmp(x, x + V, sizeof(float) * (size_t)V));
  free(x), free(b);
  rlm_free(img);
  rlm_session_free(s), rlm_session_free(ref);
  rlm_model_free(m);
}

/* A copy of fixture `arch` in g_tmp/name, config.json or the weights
 * edited by `edit` (0: config gains a space, 1: a weight byte changes). */
static rlm_model *edited_copy(const char *arch, const char *name, int edit) {
  char src[512], dst[512], cmd[1600];
  snprintf(src, sizeof src, "%s/tests/fixtures/models/%s", g_src, arch);
  snprintf(dst, sizeof dst, "%s/%s", g_tmp, name);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
  CHECK_EQ(system(cmd), 0);
  char f[600];
  snprintf(f, sizeof f, "%s/%s", dst, edit ? "model.safetensors" : "config.json");
  FILE *fp = fopen(f, "r+b");
  CHECK(fp != NULL);
  if (!fp) return NULL;
  if (edit) { /* the last byte: inside the last tensor's data */
    fseek(fp, -1, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_END);
    fputc(c ^ 0x40, fp);
  } else {
    fseek(fp, 0, SEEK_END);
    fputc(' ', fp);
  }
  fclose(fp);
  return load_dir(dst);
}

/* img (from the llama fixture, plain KV) must be refused by session s
 * with a message containing `want`. */
static void check_foreign(rlm_session *s, const void *img, size_t len, const char *want) {
  rlm_error err = {0};
  CHECK_EQ(rlm_session_row_restore(s, 0, img, len, &err), RLM_ERR_FORMAT);
  test_note("expected '%s' in: %s", want, err.msg);
  CHECK(strstr(err.msg, want) != NULL && one_line(&err));
  CHECK_EQ(rlm_session_row_position(s, 0), 3);
}

TEST(bad_files_foreign) {
  rlm_model *m = load("llama"), *q = load("qwen3");
  rlm_model *mc = edited_copy("llama", "llama_cfg", 0), *mw = edited_copy("llama", "llama_w", 1);
  if (!m || !q || !mc || !mw) return;
  rlm_session *s = session(m, 0, 0, 0, 1);
  feed(s, 0, g_ids, 4, NULL);
  void *img = NULL;
  size_t len = 0;
  rlm_error err;
  CHECK_EQ(rlm_session_row_save(s, 0, g_ids, 4, &img, &len, &err), RLM_OK);
  rlm_session *other[] = {session(q, 0, 0, 0, 1), session(mc, 0, 0, 0, 1), session(mw, 0, 0, 0, 1),
                          session(m, 4, 4, 0, 1), session(m, 8, 4, 0, 1), session(m, 0, 0, 24, 1)};
  const char *want[] = {"another model", "another model", "another model", "was saved as kv:plain",
                        "was saved as kv:plain", "was saved as kv:plain"};
  for (int i = 0; i < 6; i++) {
    feed(other[i], 0, g_ids + 50, 3, NULL);
    check_foreign(other[i], img, len, want[i]);
  }
  /* a future version, checksum and all */
  uint8_t *b = malloc(len);
  memcpy(b, img, len);
  uint8_t *v = memmem(b, len, "\"1.ringlm_version\":\"1\"", 22);
  CHECK(v != NULL);
  if (v) v[20] = '2', fix_crc(b, len);
  check_foreign(other[4], b, len, "format version 2 is newer");
  /* not snapshots: a model's weights, JSON, random bytes, nothing */
  char wpath[600];
  snprintf(wpath, sizeof wpath, "%s/tests/fixtures/models/llama/model.safetensors", g_src);
  rlm_snapshot *sn = NULL;
  CHECK_EQ(rlm_snapshot_open(&sn, wpath, &err), RLM_ERR_FORMAT);
  CHECK(strstr(err.msg, "not a ringlm KV snapshot") && strstr(err.msg, wpath));
  check_foreign(other[4], "{\"a\": 1}", 8, "snapshot:");
  memset(b, 0x5a, len);
  check_foreign(other[4], b, len, "snapshot:");
  check_foreign(other[4], b, 0, "snapshot:");
  free(b);
  rlm_free(img);
  for (int i = 0; i < 6; i++) rlm_session_free(other[i]);
  rlm_session_free(s);
  rlm_model_free(m), rlm_model_free(q), rlm_model_free(mc), rlm_model_free(mw);
}

/* ---- crash safety ------------------------------------------------------- */

/* Only `keep` is left in g_tmp/dir (no temporary file). */
static int files_in(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
  return system(cmd) == 0;
}

TEST(crash_safe_writes) {
  rlm_model *m = load("gemma3_text");
  if (!m) return;
  rlm_session *s = session(m, 0, 0, 0, 2);
  feed(s, 0, g_ids, 60, NULL);
  for (int i = 0; i < 6; i++) feed(s, 1, g_ids + 20 * i, 20, NULL); /* a bigger one */
  void *ia, *ib;
  size_t la, lb;
  rlm_error err;
  CHECK_EQ(rlm_session_row_save(s, 0, NULL, 0, &ia, &la, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_save(s, 1, NULL, 0, &ib, &lb, &err), RLM_OK);
  char dir[300], path[400];
  snprintf(dir, sizeof dir, "%s/crash", g_tmp);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/cache.safetensors", dir);
  CHECK_EQ(rlm_session_row_save_file(s, 0, NULL, 0, path, &err), RLM_OK);
  uint64_t r = 99;
  int whole = 0, kills = 40;
  for (int k = 0; k < kills; k++) {
    pid_t pid = fork();
    if (pid == 0) {
      for (;;) {
        rlm_session_row_save_file(s, 1, NULL, 0, path, NULL);
        rlm_session_row_save_file(s, 0, NULL, 0, path, NULL);
      }
    }
    struct timespec ts = {0, (long)(t_rng_next(&r) % 20000000)}; /* 0-20 ms */
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    whole += t_same_file(path, ia, la) || t_same_file(path, ib, lb);
    rlm_snapshot *sn = NULL;
    CHECK_EQ(rlm_snapshot_open(&sn, path, &err), RLM_OK);
    rlm_snapshot_free(sn);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*.tmp.*", dir); /* a killed writer's leftovers */
    CHECK_EQ(system(cmd), 0);
  }
  CHECK_EQ(whole, kills);
  /* failing writes and fsyncs: the old file stays, byte for byte */
  CHECK_EQ(rlm_session_row_save_file(s, 0, NULL, 0, path, &err), RLM_OK);
  const int errs[2] = {ENOSPC, EIO};
  int failed = 0, tries = 0;
  for (int e = 0; e < 2; e++)
    for (int nth = 0; nth < 4; nth++, tries++) { /* write, fsync of the file, of the folder */
      rlm__io_fail_at(nth, errs[e]);
      rlm_status rc = rlm_session_row_save_file(s, 1, NULL, 0, path, &err);
      rlm__io_fail_at(-1, 0);
      if (rc == RLM_OK) { /* past the last write: the new file is whole; put the old back */
        CHECK(t_same_file(path, ib, lb));
        CHECK_EQ(rlm_session_row_save_file(s, 0, NULL, 0, path, &err), RLM_OK);
        continue;
      }
      failed++;
      CHECK(strstr(err.msg, strerror(errs[e])) != NULL);
      CHECK(t_same_file(path, ia, la) || (nth >= 2 && t_same_file(path, ib, lb))); /* folder fsync */
      if (!t_same_file(path, ia, la)) CHECK_EQ(rlm_session_row_save_file(s, 0, NULL, 0, path, &err), RLM_OK);
      CHECK(files_in(dir));
    }
  CHECK(failed >= 4);
  /* a real failure: the file size limit (EFBIG) in a child */
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {(rlim_t)lb / 2, (rlim_t)lb / 2};
    setrlimit(RLIMIT_FSIZE, &rl);
    rlm_error e2;
    rlm_status rc = rlm_session_row_save_file(s, 1, NULL, 0, path, &e2);
    _exit(rc == RLM_ERR_IO && strstr(e2.msg, "File too large") ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(t_same_file(path, ia, la));
  CHECK(files_in(dir));
  rlm_free(ia), rlm_free(ib);
  rlm_session_free(s);
  rlm_model_free(m);
}

int main(void) {
  g_src = getenv("RINGLM_SOURCE_DIR");
  if (!g_src) g_src = ".";
  snprintf(g_tmp, sizeof g_tmp, "/tmp/rlm_snapshot_%d", (int)getpid());
  mkdir(g_tmp, 0755);
  uint64_t r = 5;
  for (size_t i = 0; i < sizeof g_ids / sizeof *g_ids; i++) g_ids[i] = (int32_t)(t_rng_next(&r) % 250);
  RUN(crc32c_check_value_and_reference);
  RUN(kv_exact_resume_every_kind);
  RUN(session_exact_resume_every_arch);
  RUN(session_exact_resume_embedded_model);
  RUN(compact_past_the_window);
  RUN(bad_files_truncated_and_flipped);
  RUN(bad_files_foreign);
  RUN(crash_safe_writes);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_tmp);
  return test_summary();
}
