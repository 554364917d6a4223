/* test_cli.c -- the ringlm command line as a user meets it: exit codes
 * (0 ok, 1 failed, 2 usage), one-line errors that name the file, and a
 * quantize + inspect round trip on a generated model; run, logits and
 * perplexity on the transformers fixtures (every architecture's greedy
 * continuation) and on a fixture given a byte-level tokenizer (text
 * prompts, streaming, stop strings, EOS). */
#include "ringlm.h"
#include "test.h"

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <sys/wait.h>

static char g_dir[256];
static const char *g_bin, *g_make;

#define run t_run_cmd

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

TEST(usage_errors) {
  char out[8192];
  CHECK_EQ(run(out, sizeof out, "%s", g_bin), 2);
  CHECK_STR_CONTAINS(out, "usage: ringlm");
  CHECK_EQ(run(out, sizeof out, "%s frobnicate", g_bin), 2);
  CHECK_STR_CONTAINS(out, "unknown command 'frobnicate'");
  CHECK_EQ(run(out, sizeof out, "%s quantize onlyone", g_bin), 2);
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --bits x", g_bin), 2);
  CHECK_STR_CONTAINS(out, "--bits expects an integer");
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --wat", g_bin), 2);
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --override mlp", g_bin), 2);
  CHECK_STR_CONTAINS(out, "MATCH=BITS");
  CHECK_EQ(run(out, sizeof out, "%s quantize --help", g_bin), 0);
  CHECK_EQ(run(out, sizeof out, "%s version", g_bin), 0);
  CHECK_STR_CONTAINS(out, "ringlm 0.");
}

TEST(bad_files_one_line_errors) {
  char out[8192], path[512];
  CHECK_EQ(run(out, sizeof out, "%s inspect %s/missing.safetensors", g_bin, g_dir), 1);
  CHECK_STR_CONTAINS(out, "missing.safetensors");
  CHECK_EQ(count_lines(out), 1);
  /* Header length past the end of the file. */
  snprintf(path, sizeof path, "%s/bad.safetensors", g_dir);
  FILE *f = fopen(path, "wb");
  uint64_t n = 1000;
  fwrite(&n, 8, 1, f);
  fputs("{}", f);
  fclose(f);
  CHECK_EQ(run(out, sizeof out, "%s inspect %s", g_bin, path), 1);
  CHECK_STR_CONTAINS(out, "bad.safetensors");
  CHECK_EQ(count_lines(out), 1);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s %s/o.safetensors", g_bin, path, g_dir), 1);
  CHECK_STR_CONTAINS(out, "bad.safetensors");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s %s/o --bits 7", g_bin, path, g_dir), 2);
  CHECK_STR_CONTAINS(out, "--bits 7");
  /* A draft of another vocabulary (the fixtures have 256 ids, the embedded
   * model 8192): one line naming both sizes, before any token. */
  CHECK_EQ(run(out, sizeof out, "%s run -p hello -n 4 --draft %s/tests/fixtures/models/llama", g_bin,
               getenv("RINGLM_SOURCE_DIR")), 1);
  CHECK_STR_CONTAINS(out, "the draft model's vocabulary has 256 ids");
  CHECK_STR_CONTAINS(out, "8192");
  CHECK_EQ(count_lines(out), 1);
}

TEST(quantize_and_inspect_round_trip) {
  char out[65536];
  CHECK_EQ(
      run(out, sizeof out, "%s %s/m --dtype bf16 --layers 2 --hidden 128 --inter 256 --vocab 300",
          g_make, g_dir),
      0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/q --bits 8 --group-size 32 -t 2", g_bin, g_dir,
               g_dir), 0);
  CHECK_STR_CONTAINS(out, "quantized 15 of");
  CHECK_EQ(run(out, sizeof out, "%s inspect %s/q", g_bin, g_dir), 0);
  CHECK_STR_CONTAINS(out, "model.layers.1.mlp.down_proj.scales");
  CHECK_STR_CONTAINS(out, "U32   [128, 64]"); /* 256 inputs * 8 bits / 32 */
  CHECK_STR_CONTAINS(
      out, "model.embed_tokens.weight                                    BF16  [300, 128]");
}

/* The fixture's prompt as "a,b,c" and its greedy ids as "x y z". */
static bool fixture_ids(const char *arch, char *ids, size_t ni, char *greedy, size_t ng) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/fixtures/models/%s/fixture.json",
           getenv("RINGLM_SOURCE_DIR"), arch);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) return false;
  json_t *p = json_object_get(j, "prompt_ids"), *g = json_object_get(j, "greedy_ids");
  size_t ui = 0, ug = 0;
  for (size_t i = 0; i < json_array_size(p) && ui + 12 < ni; i++)
    ui += (size_t)snprintf(ids + ui, ni - ui, i ? ",%lld" : "%lld",
                           json_integer_value(json_array_get(p, i)));
  for (size_t i = 0; i < json_array_size(g) && ug + 12 < ng; i++)
    ug += (size_t)snprintf(greedy + ug, ng - ug, i ? " %lld" : "%lld",
                           json_integer_value(json_array_get(g, i)));
  bool ok = json_array_size(p) > 0 && json_array_size(g) > 0;
  json_decref(j);
  return ok;
}

/* The first line of s (copied). */
static void first_line(const char *s, char *out, size_t n) {
  snprintf(out, n, "%.*s", (int)strcspn(s, "\n"), s);
}

