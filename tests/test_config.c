/* test_config.c -- what a bad model folder or bad session params are told.
 *
 * Each case copies a fixture folder of tests/fixtures/models/ into a temp
 * dir, edits one or two values of its config.json with jansson (dotted
 * keys reach nested objects: "rope_parameters.factor"), and checks that
 * rlm_model_load refuses it with the right status and a one-line message
 * naming the config.json path and the field. The NaN cases (rms_norm_eps
 * -1, rope_theta 0, ...) used to load and run to NaN logits; here they
 * must not load. Also: session params (act_bits, the KV group size
 * against head_dim), safetensors offsets beyond 2^63, max_positions from
 * max_position_embeddings, and the byte offset of invalid UTF-8 in
 * rlm_tokenize's message.
 */
#include "model/model.h"
#include "test.h"

#include <jansson.h>

static const char *g_src;
static char g_tmp[256];
static int g_case; /* numbers the case folders */

/* ---- helpers -------------------------------------------------------------- */

/* A fresh copy of fixture `arch` under g_tmp; its path into dir. */
static void copy_fixture(const char *arch, char *dir, size_t n) {
  snprintf(dir, n, "%s/case%d-%s", g_tmp, g_case++, arch);
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/tests/fixtures/models/%s' '%s'", dir, g_src,
           arch, dir);
  CHECK(system(cmd) == 0);
}

/* Sets config.json's dotted `key` to the JSON text `value` (NULL deletes
 * the key). */
static void set_config(const char *dir, const char *key, const char *value) {
  char path[600], k[256];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je), *o = root;
  CHECK(root != NULL);
  snprintf(k, sizeof k, "%s", key);
  char *part = k, *dot;
  while (o && (dot = strchr(part, '.'))) {
    *dot = 0;
    o = json_object_get(o, part);
    part = dot + 1;
  }
  CHECK(json_is_object(o));
  if (!value) {
    json_object_del(o, part);
  } else {
    json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
    CHECK(v != NULL);
    json_object_set_new(o, part, v);
  }
  CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
  json_decref(root);
}

/* One broken config: up to two edits, then the status and the substrings
 * the message must hold (besides the config.json path). */
typedef struct cfg_case {
  const char *arch;
  const char *key, *value;   /* value NULL: delete the key */
  const char *key2, *value2; /* a second edit, or NULL     */
  rlm_status want;
  const char *needle, *needle2; /* needle2 may be NULL      */
} cfg_case;

static void check_case(const cfg_case *c) {
  char dir[400], want_path[500];
  copy_fixture(c->arch, dir, sizeof dir);
  set_config(dir, c->key, c->value);
  if (c->key2) set_config(dir, c->key2, c->value2);
  snprintf(want_path, sizeof want_path, "%s/config.json", dir);
  rlm_model *m = (rlm_model *)&g_case; /* must come back NULL */
  rlm_error err = {0};
  rlm_status rc = rlm_model_load(&m, dir, &err);
  test_note("%s: %s = %s: \"%s\"", c->arch, c->key, c->value ? c->value : "(deleted)", err.msg);
  CHECK_EQ(rc, c->want);
  CHECK(m == NULL);
  CHECK_STR_CONTAINS(err.msg, want_path);
  CHECK_STR_CONTAINS(err.msg, c->needle);
  if (c->needle2) CHECK_STR_CONTAINS(err.msg, c->needle2);
  CHECK(!strchr(err.msg, '\n'));
  if (!rc) rlm_model_free(m);
}

static void check_cases(const cfg_case *cases, int n) {
  for (int i = 0; i < n; i++) check_case(&cases[i]);
}

static rlm_model *load_fixture(const char *arch) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  rlm_model *m = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  return m;
}

/* ---- defect 1: session params --------------------------------------------- */

static void check_session(rlm_model *m, const rlm_session_params *p, const char *needle,
                          const char *needle2) {
  rlm_session *s = (rlm_session *)&g_case;
  rlm_error err = {0};
  CHECK_EQ(rlm_session_create(&s, m, p, &err), RLM_ERR_INVALID);
  test_note("\"%s\"", err.msg);
  CHECK(s == NULL);
  CHECK_STR_CONTAINS(err.msg, needle);
  if (needle2) CHECK_STR_CONTAINS(err.msg, needle2);
}

