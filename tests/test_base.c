/* test_base.c -- error detail, arena, allocation counting and fault
 * injection, files (mmap, atomic writer), JSON errors, the thread pool
 * (private, and shared by handles from several threads). */
#include "base/base.h"
#include "test.h"

#include <time.h>

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

TEST(status_and_error) {
  rlm_error err;
  CHECK_EQ(rlm__err(&err, RLM_ERR_FORMAT, "x.safetensors: tensor '%s'\nbad", "w"),
           RLM_ERR_FORMAT);
  CHECK_EQ(err.code, RLM_ERR_FORMAT);
  CHECK(strchr(err.msg, '\n') == NULL); /* kept to one line */
  CHECK_STR_CONTAINS(err.msg, "tensor 'w'");
  CHECK_EQ(rlm__err(NULL, RLM_ERR_IO, "ignored"), RLM_ERR_IO);
  CHECK_STR_CONTAINS(rlm_status_str(RLM_ERR_FORMAT), "RLM_ERR_FORMAT");
  CHECK_STR_CONTAINS(rlm_status_str((rlm_status)99), "unknown");
  CHECK(strcmp(rlm_version(), RLM_VERSION_STRING) == 0);
  CHECK_EQ(RLM_VERSION_HEX, (RLM_VERSION_MAJOR << 16) | (RLM_VERSION_MINOR << 8) | RLM_VERSION_PATCH);
}

static int log_calls;
static void log_sink(rlm_log_level lv, const char *line, void *ctx) {
  log_calls++;
  RLM_UNUSED(lv);
  RLM_UNUSED(ctx);
  RLM_UNUSED(line);
}

TEST(logging_quiet_by_default) {
  RLM_LOGE("should not print");
  rlm_log_set(RLM_LOG_WARN, log_sink, NULL);
  RLM_LOGW("counted");
  RLM_LOGI("filtered");
  CHECK_EQ(log_calls, 1);
  rlm_log_set(RLM_LOG_NONE, NULL, NULL);
  RLM_LOGE("silent again");
  CHECK_EQ(log_calls, 1);
}

TEST(arena) {
  rlm_arena a;
  rlm__arena_init(&a, 256);
  char *p = rlm__arena_alloc(&a, 10);
  CHECK(p && ((uintptr_t)p % 16) == 0);
  char *q = rlm__arena_alloc_aligned(&a, 100, 64);
  CHECK(q && ((uintptr_t)q % 64) == 0);
  char *big = rlm__arena_alloc(&a, 10000); /* larger than a block */
  CHECK(big != NULL);
  memset(big, 1, 10000);
  CHECK(strcmp(rlm__arena_strndup(&a, "hello world", 5), "hello") == 0);
  /* After a reset that merged blocks, the same pattern allocates nothing. */
  rlm__arena_reset(&a);
  CHECK(rlm__arena_alloc(&a, 10) && rlm__arena_alloc(&a, 10000)); /* warm */
  uint64_t before = rlm__alloc_count();
  for (int round = 0; round < 3; round++) {
    rlm__arena_reset(&a);
    CHECK(rlm__arena_alloc(&a, 10) && rlm__arena_alloc(&a, 10000));
  }
  CHECK_EQ(rlm__alloc_count() - before, 0);
  rlm__arena_free(&a);
}

TEST(fault_injection) {
  rlm__alloc_fail_at(2);
  void *a = rlm__malloc(8), *b = rlm__malloc(8), *c = rlm__malloc(8), *d = rlm__malloc(8);
  CHECK(a && b && !c && d);
  rlm__free(a);
  rlm__free(b);
  rlm__free(d);
  rlm__alloc_fail_at(-1);
}