/* ringlm run prints exactly transformers' greedy continuation for every
 * fixture, with prefill chunks 1, 7 and 512 and with 8-bit KV; the stats
 * line goes to stderr. */
TEST(run_greedy_every_fixture) {
  static const char *archs[] = {"llama", "qwen3", "mistral", "gemma3_text", "gemma4_text"};
  static const char *opts[] = {"--prefill-chunk 1", "--prefill-chunk 7", "--prefill-chunk 512",
                               "--kv-bits 8 --kv-group-size 32"};
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char ids[2048], want[1024], out[8192], line[1024];
  for (int a = 0; a < 5; a++) {
    CHECK(fixture_ids(archs[a], ids, sizeof ids, want, sizeof want));
    for (int k = 0; k < 4; k++) {
      test_note("%s %s", archs[a], opts[k]);
      CHECK_EQ(run(out, sizeof out,
                   "%s run -m %s/tests/fixtures/models/%s --ids %s -n 32 --temp 0 --print-ids "
                   "--ignore-eos %s 2>/dev/null | cat",
                   g_bin, src, archs[a], ids, opts[k]),
               0);
      first_line(out, line, sizeof line);
      CHECK_STR_EQ(line, want);
    }
  }
  test_note("stats line");
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids %s -n 32 --temp 0 --print-ids "
               "--ignore-eos"
               " 2>&1 >/dev/null | cat",
               g_bin, src, ids),
           0);
  CHECK_STR_CONTAINS(out, "prompt 96 tokens, prefill ");
  CHECK_STR_CONTAINS(out, "generated 32 tokens, decode ");
  CHECK_STR_CONTAINS(out, " tok/s, KV ");
}

/* GPT-2's byte -> printable code point map, as byte-level BPE uses it. */
static int byte_char(int b) {
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    n += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
  return 256 + n;
}

/* A copy of the llama fixture with a byte-level tokenizer over its 256
 * ids (id = byte), so text prompts, streaming and stop strings can run. */
static void byte_model(char *dir, size_t n) {
  snprintf(dir, n, "%s/bytes", g_dir);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/tests/fixtures/models/llama' '%s'", dir,
           getenv("RINGLM_SOURCE_DIR"), dir);
  CHECK(system(cmd) == 0);
  json_t *vocab = json_object();
  for (int b = 0; b < 256; b++) {
    char key[8];
    int c = byte_char(b);
    if (c < 0x80) key[0] = (char)c, key[1] = 0;
    else if (c < 0x800)
      key[0] = (char)(0xC0 | c >> 6), key[1] = (char)(0x80 | (c & 63)), key[2] = 0;
    json_object_set_new(vocab, key, json_integer(b));
  }
  json_t *tok = json_pack(
      "{s:s, s:n, s:[], s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b},"
      " s:{s:s, s:o, s:[]}}",
      "version", "1.0", "truncation", "added_tokens", "normalizer", "pre_tokenizer", "type",
      "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor",
      "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
      "model", "type", "BPE", "vocab", vocab, "merges");
  char path[600];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  CHECK(tok && json_dump_file(tok, path, 0) == 0);
  json_decref(tok);
}

/* --prompt text: the streamed text is the decode of the generated ids;
 * --stop cuts it before the stop string; an EOS id ends generation. */
TEST(run_streams_text_and_stops) {
  char dir[400], out[8192], idl[4096], text[4096], cut[64];
  byte_model(dir, sizeof dir);
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s --prompt 'Once upon a time' -n 24 --print-ids --ignore-eos "
               "2>/dev/null | cat",
               g_bin, dir),
           0);
  first_line(out, idl, sizeof idl);
  for (char *c = idl; *c; c++) *c = *c == ' ' ? ',' : *c;
  CHECK_EQ(run(out, sizeof out, "%s tokenize -m %s --decode --ids %s", g_bin, dir, idl), 0);
  first_line(out, text, sizeof text);
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s --prompt 'Once upon a time' -n 24 --ignore-eos 2>/dev/null | cat",
               g_bin, dir),
           0);
  CHECK(strlen(text) > 0);
  /* the prompt echoed, then the streamed text == the decoded ids */
  CHECK(!strncmp(out, "Once upon a time", 16) && !strncmp(out + 16, text, strlen(text)));
  /* A stop string: the first character (after the first) not seen before
   * it in the text; output must end right before it. */
  size_t p = 0, clen = 0;
  for (size_t q = 1; q < strlen(text) && !clen; q++) {
    if (((unsigned char)text[q] & 0xC0) == 0x80) continue; /* not a character start */
    size_t l = 1;
    while (((unsigned char)text[q + l] & 0xC0) == 0x80) l++;
    snprintf(cut, sizeof cut, "%.*s", (int)l, text + q);
    char *seen = strstr(text, cut);
    if (seen == text + q && !strpbrk(cut, "'\\\n%")) p = q, clen = l;
  }
  CHECK(clen > 0);
  test_note("stop '%s' in '%s'", cut, text);
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s --prompt 'Once upon a time' -n 24 --ignore-eos --stop '%s' "
               "2>/dev/null | cat",
               g_bin, dir, cut),
           0);
  CHECK(!strncmp(out + 16, text, p) && (out[16 + p] == '\n' || out[16 + p] == 0));
  /* EOS: make the 5th generated id an end-of-sequence id. */
  int ids[64], n = 0;
  for (char *c = idl; *c && n < 64; c++) ids[n++] = (int)strtol(c, &c, 10);
  CHECK(n > 4);
  int first = 0; /* generation ends at the first occurrence of that id */
  while (ids[first] != ids[4]) first++;
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "printf '{\"eos_token_id\": [%d]}' > '%s/generation_config.json'",
           ids[4], dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s --prompt 'Once upon a time' -n 24 --print-ids", g_bin,
               dir),
           0);
  char wantstats[64];
  snprintf(wantstats, sizeof wantstats, "generated %d token%s,", first, first == 1 ? "" : "s");
  CHECK_STR_CONTAINS(out, wantstats);
  /* -n -1: until the end of sequence. */
  CHECK_EQ(run(out, sizeof out, "%s run -m %s --prompt 'Once upon a time' -n -1 --print-ids", g_bin,
               dir),
           0);
  CHECK_STR_CONTAINS(out, wantstats);
}

