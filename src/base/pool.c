/* pool.c -- a persistent thread pool with one primitive: parallel-for over
 * [0, n) in contiguous chunks that the threads claim as they come.
 *
 * Why persistent: decode calls the pool hundreds of times per token (every
 * matrix-vector product), so creating threads per call would cost more
 * than the work. Why claimed chunks rather than one fixed range per
 * thread: when threads outnumber the free cores (-t above the cores, or
 * another process busy on one of them), a thread that the kernel has not
 * scheduled yet would hold up its whole range, and every call would wait
 * for the slowest thread's next time slice. Here a job is cut into a few
 * chunks per thread; whoever runs claims the next chunk, the caller
 * included, and the caller waits only for chunks already claimed. A
 * descheduled worker claims nothing and delays nothing.
 *
 * Waiting, as llama.cpp's threadpool does it: spin briefly, then block on
 * a futex. Idle workers spin only while the pool has a core per thread;
 * otherwise spinning would steal the core from a thread doing the work.
 * Even then a core may be shared with another process: a spinning worker
 * there burns the share it needs for its chunks, gets preempted holding
 * one, and keeps the kernel from moving a preempted caller to the core it
 * spins on. Each thread therefore counts how often it was preempted
 * (involuntary context switches, one getrusage every CHECK_JOBS jobs); a
 * thread preempted PREEMPT_LIMIT times in that window stops the spinning
 * of every worker for the next QUIET_JOBS jobs, after which spinning is
 * tried again. The caller wakes sleepers only when some sleep
 * (n_sleeping), and only as many as there are chunks for, so hot
 * back-to-back jobs make no system calls.
 *
 * The claim word packs (generation, chunk count, next chunk) into one
 * 64-bit atomic, so a claim is one compare-and-swap that can only succeed
 * for the job its claimer saw: a worker that wakes late finds a newer
 * generation and touches nothing. The job's fields are written before the
 * claim word is published (release) and read only after a successful
 * claim (acquire); they are rewritten only after every chunk reported
 * done, so a claimed chunk always reads its own job.
 *
 * Ownership: one caller thread submits at a time (not re-entrant).
 */
#include "base.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum {
  SPIN_ITERS = 1 << 14,   /* pauses before blocking: ~0.3 ms, longer than
                             the gap between two products of a decode step */
  CHUNKS_PER_THREAD = 4,  /* when threads sleep or share cores: enough to
                             rebalance, few enough to keep each chunk a
                             long contiguous stream of rows. Spinning on
                             cores of their own, each thread takes one
                             range (nothing to rebalance, no claims to
                             contend on): 2-3% faster on small models.   */
  MAX_CHUNKS = 0xffff,    /* the claim word's 16-bit fields               */
  CHECK_JOBS = 256,       /* jobs between two preemption counts (5-30 ms) */
  PREEMPT_LIMIT = 8,      /* preemptions in a window that mean "shared":
                             alone on its core a thread sees 0-3 (timer
                             work, daemons), beside a busy process 10-170 */
  QUIET_JOBS = 1 << 12,   /* jobs without spinning after that (~0.1 s)   */
};

/* A thread's preemption count at its last look. */
typedef struct preempt_watch {
  long nivcsw;
  uint32_t jobs;
} preempt_watch;

struct rlm_pool {
  int n_threads;                 /* workers + the calling thread         */
  int n_cpus;                    /* CPUs of the affinity mask: the most
                                    threads one job wakes                */
  bool spin;                     /* a core per thread: idle workers spin */
  pthread_t *threads;            /* [n_threads - 1]                      */
  struct pool_worker *workers;   /* [n_threads - 1]                      */
  _Alignas(64) _Atomic uint32_t gen;   /* futex word of the workers: +1 per job */
  _Alignas(64) _Atomic uint64_t claim; /* gen << 32 | n_chunks << 16 | next     */
  _Alignas(64) _Atomic uint32_t done;  /* chunks finished; futex word of caller */
  _Atomic int caller_sleeping;         /* the caller blocks on done             */
  _Alignas(64) _Atomic int n_sleeping; /* workers blocked on gen                */
  _Atomic uint32_t quiet_until;        /* no spinning before this generation    */
  _Atomic bool stop;
  preempt_watch caller_watch;          /* the submitting thread's               */
  /* The current job: written by the caller before the claim word. */
  rlm_range_fn fn;
  void *ctx;
  int64_t n;
  int64_t chunk;                 /* items per chunk (grain-aligned)      */
};