TEST(files) {
  char dir[256];
  t_tmpdir(dir, sizeof dir, "base");
  char *path = rlm__path_join(dir, "f.bin");
  rlm_error err;
  rlm_file_writer w;
  CHECK_EQ(rlm__writer_open(&w, path, &err), RLM_OK);
  CHECK_EQ(rlm__writer_write(&w, "abc", 3, &err), RLM_OK);
  CHECK(!rlm__path_exists(path)); /* not visible before commit */
  CHECK_EQ(rlm__writer_commit(&w, &err), RLM_OK);
  rlm_mapped_file f;
  CHECK_EQ(rlm__file_map(&f, path, &err), RLM_OK);
  CHECK(f.size == 3 && memcmp(f.data, "abc", 3) == 0);
  rlm__file_unmap(&f);
  /* Abort leaves the old file in place. */
  CHECK_EQ(rlm__writer_open(&w, path, &err), RLM_OK);
  CHECK_EQ(rlm__writer_write(&w, "zzzz", 4, &err), RLM_OK);
  rlm__writer_abort(&w);
  char *buf;
  size_t len;
  CHECK_EQ(rlm__file_read_all(path, &buf, &len, &err), RLM_OK);
  CHECK(len == 3 && strcmp(buf, "abc") == 0);
  rlm__free(buf);
  char *missing = rlm__path_join(dir, "missing");
  CHECK_EQ(rlm__file_map(&f, missing, &err), RLM_ERR_IO);
  CHECK_STR_CONTAINS(err.msg, missing);
  CHECK_EQ(rlm__file_map(&f, dir, &err), RLM_ERR_IO); /* a directory */
  CHECK(rlm__path_is_dir(dir) && !rlm__path_is_dir(path));
  /* A commit removes what a killed writer left (pid 4999999 > pid_max:
   * never running), and keeps a living one's (pid 1). */
  char stale[600], alive[600];
  snprintf(stale, sizeof stale, "%s.tmp.4999999", path);
  snprintf(alive, sizeof alive, "%s.tmp.1", path);
  FILE *fs = fopen(stale, "wb"), *fa = fopen(alive, "wb");
  CHECK(fs && fa);
  if (fs) fclose(fs);
  if (fa) fclose(fa);
  CHECK_EQ(rlm__writer_open(&w, path, &err), RLM_OK);
  CHECK_EQ(rlm__writer_commit(&w, &err), RLM_OK);
  CHECK(!rlm__path_exists(stale));
  CHECK(rlm__path_exists(alive));
  remove(alive);
  remove(path);
  rmdir(dir);
  rlm__free(missing);
  rlm__free(path);
}