/* chat: each line joins the conversation; the template renders it all,
 * the previous reply included; end of input ends the chat. */
TEST(chat_renders_the_conversation) {
  char dir[400], out[16384], path[600];
  byte_model(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("{\"chat_template\": \"{% for m in messages %}[{{ m.role }}] {{ m.content }}\\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}\"}", f);
  fclose(f);
  CHECK_EQ(run(out, sizeof out,
               "(printf 'Hi\\nAgain\\n' | %s chat -m %s --system Be -n 8 --verbose-prompt 2>&1 "
               ">/dev/null)",
               g_bin, dir),
           0);
  CHECK_STR_CONTAINS(out, "[system] Be\n[user] Hi\n[assistant] ");
  const char *second = strstr(out, "\n[user] Again\n[assistant] ");
  CHECK(second != NULL);
  /* The second rendering repeats the first turn and holds the reply. */
  const char *first = strstr(out, "[system] Be\n[user] Hi\n[assistant] ");
  CHECK(first && second && strstr(first + 1, "[system] Be\n[user] Hi\n[assistant] ") < second);
  CHECK_EQ(run(out, sizeof out, "%s chat -m %s --ids 1 </dev/null", g_bin, dir),
           0); /* not chat's */
  CHECK_STR_CONTAINS(
      out, "ringlm chat: warning: --ids applies to run, logits, tokenize and cache-prompt only; ignored");
  CHECK(remove(path) == 0);
  CHECK_EQ(run(out, sizeof out, "%s chat -m %s </dev/null", g_bin, dir), 1);
  CHECK_STR_CONTAINS(out, "no chat_template");
}

/* bench: one result per test and depth, speeds > 0, KV bytes growing
 * with the depth; a bad depth list is a usage error. */
TEST(bench_reports_each_depth) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "%s bench -m %s/tests/fixtures/models/llama -p 8 -n 4 -d 0,300 -t 1 --json "
               "2>/dev/null | cat",
               g_bin, src),
           0);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je), *r = json_object_get(j, "results");
  CHECK_EQ(json_array_size(r), 4);
  static const char *tests[] = {"pp8", "tg4", "pp8", "tg4"};
  for (size_t i = 0; i < json_array_size(r) && i < 4; i++) {
    json_t *e = json_array_get(r, i);
    CHECK_STR_EQ(json_string_value(json_object_get(e, "test")), tests[i]);
    CHECK_EQ(json_integer_value(json_object_get(e, "depth")), i < 2 ? 0 : 300);
    CHECK(json_number_value(json_object_get(e, "tokens_per_s")) > 0);
  }
  CHECK(json_integer_value(json_object_get(json_array_get(r, 3), "kv_bytes")) >
        json_integer_value(json_object_get(json_array_get(r, 1), "kv_bytes")));
  CHECK(json_integer_value(json_object_get(j, "peak_rss_bytes")) > 0);
  json_decref(j);
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s/tests/fixtures/models/llama -d 1,x", g_bin, src),
           2);
}

/* logits writes [n, vocab] float32; bad ids, values and folders fail with
 * one line naming the problem. */
TEST(logits_and_bad_runs) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192], path[512];
  CHECK_EQ(
      run(out, sizeof out, "%s logits -m %s/tests/fixtures/models/llama --ids 1,2,3 -o %s/l.npy",
          g_bin, src, g_dir),
      0);
  snprintf(path, sizeof path, "%s/l.npy", g_dir);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  if (f) {
    fseek(f, 0, SEEK_END);
    CHECK_EQ(ftell(f), 128 + 3 * 256 * 4); /* 128-byte header, [3, 256] f32 */
    fclose(f);
  }
  /* Sampling: a seed reproduces the run. */
  char again[8192];
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids 5,6,7 -n 16 --temp 1 --top-p 0.9 "
               "--seed 9 --print-ids --ignore-eos 2>/dev/null | cat",
               g_bin, src),
           0);
  CHECK_EQ(run(again, sizeof again,
               "%s run -m %s/tests/fixtures/models/llama --ids 5,6,7 -n 16 --temp 1 --top-p 0.9 "
               "--seed 9 --print-ids --ignore-eos 2>/dev/null | cat",
               g_bin, src),
           0);
  CHECK(strlen(out) > 16);
  CHECK_STR_EQ(out, again);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1 --temp -1", g_bin,
               src),
           2);
  CHECK_STR_CONTAINS(out, "--temp");
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1,999", g_bin, src),
           1);
  CHECK_STR_CONTAINS(out, "999");
  CHECK_EQ(count_lines(out), 1);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --prompt hi", g_bin, src),
           1);
  CHECK_STR_CONTAINS(out, "no tokenizer.json");
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/nowhere --ids 1", g_bin, g_dir), 1);
  CHECK_STR_CONTAINS(out, "nowhere");
  CHECK_EQ(run(out, sizeof out, "%s run -m x --ids 1,a", g_bin), 2);
  CHECK_EQ(run(out, sizeof out, "%s run -m x --ids 1 --prompt hi", g_bin), 2);
}