/* act_bits 4 used to free the session, then print its fields ("prefill
 * chunk -246482054"); 4-bit KV with group 64 over head_dim 32 named
 * neither the group size nor a file. */
TEST(session_params_errors) {
  rlm_model *m = load_fixture("llama");
  if (!m) return;
  rlm_session_params p = rlm_session_params_default();
  p.act_bits = 4;
  check_session(m, &p, "act_bits 4", "only 0 or 8");
  p = rlm_session_params_default();
  p.prefill_chunk = 0;
  check_session(m, &p, "prefill_chunk 0", "[1, 65536]");
  p = rlm_session_params_default();
  p.k_bits = p.v_bits = 4;
  char want[600];
  snprintf(want, sizeof want, "%s/tests/fixtures/models/llama/config.json: head_dim 32 is not a "
           "multiple of kv_group_size 64 (use kv_group_size 32)", g_src);
  check_session(m, &p, want, NULL);
  p.k_bits = 7;
  check_session(m, &p, "k_bits 7", "accepted");
  p.k_bits = 4, p.kv_group_size = 48;
  check_session(m, &p, "kv_group_size 48", "accepted");
  /* and the group size it suggests does work */
  p.kv_group_size = 32, p.n_threads = 1;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  rlm_session_free(s);
  rlm_model_free(m);
}

/* ---- defect 2: messages that name the field ------------------------------- */

/* Zero dimensions used to say "inconsistent dimensions (heads ...)", a
 * huge one "not a valid integer", a bad layer type or a zero window a
 * head-dim clash, each naming no field. */
TEST(config_errors_name_the_field) {
  static const cfg_case cases[] = {
      {"llama", "hidden_size", "0", NULL, NULL, RLM_ERR_FORMAT, "hidden_size", "must be positive"},
      {"llama", "num_hidden_layers", "0", NULL, NULL, RLM_ERR_FORMAT, "num_hidden_layers",
       "must be positive"},
      {"llama", "vocab_size", "0", NULL, NULL, RLM_ERR_FORMAT, "vocab_size", "must be positive"},
      {"llama", "intermediate_size", "0", NULL, NULL, RLM_ERR_FORMAT, "intermediate_size",
       "must be positive"},
      {"llama", "num_attention_heads", "0", NULL, NULL, RLM_ERR_FORMAT, "num_attention_heads",
       "must be positive"},
      {"llama", "hidden_size", "2000000000", NULL, NULL, RLM_ERR_FORMAT,
       "hidden_size 2000000000 is out of range", "1073741824"},
      {"llama", "hidden_size", "2e9", NULL, NULL, RLM_ERR_FORMAT,
       "hidden_size 2000000000 is out of range", NULL},
      {"llama", "hidden_size", "\"64\"", NULL, NULL, RLM_ERR_FORMAT,
       "hidden_size is not an integer", NULL},
      {"llama", "num_key_value_heads", "3", NULL, NULL, RLM_ERR_FORMAT, "num_key_value_heads 3",
       "num_attention_heads 4"},
      {"llama", "head_dim", "33", NULL, NULL, RLM_ERR_FORMAT, "head_dim 33", "even"},
      {"llama", "head_dim", "0", NULL, NULL, RLM_ERR_FORMAT, "head_dim is 0", "positive"},
      {"llama", "num_hidden_layers", "600", NULL, NULL, RLM_ERR_UNSUPPORTED,
       "num_hidden_layers 600", "512"},
      {"gemma3_text", "layer_types", "[\"sliding_attention\", \"chunked_attention\", "
       "\"full_attention\", \"sliding_attention\"]", NULL, NULL, RLM_ERR_UNSUPPORTED,
       "layer_types[1] is \"chunked_attention\"", "\"full_attention\", \"sliding_attention\""},
      {"gemma3_text", "layer_types", "[\"sliding_attention\", \"sliding_attention\", 5, "
       "\"sliding_attention\"]", NULL, NULL, RLM_ERR_FORMAT, "layer_types[2] is not a string",
       NULL},
      {"gemma4_text", "sliding_window", "0", NULL, NULL, RLM_ERR_FORMAT, "sliding_window is 0",
       "must be positive"},
      {"gemma4_text", "sliding_window", "null", NULL, NULL, RLM_ERR_FORMAT, "sliding_window is not "
       "given", "layer_types"},
      {"llama", "rope_parameters.rope_type", "\"yarn\"", NULL, NULL, RLM_ERR_UNSUPPORTED,
       "rope_parameters.rope_type \"yarn\"", NULL},
      {"gemma4_text", "per_layer_config.2.head_dim", "33", NULL, NULL, RLM_ERR_FORMAT,
       "per_layer_config.2.head_dim 33", "even"},
      {"gemma4_text", "num_kv_shared_layers", "9", NULL, NULL, RLM_ERR_FORMAT,
       "num_kv_shared_layers 9 is out of range", "[0, 6]"},
      {"gemma4_moe", "top_k_experts", "5", NULL, NULL, RLM_ERR_FORMAT, "top_k_experts 5", "[1, 4]"},
      {"gemma4_moe", "num_experts", "0", NULL, NULL, RLM_ERR_FORMAT, "num_experts is 0", NULL},
  };
  check_cases(cases, N_OF(cases));
}

