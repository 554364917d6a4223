/* pool.c -- a persistent thread pool with one primitive: parallel-for over
 * [0, n) in contiguous ranges.
 *
 * Why persistent and spinning: decode calls the pool hundreds of times per
 * token (every matrix-vector product); creating threads or sleeping on a
 * futex each time would cost more than the work. Workers spin on the job
 * generation for a short while after each job, then sleep on a condition
 * variable; the caller signals only if someone sleeps (n_sleeping), so hot
 * back-to-back jobs make no system calls.
 *
 * Ownership: one caller thread submits at a time (not re-entrant); the
 * workers only read the job fields after seeing a new generation (acquire)
 * and the caller only rewrites them after pending reached 0 (acquire).
 */
#include "base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum { SPIN_ITERS = 1 << 14 };

struct rlm_pool {
  int n_threads;                 /* workers + the calling thread        */
  pthread_t *threads;            /* [n_threads - 1]                     */
  struct pool_worker *workers;   /* [n_threads - 1]                     */
  pthread_mutex_t mu;            /* guards sleeping workers' wake-up    */
  pthread_cond_t cv;             /* signalled when gen moves or on stop */
  _Alignas(64) _Atomic uint64_t gen; /* job generation, +1 per job     */
  _Alignas(64) _Atomic int pending;  /* workers still running this job */
  _Atomic int n_sleeping;            /* workers blocked on cv          */
  _Atomic bool stop;
  /* The current job: written by the caller before gen is bumped. */
  rlm_range_fn fn;
  void *ctx;
  int64_t n;
  int64_t chunk;                 /* range length per thread (grain-aligned) */
  int nth;                       /* threads taking part                 */
};

struct pool_worker {
  rlm_pool *pool;
  int ith; /* 1..n_threads-1; the caller is 0 */
};

int rlm__cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void run_range(rlm_pool *p, int ith) {
  int64_t i0 = (int64_t)ith * p->chunk;
  int64_t i1 = RLM_MIN(p->n, i0 + p->chunk);
  if (i0 < i1) p->fn(p->ctx, i0, i1, ith, p->nth);
}

/* Waits for a generation other than `seen`; returns it. */
static uint64_t worker_wait(rlm_pool *p, uint64_t seen) {
  for (int i = 0; i < SPIN_ITERS; i++) {
    uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g != seen || atomic_load(&p->stop)) return g;
    cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->n_sleeping, 1);
  uint64_t g;
  while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
    pthread_cond_wait(&p->cv, &p->mu);
  atomic_fetch_sub(&p->n_sleeping, 1);
  pthread_mutex_unlock(&p->mu);
  return g;
}

static void *worker_main(void *arg) {
  struct pool_worker *w = arg;
  rlm_pool *p = w->pool;
  uint64_t seen = 0;
  for (;;) {
    seen = worker_wait(p, seen);
    if (atomic_load(&p->stop)) break;
    if (w->ith < p->nth) run_range(p, w->ith);
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
  }
  return NULL;
}

rlm_status rlm__pool_create(rlm_pool **out, int n_threads, rlm_error *err) {
  *out = NULL;
  if (n_threads <= 0) n_threads = rlm__cpu_physical();
  if (n_threads > 1024)
    return rlm__err(err, RLM_ERR_INVALID, "thread pool: %d threads is too many", n_threads);
  rlm_pool *p = rlm__calloc(1, sizeof *p);
  if (!p) return rlm__err_nomem(err, "thread pool", sizeof *p);
  p->n_threads = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  int nw = n_threads - 1;
  if (nw > 0) {
    p->threads = rlm__calloc((size_t)nw, sizeof *p->threads);
    p->workers = rlm__calloc((size_t)nw, sizeof *p->workers);
    if (!p->threads || !p->workers) goto out_free_pool;
  }
  for (int i = 0; i < nw; i++) {
    p->workers[i] = (struct pool_worker){p, i + 1};
    if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]) != 0) {
      p->n_threads = i + 1; /* join those that started */
      rlm__pool_free(p);
      return rlm__err(err, RLM_ERR_NOMEM, "thread pool: cannot start thread %d of %d",
                      i + 1, nw);
    }
  }
  *out = p;
  return RLM_OK;
out_free_pool:
  rlm__free(p->threads);
  rlm__free(p->workers);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  rlm__free(p);
  return rlm__err_nomem(err, "thread pool", (size_t)nw * sizeof(pthread_t));
}

void rlm__pool_free(rlm_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  rlm__free(p->threads);
  rlm__free(p->workers);
  rlm__free(p);
}

int rlm__pool_size(const rlm_pool *p) { return p ? p->n_threads : 1; }

void rlm__pool_for(rlm_pool *p, int64_t n, int64_t grain, rlm_range_fn fn,
                   void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t n_grains = (n + grain - 1) / grain;
  int nth = (int)RLM_MIN((int64_t)rlm__pool_size(p), n_grains);
  if (nth <= 1) {
    fn(ctx, 0, n, 0, 1);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n_grains + nth - 1) / nth * grain;
  p->nth = nth;
  atomic_store(&p->pending, p->n_threads - 1);
  atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with n_sleeping below */
  if (atomic_load(&p->n_sleeping) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  run_range(p, 0);
  for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
    if (i < SPIN_ITERS) cpu_relax();
    else sched_yield();
  }
}