/* perplexity: the mean NLL it reports is the one computed here from
 * `ringlm logits` of the same window; a progress bar goes to stderr. */
TEST(perplexity_matches_logits) {
  char dir[400], out[8192], path[600];
  byte_model(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/text.txt", g_dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("The cat sat on the mat. ", f); /* 24 bytes = 24 tokens */
  fclose(f);
  CHECK_EQ(run(out, sizeof out, "%s perplexity -m %s -f %s --ctx 512", g_bin, dir, path), 0);
  CHECK_STR_CONTAINS(out, "perplexity [");
  CHECK_STR_CONTAINS(out, "over 24 tokens, 1 window of 25"); /* BOS (id 1), then 24 scored */
  const char *p = strstr(out, "mean nll ");
  double got = p ? strtod(p + 9, NULL) : -1;
  /* BOS and the same 24 ids through `ringlm logits`, log-softmax here. */
  CHECK_EQ(run(out, sizeof out, "%s tokenize -m %s -f %s --no-special", g_bin, dir, path), 0);
  char idl[512] = "1,";
  first_line(out, idl + 2, sizeof idl - 2);
  for (char *c = idl; *c; c++) *c = *c == ' ' ? ',' : *c;
  CHECK_EQ(run(out, sizeof out, "%s logits -m %s --ids %s -o %s/p.npy", g_bin, dir, idl, g_dir), 0);
  snprintf(path, sizeof path, "%s/p.npy", g_dir);
  f = fopen(path, "rb");
  static float lg[25][256];
  CHECK(f && fseek(f, 128, SEEK_SET) == 0 && fread(lg, sizeof lg, 1, f) == 1);
  if (f) fclose(f);
  int ids[25], n = 0;
  for (char *c = idl; *c && n < 25; c++) ids[n++] = (int)strtol(c, &c, 10);
  double sum = 0;
  for (int j = 0; j + 1 < n; j++) {
    double mx = -1e30, s = 0;
    for (int v = 0; v < 256; v++) mx = fmax(mx, lg[j][v]);
    for (int v = 0; v < 256; v++) s += exp(lg[j][v] - mx);
    sum += log(s) + mx - lg[j][ids[j + 1]];
  }
  CHECK_EQ(n, 25);
  CHECK(fabs(got - sum / 24) < 1e-5);
  /* --kl: a quantized-KV run beside a dense one. Its dense perplexity is
   * the plain run's; dense against dense is KL 0 and 100% agreement. */
  snprintf(path, sizeof path, "%s/text.txt", g_dir);
  CHECK_EQ(run(out, sizeof out,
               "%s perplexity -m %s -f %s --kl --kv-bits 4 --kv-group-size 32 2>/dev/null | cat",
               g_bin, dir, path),
           0);
  p = strstr(out, "dense-KV perplexity ");
  CHECK(p && fabs(log(strtod(p + 20, NULL)) - got) < 1e-5);
  p = strstr(out, "mean KL ");
  CHECK(p && strtod(p + 8, NULL) > 0 && strtod(p + 8, NULL) < 1);
  CHECK_EQ(
      run(out, sizeof out, "%s perplexity -m %s -f %s --kl 2>/dev/null | cat", g_bin, dir, path),
      0);
  CHECK_STR_CONTAINS(out, "mean KL 0.000000, top-1 agreement 100.0000%");
  CHECK_EQ(run(out, sizeof out, "%s perplexity -m %s -f %s/missing.txt", g_bin, dir, g_dir), 1);
  CHECK_STR_CONTAINS(out, "missing.txt");
  /* --act-bits 8 (int8 activations in 4- and 8-bit products) on the
   * embedded 4-bit model and on the 8-bit one (every product, the tied
   * lm_head too, takes the 8-bit-weight kernels): the same perplexity
   * within 1%, in decode steps (chunk 1) and in prefill chunks. */
  const char *src = getenv("RINGLM_SOURCE_DIR");
  f = fopen(path, "w");
  for (int i = 0; f && i < 12; i++)
    fputs("The jury said that the city had been informed of the election. ", f);
  if (f) fclose(f);
  static const char *models[2] = {"brown-15m-4bit", "brown-15m-8bit"};
  static const char *opts[3] = {"--prefill-chunk 1", "--prefill-chunk 1 --act-bits 8",
                                "--act-bits 8"};
  for (int mi = 0; mi < 2; mi++) {
    double ppl[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
      CHECK_EQ(run(out, sizeof out, "%s perplexity -m %s/models/%s -f %s %s 2>/dev/null | cat", g_bin,
                   src, models[mi], path, opts[k]),
               0);
      p = strstr(out, "perplexity ");
      ppl[k] = p ? strtod(p + 11, NULL) : 0;
    }
    test_note("%s: perplexity exact %g, int8 activations %g (decode), %g (prefill)", models[mi],
              ppl[0], ppl[1], ppl[2]);
    CHECK(ppl[0] > 1 && ppl[1] != ppl[0] && ppl[2] != ppl[0]);
    CHECK(fabs(ppl[1] / ppl[0] - 1) < 0.01 && fabs(ppl[2] / ppl[0] - 1) < 0.01);
  }
}

/* ---- the CLI's conventions (issue 11) ------------------------------------ */

/* Whether name occurs in s as a whole option: after a space, before a
 * space, a comma or the end of a line. */
static bool has_option(const char *s, const char *name) {
  size_t n = strlen(name);
  for (const char *p = strstr(s, name); p; p = strstr(p + 1, name))
    if (p > s && p[-1] == ' ' && (p[n] == ' ' || p[n] == ',' || p[n] == '\n')) return true;
  return false;
}

/* s with every run of whitespace as one space (--help wraps its lines). */
static void squeeze_spaces(char *s) {
  char *w = s;
  for (const char *r = s; *r; r++)
    if (!(isspace((unsigned char)*r) && w > s && w[-1] == ' '))
      *w++ = isspace((unsigned char)*r) ? ' ' : *r;
  *w = 0;
}

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK_EQ(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* The top-level usage names every command, -m optional in each. */
TEST(usage_names_every_command) {
  static const char *const cmds[] = {"run [-m DIR]",    "chat [-m DIR]",
                                     "logits [-m DIR]", "perplexity [-m DIR]",
                                     "bench [-m DIR]",  "tokenize [-m DIR]",
                                     "quantize IN OUT", "inspect PATH",
                                     "inspect -m DIR",  "version"};
  char out[8192];
  CHECK_EQ(run(out, sizeof out, "%s help", g_bin), 0);
  for (int i = 0; i < N_OF(cmds); i++) CHECK_STR_CONTAINS(out, cmds[i]);
}

/* A bad value is exit status 2 and one line naming the flag and what is
 * valid, found before anything loads (the folder does not exist). */
TEST(bad_values_are_usage_errors) {
  static const struct { const char *cmd, *args, *flag, *valid; } bad[] = {
      {"run", "--temp -1", "--temp", ">= 0"},
      {"run", "--top-p 2", "--top-p", "(0, 1]"},
      {"run", "--top-k -1", "--top-k", ">= 0"},
      {"run", "--repeat-penalty 0", "--repeat-penalty", "> 0"},
      {"run", "--kv-bits 7", "--kv-bits", "2, 3, 4, 5, 6, 8"},
      {"run", "--kv-group-size 48", "--kv-group-size", "32, 64, 128"},
      {"run", "--stop ''", "--stop", "non-empty"},
      {"run", "--act-bits 4", "--act-bits", "one of 0, 8"},
      {"run", "--min-p 1", "--min-p", "[0, 1)"},
      {"run", "--temp x", "--temp", ">= 0"},
      {"run", "-n 1x", "-n", ">= -1"},
      {"run", "--seed 1.5", "--seed", "-1"},
      {"run", "--repeat-last-n -2", "--repeat-last-n", "[0, 1048576]"},
      {"run", "--temp", "--temp", "needs a value"},
      {"chat", "--top-p 0", "--top-p", "(0, 1]"},
      {"logits", "-o x.npy --k-bits 1", "--k-bits", "2, 3, 4, 5, 6, 8"},
      {"perplexity", "-f x -c 1", "-c", ">= 2"},
      {"bench", "-r 0", "-r", "[1, 1000]"},
      {"bench", "--act-bits 7", "--act-bits", "one of 0, 8"},
      {"run", "--draft-max 0", "--draft-max", "[1, 32]"},
      {"run", "--lookup 2 --draft-max 33", "--draft-max", "[1, 32]"},
      {"batch", "-f x --parallel 0", "--parallel", "[1, 4096]"},
      {"run", "--kv-sinks -1", "--kv-sinks", ">= 0"},
      {"run", "--device gpu", "--device", "cpu or cuda"},
  };
  char out[8192];
  for (int i = 0; i < N_OF(bad); i++) {
    test_note("%s %s", bad[i].cmd, bad[i].args);
    CHECK_EQ(run(out, sizeof out, "%s %s -m %s/nowhere %s </dev/null", g_bin, bad[i].cmd, g_dir,
                 bad[i].args), 2);
    CHECK_STR_CONTAINS(out, bad[i].flag);
    CHECK_STR_CONTAINS(out, bad[i].valid);
    CHECK_EQ(count_lines(out), 1);
  }
}

/* --device cuda where the GPU is missing: a build without the CUDA
 * backend, or a machine without a device, is one line and exit 1 (not a
 * usage error: the value is valid); with a GPU the run succeeds. */
TEST(device_cuda_without_a_gpu) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192];
  const int rc = run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 5,6,7 -n 2 --device cuda "
                     "--print-ids", g_bin, src);
  if (rc == 0) return; /* a GPU is here: test_cuda_model checks what it computes */
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "device cuda: this build has no CUDA backend") || strstr(out, "device cuda: no CUDA device"));
  CHECK_EQ(count_lines(out), 1);
  test_note("%s", out);
}