/* JSON nested past the parser's depth limit (jansson's 2048) in any of the
 * JSON files a model folder brings: one line naming the file, no crash
 * (a recursive parser without a limit would overflow the stack). */
TEST(json_nesting_depth_is_limited) {
  static const char *files[] = {"config.json", "generation_config.json"};
  for (int f = 0; f < 2; f++) {
    char dir[400], path[600];
    copy_fixture("llama", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, files[f]);
    FILE *fp = fopen(path, "w");
    CHECK(fp != NULL);
    if (!fp) return;
    fputs("{\"deep\": ", fp);
    for (int i = 0; i < 100000; i++) fputc('[', fp);
    for (int i = 0; i < 100000; i++) fputc(']', fp);
    fputs("}", fp);
    fclose(fp);
    rlm_model *m = NULL;
    rlm_error err = {0};
    CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_FORMAT);
    test_note("%s: %s", files[f], err.msg);
    CHECK(strstr(err.msg, path) != NULL && !strchr(err.msg, '\n'));
    CHECK(strstr(err.msg, "depth") != NULL);
    rlm_model_free(m);
  }
}

/* A data_offsets value of 2^63 or more makes jansson read the whole
 * header with integers as reals; that used to be reported as a bad shape
 * of whichever tensor came first. */
TEST(safetensors_offsets_beyond_int64) {
  static const char *hdrs[] = {
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
      "\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 9223372036854775816]}}",
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
      "\"w\": {\"dtype\": \"U8\", \"shape\": [1], "
      "\"data_offsets\": [18446744073709551620, 18446744073709551621]}}",
  };
  for (int i = 0; i < N_OF(hdrs); i++) {
    char path[400];
    snprintf(path, sizeof path, "%s/big%d.safetensors", g_tmp, i);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    uint64_t n = strlen(hdrs[i]);
    uint8_t len[8];
    for (int b = 0; b < 8; b++) len[b] = (uint8_t)(n >> (8 * b));
    const uint8_t data[8] = {0};
    CHECK(fwrite(len, 1, 8, f) == 8 && fwrite(hdrs[i], 1, n, f) == n && fwrite(data, 1, 8, f) == 8);
    fclose(f);
    rlm_safetensors *st = NULL;
    rlm_error err = {0};
    CHECK_EQ(rlm__st_open(&st, path, &err), RLM_ERR_FORMAT);
    test_note("\"%s\"", err.msg);
    CHECK_STR_CONTAINS(err.msg, path);
    CHECK_STR_CONTAINS(err.msg, "tensor 'w'");
    CHECK_STR_CONTAINS(err.msg, "data_offsets");
    CHECK_STR_CONTAINS(err.msg, "out of range");
    rlm__st_free(st);
  }
}

