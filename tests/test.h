/* test.h -- a tiny test harness (one header, no dependencies).
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ(a, b); CHECK_NEAR(x, y, tol); }
 *   int main(void) { RUN(name); return test_summary(); }
 *
 * A failed CHECK prints file:line and the values, marks the current test
 * failed and continues; test_summary prints "N passed, N failed" and
 * returns the exit status for ctest. Randomised tests print their seed on
 * failure via test_note().
 */
#ifndef RLM_TEST_H
#define RLM_TEST_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_pass, t_fail, t_cur_failed;
static const char *t_cur_name;
static char t_note[256];

#define TEST(name) static void name(void)

static inline void test_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void test_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_note, sizeof t_note, fmt, ap);
  va_end(ap);
}

static inline void t_failed(const char *file, int line, const char *what) {
  fflush(stdout);
  if (t_cur_failed < 10)
    fprintf(stderr, "  FAIL %s (%s:%d): %s%s%s\n", t_cur_name, file, line, what,
            t_note[0] ? " | " : "", t_note);
  t_cur_failed++;
}

#define CHECK(c)                                                             \
  do {                                                                       \
    if (!(c)) t_failed(__FILE__, __LINE__, #c);                              \
  } while (0)

#define CHECK_EQ(a, b)                                                       \
  do {                                                                       \
    long long t_a = (long long)(a), t_b = (long long)(b);                    \
    if (t_a != t_b) {                                                        \
      char t_m[256];                                                         \
      snprintf(t_m, sizeof t_m, "%s == %s (%lld != %lld)", #a, #b, t_a, t_b); \
      t_failed(__FILE__, __LINE__, t_m);                                     \
    }                                                                        \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                \
  do {                                                                       \
    double t_a = (double)(a), t_b = (double)(b);                             \
    if (!(fabs(t_a - t_b) <= (tol))) {                                       \
      char t_m[256];                                                         \
      snprintf(t_m, sizeof t_m, "%s ~ %s (%.9g vs %.9g, tol %g)", #a, #b, t_a, \
               t_b, (double)(tol));                                          \
      t_failed(__FILE__, __LINE__, t_m);                                     \
    }                                                                        \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                      \
  do {                                                                       \
    const char *t_h = (hay), *t_n = (needle);                                \
    if (!t_h || !strstr(t_h, t_n)) {                                         \
      char t_m[640];                                                         \
      snprintf(t_m, sizeof t_m, "\"%.300s\" contains \"%.200s\"", t_h ? t_h : "(null)", t_n); \
      t_failed(__FILE__, __LINE__, t_m);                                     \
    }                                                                        \
  } while (0)

#define CHECK_STR_EQ(got, want)                                              \
  do {                                                                       \
    const char *t_g = (got), *t_w = (want);                                  \
    if (!t_g || strcmp(t_g, t_w)) {                                          \
      char t_m[640];                                                         \
      snprintf(t_m, sizeof t_m, "\"%.300s\" == \"%.200s\"", t_g ? t_g : "(null)", t_w); \
      t_failed(__FILE__, __LINE__, t_m);                                     \
    }                                                                        \
  } while (0)

#define RUN(name) t_run(#name, name)

/* RINGLM_TEST_ONLY=substr runs only the tests whose name contains it (a
 * developer's filter; CI never sets it). */
static inline void t_run(const char *name, void (*fn)(void)) {
  const char *only = getenv("RINGLM_TEST_ONLY");
  if (only && !strstr(name, only)) return;
  t_cur_name = name;
  t_cur_failed = 0;
  t_note[0] = 0;
  fn();
  if (t_cur_failed) {
    t_fail++;
    fprintf(stderr, "FAIL %s (%d checks)\n", name, t_cur_failed);
  } else {
    t_pass++;
    printf("ok   %s\n", name);
  }
}

/* A test has nothing to recover: out of memory ends it. Zeroed, so no
 * byte a test forgets to fill is indeterminate. */
static inline void *xmalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* One suite run per kernel variant: each case as "isa/case", or a
 * "skipped" line (not a pass) when this CPU lacks the ISA. */
typedef struct t_case {
  const char *name;
  void (*fn)(void);
} t_case;

static inline void t_run_isa(const char *isa, bool available, const t_case *cases, int n) {
  if (!available) {
    printf("skipped: %s not supported by this CPU\n", isa);
    return;
  }
  for (int i = 0; i < n; i++) {
    char full[128];
    snprintf(full, sizeof full, "%s/%s", isa, cases[i].name);
    t_run(full, cases[i].fn);
  }
}

/* The library's count of failed invariant checks (src/base/status.c): a
 * suite with any fails, though every CHECK passed. */
unsigned long rlm__assert_failures(void);

static inline int test_summary(void) {
  unsigned long broken = rlm__assert_failures();
  if (broken) fprintf(stderr, "  FAIL: %lu internal invariant check(s) failed in the library\n", broken);
  printf("%d passed, %d failed\n", t_pass, t_fail);
  return t_fail || broken ? 1 : 0;
}

/* Deterministic PRNG (splitmix64) for randomised tests. */
static inline uint64_t t_rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [lo, hi). */
static inline float t_rng_float(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)((t_rng_next(s) >> 40) * 0x1p-24);
}
static inline float t_rng_normal(uint64_t *s) {
  double u1 = ((t_rng_next(s) >> 11) + 1) * 0x1p-53, u2 = (t_rng_next(s) >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A fresh empty directory under the build's temp area. */
static inline void t_tmpdir(char *out, size_t n, const char *tag) {
  snprintf(out, n, "/tmp/ringlm-test-%s-%ld-XXXXXX", tag, (long)getpid());
  if (!mkdtemp(out)) {
    perror("mkdtemp");
    exit(2);
  }
}

/* A variable ctest sets for the suites (RINGLM_BIN, RINGLM_MAKE_MODEL,
 * RINGLM_SOURCE_DIR); a test program run without it says so and exits 1. */
static inline const char *t_env(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) {
    fprintf(stderr, "%s must be set (ctest sets it)\n", name);
    exit(1);
  }
  return v;
}

/* The suite's exit status (test_summary); its temp folder `dir` is
 * removed when every test passed, kept for a look otherwise. */
static inline int t_finish(const char *dir) {
  int rc = test_summary();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (!rc && system(cmd) != 0) return 1;
  return rc;
}

/* Runs a shell command, captures its stdout and stderr (merged) into out,
 * returns its exit status (-1 if it did not exit). */
static inline int t_run_cmd(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int t_run_cmd(char *out, size_t n, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t len = fread(out, 1, n - 1, p);
  out[len] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The whole file (malloc'd, NUL-terminated, its size in *n), or NULL. */
static inline char *t_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = xmalloc((size_t)(len > 0 ? len : 0) + 1);
  *n = fread(p, 1, (size_t)(len > 0 ? len : 0), f);
  p[*n] = 0;
  fclose(f);
  return p;
}

/* Does the file hold exactly img[0, len)? */
static inline bool t_same_file(const char *path, const void *img, size_t len) {
  size_t n = 0;
  char *p = t_read_file(path, &n);
  bool ok = p && n == len && !memcmp(p, img, len);
  free(p);
  return ok;
}

/* A case this run cannot do (a file that is fetched, not committed, or a
 * tool that is not installed): "skipped: why" on a developer's offline
 * machine, but a failure under CI=true, where all of it is reachable, so
 * a broken fetch cannot pass as a skip (tests/server/lib.mjs's skip() and
 * the server_node test do the same). */
static inline void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void t_skip(const char *fmt, ...) {
  char why[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  const char *ci = getenv("CI");
  if (ci && !strcmp(ci, "true")) {
    fflush(stdout);
    fprintf(stderr, "FAIL: would skip, but CI=true: %s\n", why);
    t_fail++;
    return;
  }
  printf("skipped: %s\n", why);
}

#endif /* RLM_TEST_H */