/* --name=value works for every command (main splits it), and a value
 * keeps any later '='. */
TEST(opt_equals_value) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192], want[8192], dir[400];
  CHECK_EQ(run(want, sizeof want,
               "%s run -m %s/tests/fixtures/models/llama --ids 5,6,7 -n 6 --print-ids "
               "--ignore-eos 2>/dev/null | cat",
               g_bin, src),
           0);
  CHECK_EQ(run(out, sizeof out,
               "%s run --model=%s/tests/fixtures/models/llama --ids=5,6,7 --n-predict=6 "
               "--print-ids --ignore-eos --temp=0 2>/dev/null | cat",
               g_bin, src),
           0);
  CHECK(strlen(want) > 6);
  CHECK_STR_EQ(out, want);
  byte_model(dir, sizeof dir);
  CHECK_EQ(run(out, sizeof out, "%s tokenize --model=%s --prompt=a=b", g_bin, dir), 0);
  CHECK_STR_EQ(out, "97 61 98\n");
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --bits=x", g_bin), 2);
  CHECK_STR_CONTAINS(out, "--bits expects an integer");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s/nowhere --n-prompt=x", g_bin, g_dir), 2);
  CHECK_STR_CONTAINS(out, "--n-prompt expects an integer");
}

/* -f FILE and -f - (stdin) give the prompt as -p does, for run, logits
 * and tokenize; --no-display-prompt prints the generated text alone. */