struct pool_worker {
  rlm_pool *pool;
  int ith;             /* 1..n_threads-1; the caller is 0 */
  preempt_watch watch; /* this worker's                   */
};

int rlm__cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w, int n) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static uint64_t claim_word(uint32_t gen, uint32_t n_chunks, uint32_t next) {
  return (uint64_t)gen << 32 | (uint64_t)n_chunks << 16 | next;
}

static long preemptions(void) {
  struct rusage ru;
  return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

/* Every CHECK_JOBS jobs of one thread: if it was preempted, no worker
 * spins for the next QUIET_JOBS jobs. */
static void watch_preemption(rlm_pool *p, preempt_watch *w, uint32_t gen) {
  if (++w->jobs % CHECK_JOBS) return;
  const long n = preemptions();
  if (n - w->nivcsw >= PREEMPT_LIMIT)
    atomic_store_explicit(&p->quiet_until, gen + QUIET_JOBS, memory_order_relaxed);
  w->nivcsw = n;
}

static bool may_spin(const rlm_pool *p, uint32_t gen) {
  const uint32_t q = atomic_load_explicit(&p->quiet_until, memory_order_relaxed);
  return p->spin && (int32_t)(gen - q) >= 0;
}

/* Claims and runs chunks of job `gen` until none is left; as thread ith. */
static void work(rlm_pool *p, uint32_t gen, int ith) {
  uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
  for (;;) {
    const uint32_t n_chunks = (uint32_t)(v >> 16) & 0xffff, next = (uint32_t)v & 0xffff;
    if ((uint32_t)(v >> 32) != gen || next >= n_chunks) return;
    if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acquire,
                                               memory_order_acquire))
      continue; /* v now holds the word that beat us */
    const int64_t i0 = (int64_t)next * p->chunk;
    const int64_t i1 = RLM_MIN(p->n, i0 + p->chunk);
    if (i0 < i1) p->fn(p->ctx, i0, i1, ith, p->n_threads);
    /* seq_cst: pairs with the caller's caller_sleeping store and re-read. */
    if (atomic_fetch_add(&p->done, 1) + 1 == n_chunks && atomic_load(&p->caller_sleeping))
      futex_wake(&p->done, 1);
    v = atomic_load_explicit(&p->claim, memory_order_acquire);
  }
}

/* Waits for a generation other than `seen`; returns it. */
static uint32_t worker_wait(rlm_pool *p, uint32_t seen) {
  const int spin = may_spin(p, seen) ? SPIN_ITERS : 0;
  for (int i = 0; i < spin; i++) {
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
    cpu_relax();
  }
  uint32_t g;
  atomic_fetch_add(&p->n_sleeping, 1);
  while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) futex_wait(&p->gen, seen);
  atomic_fetch_sub(&p->n_sleeping, 1);
  return g;
}

static void *worker_main(void *arg) {
  struct pool_worker *w = arg;
  rlm_pool *p = w->pool;
  uint32_t seen = 0;
  w->watch.nivcsw = preemptions();
  for (;;) {
    seen = worker_wait(p, seen);
    if (atomic_load(&p->stop)) break;
    work(p, seen, w->ith);
    watch_preemption(p, &w->watch, seen);
  }
  return NULL;
}

/* The caller, after its own claims: until every chunk is done. */
static void caller_wait(rlm_pool *p, uint32_t n_chunks) {
  for (int i = 0; i < SPIN_ITERS; i++) {
    if (atomic_load_explicit(&p->done, memory_order_acquire) == n_chunks) return;
    cpu_relax();
  }
  atomic_store(&p->caller_sleeping, 1);
  uint32_t d;
  while ((d = atomic_load(&p->done)) != n_chunks) futex_wait(&p->done, d);
  atomic_store(&p->caller_sleeping, 0);
}