TEST(json_errors_name_the_file) {
  json_t *j;
  rlm_error err;
  const char *bad = "{\n  \"a\": 1,\n  \"b\": }";
  CHECK_EQ(rlm__json_load_buf(bad, strlen(bad), "config.json", &j, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "config.json");
  CHECK_STR_CONTAINS(err.msg, "line 3");
  const char *dup = "{\"a\": 1, \"a\": 2}";
  CHECK_EQ(rlm__json_load_buf(dup, strlen(dup), "d.json", &j, &err), RLM_ERR_FORMAT);
  const char *ok = "{\"a\": [1, 2]}";
  CHECK_EQ(rlm__json_load_buf(ok, strlen(ok), "ok.json", &j, &err), RLM_OK);
  CHECK_EQ(json_array_size(json_object_get(j, "a")), 2);
  rlm__json_free(j);
}

/* Pool: every index visited exactly once, ranges aligned to the grain. */
struct pool_ctx {
  _Atomic int *hits;
  int64_t grain;
  _Atomic int misaligned;
  _Atomic int max_ith;
};

static void pool_fn(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  struct pool_ctx *c = ctx;
  if (i0 % c->grain) atomic_fetch_add(&c->misaligned, 1);
  if (ith >= nth) atomic_fetch_add(&c->misaligned, 1);
  for (int64_t i = i0; i < i1; i++) atomic_fetch_add(&c->hits[i], 1);
  int m = atomic_load(&c->max_ith);
  while (ith > m && !atomic_compare_exchange_weak(&c->max_ith, &m, ith)) {
  }
}

TEST(thread_pool) {
  rlm_pool *p;
  rlm_error err;
  CHECK_EQ(rlm__pool_create(&p, 4, &err), RLM_OK); /* more than cores: fine */
  CHECK_EQ(rlm__pool_size(p), 4);
  static _Atomic int hits[10007];
  for (int round = 0; round < 2000; round++) {
    int64_t n = 1 + (round * 7919) % 10007, grain = 1 + round % 17;
    for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
    struct pool_ctx c = {hits, grain, 0, 0};
    rlm__pool_for(p, n, grain, 0, pool_fn, &c);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
    test_note("round %d n=%lld grain=%lld", round, (long long)n, (long long)grain);
    CHECK_EQ(bad, 0);
    CHECK_EQ(atomic_load(&c.misaligned), 0);
    if (bad) break;
  }
  struct pool_ctx c = {hits, 1, 0, 0};
  rlm__pool_for(p, 0, 1, 0, pool_fn, &c); /* empty range: no call */
  rlm__pool_for(NULL, 10, 1, 0, pool_fn, &c); /* inline */
  rlm__pool_for(p, 100, 1, 10, pool_fn, &c); /* 1000 multiply-adds: inline */
  CHECK_EQ(atomic_load(&c.max_ith), 0);
  rlm__pool_free(p);
  rlm__pool_free(NULL);
  CHECK_EQ(rlm__pool_create(&p, 5000, &err), RLM_ERR_INVALID);
  CHECK(p == NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How wide a job goes for its work: nothing below RLM_POOL_MIN_WORK per
 * thread, the whole pool (up to the CPUs) for unknown (0) work. */
TEST(thread_pool_sizes_jobs_by_work) {
  rlm_pool *p;
  /* Never more threads per job than CPUs to run them at once. */
  const int wide = RLM_MIN(4, rlm_cpu_info_get().n_available);
  CHECK_EQ(rlm__pool_create(&p, 4, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_threads_for(p, 0), wide);
  CHECK_EQ(rlm__pool_threads_for(p, 1000), 1);
  CHECK_EQ(rlm__pool_threads_for(p, 2.5 * RLM_POOL_MIN_WORK), RLM_MIN(2, wide));
  CHECK_EQ(rlm__pool_threads_for(p, 1e12), wide);
  CHECK_EQ(rlm__pool_threads_for(NULL, 1e12), 1);
  rlm__pool_free(p);
}

/* Threads far beyond the CPUs: the old pool made every job wait for every
 * worker's next time slice (-t 1000 made 2 tokens in 60 s). Now workers
 * that are not running claim nothing, so small jobs cost about what they
 * cost on one thread. 64 threads per CPU, 3000 jobs: must take well under
 * a second (the old pool needed minutes). */
TEST(thread_pool_oversubscribed_stays_fast) {
  const int n_cpu = rlm_cpu_info_get().n_available;
  rlm_pool *p;
  CHECK_EQ(rlm__pool_create(&p, RLM_MIN(1024, 64 * n_cpu), NULL), RLM_OK);
  static _Atomic int hits[4096];
  struct pool_ctx c = {hits, 1, 0, 0};
  const double t0 = now_s();
  int bad = 0;
  for (int job = 0; job < 3000 && !bad; job++) {
    const int64_t n = 64 + job % 4000;
    for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
    rlm__pool_for(p, n, 1, 0, pool_fn, &c); /* unknown work: as wide as it goes */
    for (int64_t i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
  }
  const double dt = now_s() - t0;
  test_note("%d threads, 3000 jobs in %.3f s", rlm__pool_size(p), dt);
  CHECK_EQ(bad, 0);
  CHECK_EQ(atomic_load(&c.misaligned), 0);
  CHECK(dt < 3.0);
  rlm__pool_free(p);
}

/* Shared pool: a job sums [0, n) and records who ran it. */
struct sum_ctx {
  _Atomic int64_t sum;
  _Atomic int bad;          /* ith outside [0, nth), or nth not the size */
  _Atomic int max_ith;
  int want_nth;
  pthread_t ids[8];         /* distinct threads seen (first 8)           */
  _Atomic int n_ids;
  pthread_mutex_t ids_lock;
  rlm_pool *nest;           /* submit a nested job through this          */
};

static void note_thread(struct sum_ctx *c) {
  pthread_mutex_lock(&c->ids_lock);
  const pthread_t me = pthread_self();
  int k = 0, n = atomic_load(&c->n_ids);
  while (k < n && !pthread_equal(c->ids[k], me)) k++;
  if (k == n && n < N_OF(c->ids)) {
    c->ids[n] = me;
    atomic_store(&c->n_ids, n + 1);
  }
  pthread_mutex_unlock(&c->ids_lock);
}

static void sum_fn(void *ctx, int64_t i0, int64_t i1, int ith, int nth);

static void sum_ranges(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  struct sum_ctx *c = ctx;
  if (ith < 0 || ith >= nth || (nth != 1 && nth != c->want_nth)) atomic_fetch_add(&c->bad, 1);
  int m = atomic_load(&c->max_ith);
  while (ith > m && !atomic_compare_exchange_weak(&c->max_ith, &m, ith)) {
  }
  int64_t s = 0;
  for (int64_t i = i0; i < i1; i++) s += i;
  atomic_fetch_add(&c->sum, s);
}

static void sum_fn(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  struct sum_ctx *c = ctx;
  note_thread(c);
  if (!c->nest) {
    sum_ranges(ctx, i0, i1, ith, nth);
    return;
  }
  /* Nested: a job of its own over [i0, i1) shifted to 0, summed apart. */
  struct sum_ctx inner = {.want_nth = rlm__pool_size(c->nest)};
  pthread_mutex_init(&inner.ids_lock, NULL);
  rlm__pool_for(c->nest, i1 - i0, 1, 0, sum_ranges, &inner);
  const int64_t len = i1 - i0;
  atomic_fetch_add(&c->sum, atomic_load(&inner.sum) + i0 * len);
  atomic_fetch_add(&c->bad, atomic_load(&inner.bad));
  pthread_mutex_destroy(&inner.ids_lock);
}

/* Runs one job of n items through p; whether its sum came out right. */
static bool sum_job(rlm_pool *p, int64_t n, double item_work, struct sum_ctx *c) {
  atomic_store(&c->sum, 0);
  atomic_store(&c->n_ids, 0);
  c->want_nth = rlm__pool_size(p);
  rlm__pool_for(p, n, 1, item_work, sum_fn, c);
  return atomic_load(&c->sum) == n * (n - 1) / 2;
}

static struct sum_ctx sum_ctx_make(void) {
  struct sum_ctx c = {.want_nth = 1};
  pthread_mutex_init(&c.ids_lock, NULL);
  return c;
}

/* Two handles at once share one set of workers, as many as the larger
 * asks; it grows and shrinks with the handles, and the last release
 * joins them all; a new acquire then starts afresh. */
TEST(shared_pool_handles_share_workers) {
  const int live0 = rlm__pool_live_workers();
  rlm_pool *a, *b, *c;
  rlm_error err;
  CHECK_EQ(rlm__pool_acquire(&a, 2, &err), RLM_OK);
  CHECK_EQ(rlm__pool_workers(a), 1);
  CHECK_EQ(rlm__pool_live_workers(), live0 + 1);
  CHECK_EQ(rlm__pool_acquire(&b, 4, &err), RLM_OK);
  CHECK_EQ(rlm__pool_size(a), 2); /* a handle's jobs stay its size */
  CHECK_EQ(rlm__pool_size(b), 4);
  CHECK_EQ(rlm__pool_workers(a), 3); /* grown, shared: not 1 + 3 */
  CHECK_EQ(rlm__pool_workers(b), 3);
  CHECK_EQ(rlm__pool_live_workers(), live0 + 3);
  struct sum_ctx s = sum_ctx_make();
  int wrong = 0;
  for (int i = 0; i < 200; i++) wrong += !sum_job(i % 2 ? a : b, 1000 + i, 0, &s);
  CHECK_EQ(wrong, 0);
  rlm__pool_release(b); /* the larger goes: its extra workers too */
  CHECK_EQ(rlm__pool_workers(a), 1);
  CHECK_EQ(rlm__pool_live_workers(), live0 + 1);
  CHECK(sum_job(a, 5000, 0, &s));
  rlm__pool_release(a);
  CHECK_EQ(rlm__pool_live_workers(), live0);
  CHECK_EQ(rlm__pool_acquire(&c, 3, &err), RLM_OK);
  CHECK_EQ(rlm__pool_live_workers(), live0 + 2);
  CHECK(sum_job(c, 5000, 0, &s));
  rlm__pool_free(c); /* an acquired handle: released */
  CHECK_EQ(rlm__pool_live_workers(), live0);
  CHECK_EQ(atomic_load(&s.bad), 0);
  CHECK_EQ(rlm__pool_acquire(&c, 5000, &err), RLM_ERR_INVALID);
  CHECK(c == NULL);
  CHECK_EQ(rlm__pool_acquire(&c, 0, &err), RLM_OK);
  CHECK_EQ(rlm__pool_size(c), rlm__cpu_physical());
  rlm__pool_release(c);
  rlm__pool_release(NULL);
  CHECK_EQ(rlm__pool_live_workers(), live0);
  pthread_mutex_destroy(&s.ids_lock);
}

/* A job through a handle of n threads runs on at most n of them, with
 * ith below n, though the shared workers are more: -t 1 stays on its
 * caller. */
TEST(shared_pool_job_uses_its_handles_threads) {
  rlm_pool *one, *two, *big;
  CHECK_EQ(rlm__pool_acquire(&big, 8, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_acquire(&two, 2, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_acquire(&one, 1, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_workers(one), 7);
  struct sum_ctx s = sum_ctx_make();
  int wrong = 0, too_many = 0, not_caller = 0;
  for (int i = 0; i < 2000; i++) {
    wrong += !sum_job(two, 20000 + i, 1e6, &s); /* work enough for every thread */
    too_many += atomic_load(&s.n_ids) > 2;
    if (i % 4 == 0) sum_job(big, 20000, 1e6, &s); /* keep the others awake */
  }
  CHECK(atomic_load(&s.max_ith) <= 7);
  atomic_store(&s.max_ith, 0);
  for (int i = 0; i < 200; i++) {
    wrong += !sum_job(one, 20000 + i, 1e6, &s);
    not_caller += atomic_load(&s.n_ids) != 1 || !pthread_equal(s.ids[0], pthread_self());
  }
  CHECK_EQ(wrong, 0);
  CHECK_EQ(too_many, 0);
  CHECK_EQ(not_caller, 0);
  CHECK_EQ(atomic_load(&s.max_ith), 0);
  CHECK_EQ(atomic_load(&s.bad), 0); /* ith < nth == the handle's size */
  rlm__pool_release(one);
  rlm__pool_release(two);
  rlm__pool_release(big);
  pthread_mutex_destroy(&s.ids_lock);
}

struct submitter {
  rlm_pool *pool;
  int n_jobs;
  int wrong;
  int bad;
};

static void *submit_jobs(void *arg) {
  struct submitter *t = arg;
  struct sum_ctx s = sum_ctx_make();
  for (int i = 0; i < t->n_jobs; i++)
    t->wrong += !sum_job(t->pool, 64 + (i * 7919) % 30000, i % 3 ? 1e4 : 0, &s);
  t->bad = atomic_load(&s.bad);
  pthread_mutex_destroy(&s.ids_lock);
  return NULL;
}

/* Three caller threads at once through three handles of one core,
 * thousands of jobs each: every sum right, every ith below its nth. */
TEST(shared_pool_concurrent_callers) {
  const int live0 = rlm__pool_live_workers();
  struct submitter t[3] = {{.n_jobs = 4000}, {.n_jobs = 4000}, {.n_jobs = 1000}};
  const int sizes[3] = {2, 3, 1};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) CHECK_EQ(rlm__pool_acquire(&t[i].pool, sizes[i], NULL), RLM_OK);
  CHECK_EQ(rlm__pool_live_workers(), live0 + 2);
  for (int i = 0; i < 3; i++) CHECK_EQ(pthread_create(&th[i], NULL, submit_jobs, &t[i]), 0);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    test_note("caller %d", i);
    CHECK_EQ(t[i].wrong, 0);
    CHECK_EQ(t[i].bad, 0);
    rlm__pool_release(t[i].pool);
  }
  CHECK_EQ(rlm__pool_live_workers(), live0);
}

/* A job that submits a job through the same core (its own handle or
 * another) runs that one inline instead of deadlocking on the core; one
 * through a private pool runs there. */
TEST(shared_pool_nested_job_runs_inline) {
  rlm_pool *a, *b, *priv;
  CHECK_EQ(rlm__pool_acquire(&a, 3, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_acquire(&b, 2, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_create(&priv, 2, NULL), RLM_OK);
  rlm_pool *nests[3] = {a, b, priv};
  int wrong = 0;
  struct sum_ctx s = sum_ctx_make();
  for (int i = 0; i < 300; i++) {
    s.nest = nests[i % 3];
    wrong += !sum_job(a, 3000 + i, 0, &s);
  }
  CHECK_EQ(wrong, 0);
  CHECK_EQ(atomic_load(&s.bad), 0);
  rlm__pool_free(priv);
  rlm__pool_release(b);
  rlm__pool_release(a);
  pthread_mutex_destroy(&s.ids_lock);
}

int main(void) {
  RUN(status_and_error);
  RUN(logging_quiet_by_default);
  RUN(arena);
  RUN(fault_injection);
  RUN(files);
  RUN(json_errors_name_the_file);
  RUN(thread_pool);
  RUN(thread_pool_sizes_jobs_by_work);
  RUN(thread_pool_oversubscribed_stays_fast);
  RUN(shared_pool_handles_share_workers);
  RUN(shared_pool_job_uses_its_handles_threads);
  RUN(shared_pool_concurrent_callers);
  RUN(shared_pool_nested_job_runs_inline);
  return test_summary();
}