TEST(prompt_from_file_and_stdin) {
  char dir[400], path[600], out[8192], want[8192];
  byte_model(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/prompt.txt", g_dir);
  write_file(path, "Once upon a time", 16);
  CHECK_EQ(
      run(want, sizeof want,
          "%s run -m %s -p 'Once upon a time' -n 12 --ignore-eos 2>/dev/null | cat", g_bin, dir),
      0);
  CHECK(!strncmp(want, "Once upon a time", 16) && strlen(want) > 17);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s -f %s -n 12 --ignore-eos 2>/dev/null | cat", g_bin,
               dir, path),
           0);
  CHECK_STR_EQ(out, want);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s -f - -n 12 --ignore-eos <%s 2>/dev/null | cat", g_bin,
               dir, path),
           0);
  CHECK_STR_EQ(out, want);
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s -f %s -n 12 --ignore-eos --no-display-prompt 2>/dev/null | cat", g_bin,
               dir, path),
           0);
  CHECK_STR_EQ(out, want + 16);
  CHECK_EQ(run(out, sizeof out, "%s tokenize -m %s -f - <%s", g_bin, dir, path), 0);
  CHECK_EQ(run(want, sizeof want, "%s tokenize -m %s -p 'Once upon a time'", g_bin, dir), 0);
  CHECK_STR_EQ(out, want);
  CHECK_EQ(run(out, sizeof out, "%s logits -m %s -f %s -o %s/f.npy", g_bin, dir, path, g_dir), 0);
  snprintf(path, sizeof path, "%s/f.npy", g_dir);
  FILE *f = fopen(path, "rb");
  CHECK(f && fseek(f, 0, SEEK_END) == 0 &&
        ftell(f) == 128 + 16 * 256 * 4); /* 16 bytes = 16 tokens */
  if (f) fclose(f);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s -f %s/absent.txt", g_bin, dir, g_dir), 1);
  CHECK_STR_CONTAINS(out, "absent.txt: cannot read");
  CHECK_EQ(run(out, sizeof out, "%s run -m %s -f %s -p hi", g_bin, dir, path), 2);
}

/* -n -1 generates up to the context (-c) when no EOS comes; a prompt
 * that fills the context fails; past max_position_embeddings, a warning. */
TEST(context_limit) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192], dir[400], path[600], text[600];
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids 1,2,3 -n -1 -c 20 --ignore-eos "
               "--print-ids",
               g_bin, src),
           0);
  CHECK_STR_CONTAINS(out, "generated 17 tokens,");
  CHECK_EQ(
      run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1,2,3 -c 3", g_bin, src),
      1);
  CHECK_STR_CONTAINS(out, "context");
  CHECK_EQ(count_lines(out), 1);
  byte_model(dir, sizeof dir); /* the llama fixture: max_position_embeddings 512 */
  memset(text, 'a', 520);
  snprintf(path, sizeof path, "%s/long.txt", g_dir);
  write_file(path, text, 520);
  CHECK_EQ(
      run(out, sizeof out, "%s run -m %s -f %s -c 600 -n 2 --no-display-prompt", g_bin, dir, path),
      0);
  CHECK_STR_CONTAINS(out, "ringlm run: warning: the prompt reaches position 520, past the model's "
                     "max_position_embeddings 512");
  CHECK_STR_CONTAINS(out, "generated 2 tokens");
  /* Without -c a prompt past max_position_embeddings only warns. */
  CHECK_EQ(run(out, sizeof out, "%s run -m %s -f %s -n 2 --no-display-prompt", g_bin, dir, path), 0);
  CHECK_STR_CONTAINS(out, "warning: the prompt reaches position 520");
  CHECK_STR_CONTAINS(out, "generated 2 tokens");
  /* -n -1 without -c stops at max_position_embeddings. */
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids 1,2,3 -n -1 --ignore-eos --print-ids",
               g_bin, src),
           0);
  CHECK_STR_CONTAINS(out, "generated 509 tokens,");
}

/* --help of each command lists every option the table has for it, with
 * its default: chat's -n is 512, run's 128. */