static void stop_workers(rlm_pool *p, int n_started) {
  atomic_store(&p->stop, true);
  atomic_fetch_add(&p->gen, 1);
  futex_wake(&p->gen, INT_MAX);
  for (int i = 0; i < n_started; i++) pthread_join(p->threads[i], NULL);
}

rlm_status rlm__pool_create(rlm_pool **out, int n_threads, rlm_error *err) {
  *out = NULL;
  if (n_threads <= 0) n_threads = rlm__cpu_physical();
  if (n_threads > 1024)
    return rlm__err(err, RLM_ERR_INVALID, "thread pool: %d threads is too many", n_threads);
  rlm_pool *p = rlm__calloc(1, sizeof *p);
  if (!p) return rlm__err_nomem(err, "thread pool", sizeof *p);
  p->n_threads = n_threads;
  p->caller_watch.nivcsw = preemptions(); /* the creator submits, as a rule */
  p->n_cpus = rlm_cpu_info_get().n_available;
  p->spin = n_threads <= p->n_cpus;
  const int nw = n_threads - 1;
  if (nw > 0) {
    p->threads = rlm__calloc((size_t)nw, sizeof *p->threads);
    p->workers = rlm__calloc((size_t)nw, sizeof *p->workers);
    if (!p->threads || !p->workers) goto out_free_pool;
  }
  for (int i = 0; i < nw; i++) {
    p->workers[i] = (struct pool_worker){.pool = p, .ith = i + 1};
    if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]) != 0) {
      stop_workers(p, i);
      rlm__free(p->threads);
      rlm__free(p->workers);
      rlm__free(p);
      return rlm__err(err, RLM_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i + 1, nw);
    }
  }
  *out = p;
  return RLM_OK;
out_free_pool:
  rlm__free(p->threads);
  rlm__free(p->workers);
  rlm__free(p);
  return rlm__err_nomem(err, "thread pool", (size_t)nw * sizeof(pthread_t));
}

void rlm__pool_free(rlm_pool *p) {
  if (!p) return;
  stop_workers(p, p->n_threads - 1);
  rlm__free(p->threads);
  rlm__free(p->workers);
  rlm__free(p);
}

int rlm__pool_size(const rlm_pool *p) { return p ? p->n_threads : 1; }

int rlm__pool_threads_for(const rlm_pool *p, double work) {
  /* More threads than CPUs cannot run at once: waking them per job only
   * adds wake-ups and time slices to wait for (-t 8 on 2 CPUs ran the 15M
   * model at 0.58x -t 2 before this cap). */
  const int size = p ? RLM_MIN(p->n_threads, p->n_cpus) : 1;
  if (work <= 0) return size; /* unknown: as wide as the pool */
  const double useful = work / RLM_POOL_MIN_WORK;
  return useful >= size ? size : RLM_MAX(1, (int)useful);
}

void rlm__pool_for(rlm_pool *p, int64_t n, int64_t grain, double item_work, rlm_range_fn fn,
                   void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t n_grains = (n + grain - 1) / grain;
  const int nth = (int)RLM_MIN((int64_t)rlm__pool_threads_for(p, item_work * (double)n), n_grains);
  if (nth <= 1) {
    fn(ctx, 0, n, 0, 1);
    return;
  }
  const uint32_t gen = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
  const int64_t per_thread = may_spin(p, gen) ? 1 : CHUNKS_PER_THREAD;
  const int64_t n_chunks = RLM_MIN(RLM_MIN(n_grains, (int64_t)nth * per_thread), MAX_CHUNKS);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n_grains + n_chunks - 1) / n_chunks * grain;
  const uint32_t chunks = (uint32_t)((n + p->chunk - 1) / p->chunk);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->claim, claim_word(gen, chunks, 0), memory_order_release);
  atomic_store(&p->gen, gen); /* seq_cst: pairs with the sleepers' count */
  const int sleeping = atomic_load(&p->n_sleeping);
  if (sleeping > 0) futex_wake(&p->gen, RLM_MIN(sleeping, nth - 1));
  work(p, gen, 0);
  caller_wait(p, chunks);
  watch_preemption(p, &p->caller_watch, gen);
}