/* ---- defect 3: values that produce NaN ------------------------------------ */

/* The untouched fixture loads and its logits are all finite. */
static void check_finite_logits(const char *arch) {
  rlm_model *m = load_fixture(arch);
  if (!m) return;
  rlm_session_params p = rlm_session_params_default();
  p.n_threads = 1;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  const int32_t ids[4] = {1, 17, 42, 99};
  float lg[256];
  CHECK_EQ(rlm_session_eval(s, ids, 4, lg, false, &err), RLM_OK);
  int finite = 0;
  for (int i = 0; i < 256; i++) finite += isfinite(lg[i]) != 0;
  CHECK_EQ(finite, 256);
  rlm_session_free(s);
  rlm_model_free(m);
}

/* Every float of config.json: these used to load and run with NaN logits
 * (greedy ids "0 0"). A good fixture still gives finite logits. */
TEST(nan_values_are_refused) {
  static const cfg_case cases[] = {
      {"llama", "rms_norm_eps", "-1", NULL, NULL, RLM_ERR_FORMAT, "rms_norm_eps is -1", "positive"},
      {"llama", "rms_norm_eps", "0", NULL, NULL, RLM_ERR_FORMAT, "rms_norm_eps is 0", NULL},
      {"llama", "rms_norm_eps", "\"1e-5\"", NULL, NULL, RLM_ERR_FORMAT,
       "rms_norm_eps is not a number", NULL},
      {"llama", "rope_parameters.rope_theta", "0", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.rope_theta is 0", NULL},
      {"llama", "rope_parameters.rope_theta", "-5", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.rope_theta is -5", NULL},
      {"mistral", "rope_parameters", NULL, "rope_theta", "0", RLM_ERR_FORMAT, "rope_theta is 0",
       NULL},
      {"llama", "rope_parameters.factor", "0", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.factor is 0", NULL},
      {"llama", "rope_parameters.low_freq_factor", "4", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.high_freq_factor 4", "low_freq_factor 4"},
      {"llama", "rope_parameters.original_max_position_embeddings", "0", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.original_max_position_embeddings is 0", NULL},
      {"gemma3_text", "rope_parameters.full_attention.factor", "-2", NULL, NULL, RLM_ERR_FORMAT,
       "rope_parameters.full_attention.factor is -2", NULL},
      {"gemma3_text", "rope_parameters.sliding_attention.rope_theta", "0", NULL, NULL,
       RLM_ERR_FORMAT, "rope_parameters.sliding_attention.rope_theta is 0", NULL},
      {"gemma3_text", "rope_parameters", NULL, "rope_local_base_freq", "0", RLM_ERR_FORMAT,
       "rope_local_base_freq is 0", NULL},
      {"gemma3_text", "query_pre_attn_scalar", "0", NULL, NULL, RLM_ERR_FORMAT,
       "query_pre_attn_scalar is 0", NULL},
      {"gemma3_text", "attn_logit_softcapping", "50.0", NULL, NULL, RLM_ERR_UNSUPPORTED,
       "attn_logit_softcapping 50", NULL},
      {"gemma4_text", "rope_parameters.full_attention.partial_rotary_factor", "1.5", NULL, NULL,
       RLM_ERR_FORMAT, "rope_parameters.full_attention.partial_rotary_factor 1.5", "(0, 1]"},
      {"gemma4_text", "rope_parameters.full_attention.partial_rotary_factor", "0", NULL, NULL,
       RLM_ERR_FORMAT, "partial_rotary_factor is 0", NULL},
      {"gemma4_text", "final_logit_softcapping", "0", NULL, NULL, RLM_ERR_FORMAT,
       "final_logit_softcapping is 0", "null"},
      {"gemma4_text", "final_logit_softcapping", "-30.0", NULL, NULL, RLM_ERR_FORMAT,
       "final_logit_softcapping is -30", NULL},
  };
  check_cases(cases, N_OF(cases));
  check_finite_logits("llama");
}

/* ---- defect 4: max_position_embeddings ------------------------------------ */

TEST(max_positions_from_config) {
  rlm_model *m = load_fixture("llama");
  if (!m) return;
  rlm_model_info info;
  rlm_model_get_info(m, &info);
  CHECK_EQ(info.max_positions, 512);
  rlm_model_free(m);
  char dir[400];
  copy_fixture("llama", dir, sizeof dir);
  set_config(dir, "max_position_embeddings", NULL);
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (m) {
    rlm_model_get_info(m, &info);
    CHECK_EQ(info.max_positions, 0);
    rlm_model_free(m);
  }
  /* "no limit" written as an integer beyond 64 bits: every integer of
   * the file is then read as a real, and the model still loads */
  copy_fixture("llama", dir, sizeof dir);
  set_config(dir, "max_position_embeddings", "12345678987654321");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "sed -i 's/12345678987654321/1%s/' '%s/config.json'",
           "000000000000000000000000000000", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (m) {
    rlm_model_get_info(m, &info);
    CHECK_EQ(info.max_positions, 0);
    CHECK_EQ(info.hidden, 64);
    rlm_model_free(m);
  }
  static const cfg_case bad[] = {
      {"llama", "max_position_embeddings", "-1", NULL, NULL, RLM_ERR_FORMAT,
       "max_position_embeddings -1 is out of range", NULL},
      {"llama", "max_position_embeddings", "\"512\"", NULL, NULL, RLM_ERR_FORMAT,
       "max_position_embeddings is not an integer", NULL},
  };
  check_cases(bad, N_OF(bad));
}

/* ---- defect 5: where the text stops being UTF-8 --------------------------- */

/* The smallest BPE tokenizer.json: a few one-character tokens. */
static rlm_tokenizer *tiny_tokenizer(void) {
  char path[400];
  snprintf(path, sizeof path, "%s/tokenizer.json", g_tmp);
  json_t *j = json_pack("{s:{s:s, s:{s:i, s:i, s:i}, s:[]}}", "model", "type", "BPE", "vocab", "a",
                        0, "b", 1, "\xC3\xA9", 2, "merges");
  CHECK(j && json_dump_file(j, path, 0) == 0);
  json_decref(j);
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_tokenizer_load(&t, path, &err), RLM_OK);
  test_note("%s", err.msg);
  return t;
}

TEST(tokenize_reports_the_bad_byte) {
  rlm_tokenizer *t = tiny_tokenizer();
  if (!t) return;
  static const struct {
    const char *text;
    size_t len;
    const char *needle;
  } cases[] = {
      {"ab\xFF" "ab", 5, "not valid UTF-8 at byte 2"},
      {"\xC3", 1, "not valid UTF-8 at byte 0"},
      {"a\xC3\xA9\xC3\xA9" "b\xED\xA0\x80", 9, "not valid UTF-8 at byte 6"}, /* a surrogate */
      {"aaaaaaaaaaaaaaaaa\xC3(", 19, "not valid UTF-8 at byte 17"},
  };
  int32_t ids[32];
  for (int i = 0; i < N_OF(cases); i++) {
    size_t n = 0;
    rlm_error err = {0};
    CHECK_EQ(rlm_tokenize(t, cases[i].text, cases[i].len, false, ids, 32, &n, &err),
             RLM_ERR_INVALID);
    test_note("case %d: \"%s\"", i, err.msg);
    CHECK_STR_CONTAINS(err.msg, cases[i].needle);
  }
  size_t n = 0;
  rlm_error err = {0};
  CHECK_EQ(rlm_tokenize(t, "ab\xC3\xA9", 4, false, ids, 32, &n, &err), RLM_OK);
  CHECK_EQ(n, 3);
  rlm_tokenizer_free(t);
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_tmp, sizeof g_tmp, "config");
  RUN(session_params_errors);
  RUN(config_errors_name_the_field);
  RUN(json_nesting_depth_is_limited);
  RUN(safetensors_offsets_beyond_int64);
  RUN(nan_values_are_refused);
  RUN(max_positions_from_config);
  RUN(tokenize_reports_the_bad_byte);
  return t_finish(g_tmp);
}