TEST(help_lists_every_option) {
#define SESSION_OPTS \
  " -t --threads --kv-bits --k-bits --v-bits --kv-group-size --max-kv --prefill-chunk --act-bits"
#define SAMPLER_OPTS \
  " --ignore-eos --stop --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed"
  static const struct { const char *cmd, *opts;
  } h[] = {
      {"run",
       "-m --model -p --prompt -f --file --ids -n --n-predict -c --ctx-size --ctx --chat "
       "--chat-template"
       " --system --no-display-prompt --print-ids" SAMPLER_OPTS SESSION_OPTS},
      {"chat",
       "-m --model -n --n-predict -c --ctx-size --chat-template --system "
       "--verbose-prompt" SAMPLER_OPTS SESSION_OPTS},
      {"logits", "-m --model -p --prompt -f --file --ids -o --output" SESSION_OPTS},
      {"perplexity", "-m --model -f --file -c --ctx-size --ctx --max-windows --kl" SESSION_OPTS},
      {"bench",
       "-m --model -p --n-prompt -n --n-gen -d --n-depth -r --repetitions --json" SESSION_OPTS},
      {"tokenize", "-m --model -p --prompt -f --file --ids --decode --no-special --skip-special"},
  };
  static char out[32768];
  for (int i = 0; i < N_OF(h); i++) {
    CHECK_EQ(run(out, sizeof out, "%s %s --help", g_bin, h[i].cmd), 0);
    char names[512], *save = NULL;
    snprintf(names, sizeof names, "%s", h[i].opts);
    for (char *name = strtok_r(names, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
      test_note("%s --help lists %s", h[i].cmd, name);
      CHECK(has_option(out, name));
    }
    squeeze_spaces(out);
    test_note("%s --help", h[i].cmd);
    CHECK_STR_CONTAINS(out, "(default: ");
    if (!strcmp(h[i].cmd, "chat")) CHECK_STR_CONTAINS(out, "within the context) (default: 512)");
    if (!strcmp(h[i].cmd, "run")) CHECK_STR_CONTAINS(out, "within the context) (default: 128)");
  }
}

/* Options of other commands are ignored, each with a warning naming it. */
TEST(foreign_options_warn) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192], dir[400];
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids 1,2 -n 2 --system x --kl "
               "--max-windows 3",
               g_bin, src),
           0);
  CHECK_STR_CONTAINS(out, "ringlm run: warning: --system applies to chat");
  CHECK_STR_CONTAINS(out, "ringlm run: warning: --kl applies to perplexity only; ignored");
  CHECK_STR_CONTAINS(out, "ringlm run: warning: --max-windows applies to perplexity only; ignored");
  CHECK_STR_CONTAINS(out, "generated 2 tokens");
  byte_model(dir, sizeof dir);
  CHECK_EQ(run(out, sizeof out, "%s tokenize -m %s -p a --temp 1", g_bin, dir), 0);
  CHECK_STR_CONTAINS(out, "ringlm tokenize: warning: --temp applies to run, chat, batch and serve only; ignored");
  CHECK_STR_CONTAINS(out, "\n97\n");
}

/* tokenize's space-separated output decodes as it is (commas, spaces and
 * mixed whitespace all separate ids); -m defaults to the embedded model. */
TEST(tokenize_round_trip) {
  char out[8192], ids[4096], a[4096], b[4096];
  CHECK_EQ(run(out, sizeof out, "%s tokenize -p 'Once upon a time'", g_bin), 0);
  first_line(out, ids, sizeof ids);
  CHECK(strchr(ids, ' ') != NULL);
  CHECK_EQ(run(a, sizeof a, "%s tokenize --decode --skip-special --ids '%s'", g_bin, ids), 0);
  CHECK_STR_CONTAINS(a, "Once upon a time");
  for (char *c = strchr(ids, ' '); c; c = strchr(c + 1, ' ')) *c = ',';
  char *second = strchr(ids, ',');
  if (second) *second = '\t'; /* "2\t754,304" */
  CHECK_EQ(run(b, sizeof b, "%s tokenize --decode --skip-special --ids ' %s , 5'", g_bin, ids), 0);
  CHECK(!strncmp(a, b, strlen(a) - 1)); /* the same text, then id 5's */
  CHECK_EQ(run(out, sizeof out, "%s tokenize --decode --ids '1,,2'", g_bin), 2);
}

/* bench: the real thread count, 5 repetitions by default (as
 * llama-bench), no ± for one, KV in binary units. */
TEST(bench_threads_and_repetitions) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "%s bench -m %s/tests/fixtures/models/llama -p 8 -n 4 -r 1 -t 1 2>/dev/null | cat",
               g_bin, src),
           0);
  CHECK(strstr(out, "±") == NULL);
  CHECK_STR_CONTAINS(out, "| llama | dense | 1 | tg4 @ d0 | ");
  CHECK_STR_CONTAINS(out, " KiB |");
  CHECK_STR_CONTAINS(out, "peak RSS ");
  CHECK_EQ(run(out, sizeof out,
               "%s bench -m %s/tests/fixtures/models/llama -p 8 -n 4 -r 2 2>/dev/null | cat", g_bin,
               src),
           0);
  CHECK_STR_CONTAINS(out, " ± ");
  CHECK_EQ(run(out, sizeof out,
               "%s bench -m %s/tests/fixtures/models/llama -p 8 -n 0 --json 2>/dev/null | cat",
               g_bin, src),
           0);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  CHECK_EQ(json_integer_value(json_object_get(j, "threads")), rlm_cpu_info_get().n_physical);
  CHECK_EQ(json_integer_value(json_object_get(j, "repetitions")), 5);
  CHECK_EQ(json_array_size(json_object_get(j, "results")), 1);
  json_decref(j);
}

/* version: the commit it was built from and the CPU features in use. */
TEST(version_names_commit_and_cpu) {
  char out[8192];
  rlm_cpu_info ci = rlm_cpu_info_get();
  CHECK_EQ(run(out, sizeof out, "%s version", g_bin), 0);
  CHECK_STR_CONTAINS(out, "ringlm " RLM_VERSION_STRING " (commit ");
  CHECK_STR_CONTAINS(out, ci.features);
  CHECK_STR_CONTAINS(out, "physical core");
}

/* The stats line: singular for one, KV and peak RSS in binary units. */
TEST(stats_line_units) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s/tests/fixtures/models/llama --ids 1 -n 1 --print-ids --ignore-eos",
               g_bin, src),
           0);
  CHECK_STR_CONTAINS(out, "prompt 1 token, ");
  CHECK_STR_CONTAINS(out, "generated 1 token, ");
  const char *kv = strstr(out, ", KV ");
  char *end = NULL;
  CHECK(kv && strtod(kv + 5, &end) > 0 && end && !strncmp(end, " KiB, peak RSS ", 15));
  CHECK_STR_CONTAINS(out, " MiB\n");
}

/* Text that is not UTF-8: one line naming the input (the file, or
 * --prompt) and the problem, from tokenize, perplexity and run. */
TEST(invalid_utf8_names_the_input) {
  char dir[400], path[600], out[8192];
  byte_model(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/binary.dat", g_dir);
  write_file(path, "ab\xff\xfe cd", 7);
  static const char *const cmds[] = {"tokenize", "perplexity", "run"};
  for (int i = 0; i < N_OF(cmds); i++) {
    test_note("%s -f binary.dat", cmds[i]);
    CHECK_EQ(run(out, sizeof out, "%s %s -m %s -f %s", g_bin, cmds[i], dir, path), 1);
    CHECK_STR_CONTAINS(out, "binary.dat: ");
    CHECK_STR_CONTAINS(out, "not valid UTF-8");
    CHECK_STR_CONTAINS(out, "byte 2");
    CHECK_EQ(count_lines(out), 1);
  }
  CHECK_EQ(run(out, sizeof out, "%s tokenize -m %s --prompt \"$(printf 'a\\377')\"", g_bin, dir),
           1);
  CHECK_STR_CONTAINS(out, "--prompt: ");
  CHECK_STR_CONTAINS(out, "not valid UTF-8");
}

/* -t above the CPUs available: one warning line, and the run goes on. */
TEST(threads_warning) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  char out[8192], want[128];
  int n = rlm_cpu_info_get().n_available;
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1,2 -n 1 -t %d",
               g_bin, src, n + 1),
           0);
  snprintf(want, sizeof want, "ringlm run: warning: -t %d is more than the %d CPU", n + 1, n);
  CHECK_STR_CONTAINS(out, want);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1,2 -n 1 -t %d",
               g_bin, src, n),
           0);
  CHECK(strstr(out, "warning") == NULL);
}

/* run --chat: the prompt as one user turn (with --system) of the chat
 * template, here a --chat-template file; raw completion otherwise. */
TEST(run_chat_applies_the_template) {
  char dir[400], tpl[600], path[600], out[8192], want[8192], ids[8192];
  byte_model(dir, sizeof dir);
  snprintf(tpl, sizeof tpl, "%s/t.jinja", g_dir);
  static const char src[] = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                            "{% if add_generation_prompt %}[assistant] {% endif %}";
  write_file(tpl, src, sizeof src - 1);
  snprintf(path, sizeof path, "%s/rendered.txt", g_dir);
  write_file(path, "[system] Be\n[user] Hi\n[assistant] ", 34);
  CHECK_EQ(
      run(want, sizeof want, "%s run -m %s -f %s -n 6 --print-ids --ignore-eos", g_bin, dir, path),
      0);
  CHECK_STR_CONTAINS(want, "prompt 34 tokens"); /* byte-level, no BOS */
  CHECK_EQ(run(out, sizeof out,
               "%s run -m %s --chat --chat-template %s --system Be -p Hi -n 6 --print-ids "
               "--ignore-eos",
               g_bin, dir, tpl),
           0);
  CHECK_STR_CONTAINS(out, "prompt 34 tokens");
  first_line(want, ids, sizeof ids);
  CHECK(strlen(ids) > 0 && !strncmp(out, ids, strlen(ids)));
  CHECK_EQ(run(out, sizeof out, "%s run -m %s --chat --ids 1", g_bin, dir), 2);
  CHECK_STR_CONTAINS(out, "--chat");
  CHECK_EQ(run(out, sizeof out, "%s run -m %s --chat-template %s -p Hi -n 1", g_bin, dir, tpl), 0);
  CHECK_STR_CONTAINS(out, "warning: --chat-template applies to chat and run --chat only");
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  g_make = t_env("RINGLM_MAKE_MODEL");
  t_tmpdir(g_dir, sizeof g_dir, "cli");
  RUN(usage_errors);
  RUN(bad_files_one_line_errors);
  RUN(quantize_and_inspect_round_trip);
  RUN(run_greedy_every_fixture);
  RUN(run_streams_text_and_stops);
  RUN(chat_renders_the_conversation);
  RUN(bench_reports_each_depth);
  RUN(logits_and_bad_runs);
  RUN(perplexity_matches_logits);
  RUN(usage_names_every_command);
  RUN(bad_values_are_usage_errors);
  RUN(device_cuda_without_a_gpu);
  RUN(opt_equals_value);
  RUN(prompt_from_file_and_stdin);
  RUN(context_limit);
  RUN(help_lists_every_option);
  RUN(foreign_options_warn);
  RUN(tokenize_round_trip);
  RUN(bench_threads_and_repetitions);
  RUN(version_names_commit_and_cpu);
  RUN(stats_line_units);
  RUN(invalid_utf8_names_the_input);
  RUN(threads_warning);
  RUN(run_chat_applies_the_template);
  return t_finish(g_dir);
}
