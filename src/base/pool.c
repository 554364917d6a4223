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
 * Sharing. The workers live in a core; what kernels hold is a handle onto
 * it: {core, the handle's threads per job, its caller's preemption watch}.
 * rlm__pool_create makes a private core with its one handle (quantize,
 * tests, benches). rlm__pool_acquire hands out handles onto ONE core per
 * process, so that a target model and its draft, or a server's streams,
 * do not each run a pool of spinning workers on the same cores. That core
 * has as many threads as the largest live handle asked for: it starts
 * workers when a larger handle comes, joins them when the largest goes
 * (idle workers would still wake and spin after every job), and is freed
 * with its last handle. A job through a handle of n threads runs on at
 * most n of them (-t 1 stays on its caller): a job narrower than the core
 * hands out seats, a worker that finds it takes its ith from a counter
 * and leaves if none is left, so ith stays unique and below nth; a job as
 * wide as the core needs no counter, each worker is its own ith.
 *
 * Callers: jobs through handles of one core, from any threads, run one
 * at a time (the core's submit mutex, held for the whole job; a second
 * submitter sleeps in it, it does not spin). So at most the core's
 * workers and one submitter work on jobs at once, and the claim word
 * never sees two jobs. Work that stays inline (one thread's worth) takes
 * no lock: it is its caller's thread working, not the pool's. A job
 * submitted from inside a job of the same core (nothing does this today:
 * the kernels a job runs take no pool) runs inline, where waiting for the
 * mutex would deadlock. Two sessions with handles of 4 on 8 cores thus
 * take turns on 4 cores rather than using all 8: sharing is for the case
 * where the cores are oversubscribed, which is the common one here.
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

typedef struct pool_core pool_core;

/* What kernels hold. Its fields are fixed from create/acquire on, but
 * caller_watch, written under the core's submit mutex. */
struct rlm_pool {
  pool_core *core;
  int n_threads;              /* most threads per job, the caller's included */
  int n_cpus;                 /* the core's, read without going through it   */
  bool shared;                /* from rlm__pool_acquire: released, not freed */
  rlm_pool *next;             /* the shared core's next handle               */
  preempt_watch caller_watch; /* its submitting thread's                     */
};

struct pool_worker {
  pool_core *core;
  int ith;             /* 1..n_threads-1; the caller is 0     */
  uint32_t start_gen;  /* the generation when it was started  */
  preempt_watch watch; /* this worker's                       */
};

/* The workers and the one job in flight. n_threads, threads and workers
 * change only with submit held (and, for the shared core, the registry
 * lock); the job's fields only with submit held, before the claim word. */
struct pool_core {
  int n_threads;                 /* workers + the calling thread           */
  int cap;                       /* threads the arrays have room for       */
  int n_cpus;                    /* CPUs of the affinity mask: the most
                                    threads one job wakes                  */
  pthread_t *threads;            /* [cap - 1]                              */
  struct pool_worker *workers;   /* [cap - 1]                              */
  pthread_mutex_t submit;        /* held by the caller of the job in flight */
  rlm_pool own;                  /* a private core's handle                */
  _Atomic bool spin;             /* a core per thread: idle workers spin   */
  _Alignas(64) _Atomic uint32_t gen;   /* futex word of the workers: +1 per job */
  _Alignas(64) _Atomic uint64_t claim; /* gen << 32 | n_chunks << 16 | next     */
  _Alignas(64) _Atomic uint32_t done;  /* chunks finished; futex word of caller */
  _Atomic int caller_sleeping;         /* the caller blocks on done             */
  _Atomic int seat_cap;                /* 0: every worker may join, as its own
                                          ith; else seats of the job           */
  _Atomic int seats;                   /* next seat (ith) to hand out           */
  _Alignas(64) _Atomic int n_sleeping; /* workers blocked on gen                */
  _Atomic uint32_t quiet_until;        /* no spinning before this generation    */
  _Atomic int n_keep;                  /* workers of ith >= n_keep leave        */
  /* The current job: written by the caller before the claim word. */
  rlm_range_fn fn;
  void *ctx;
  int64_t n;
  int64_t chunk;                 /* items per chunk (grain-aligned)        */
  int nth;                       /* fn's nth: the submitting handle's size */
};

/* The process's shared core and its handles. Global by necessity: the
 * point is one set of workers however many sessions there are. */
static pthread_mutex_t g_shared_lock = PTHREAD_MUTEX_INITIALIZER;
static pool_core *g_shared;        /* under g_shared_lock */
static rlm_pool *g_shared_handles; /* its live handles; under g_shared_lock */
static _Atomic int g_live_workers; /* started, not yet joined: all cores */

/* The core whose job this thread is running (a worker: its own core). */
static _Thread_local pool_core *tls_core;

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

/* Whether claim word v is job gen with chunks left to claim. */
static bool claim_open(uint64_t v, uint32_t gen) {
  return (uint32_t)(v >> 32) == gen && ((uint32_t)v & 0xffff) < ((uint32_t)(v >> 16) & 0xffff);
}

static long preemptions(void) {
  struct rusage ru;
  return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

/* Every CHECK_JOBS jobs of one thread: if it was preempted, no worker
 * spins for the next QUIET_JOBS jobs. */
static void watch_preemption(pool_core *c, preempt_watch *w, uint32_t gen) {
  if (++w->jobs % CHECK_JOBS) return;
  const long n = preemptions();
  if (n - w->nivcsw >= PREEMPT_LIMIT)
    atomic_store_explicit(&c->quiet_until, gen + QUIET_JOBS, memory_order_relaxed);
  w->nivcsw = n;
}

static bool may_spin(pool_core *c, uint32_t gen) {
  const uint32_t q = atomic_load_explicit(&c->quiet_until, memory_order_relaxed);
  return atomic_load_explicit(&c->spin, memory_order_relaxed) && (int32_t)(gen - q) >= 0;
}

/* A worker's ith in the job it just found open: its own, or a seat when
 * the job is narrower than the core; -1 when no seat is left. Read before
 * any claim, these may already be a newer job's (the found one ended in
 * between): the seat is then wasted, and the claim fails on the
 * generation, so nothing runs on it. */
static int take_seat(pool_core *c, int ith) {
  const int cap = atomic_load_explicit(&c->seat_cap, memory_order_relaxed);
  if (!cap) return ith;
  const int seat = atomic_fetch_add_explicit(&c->seats, 1, memory_order_relaxed);
  return seat < cap ? seat : -1;
}

/* Claims and runs chunks of job `gen` until none is left; as thread ith
 * (0: the caller, which needs no seat). */
static void work(pool_core *c, uint32_t gen, int ith) {
  uint64_t v = atomic_load_explicit(&c->claim, memory_order_acquire);
  if (!claim_open(v, gen) || (ith > 0 && (ith = take_seat(c, ith)) < 0)) return;
  for (;;) {
    const uint32_t n_chunks = (uint32_t)(v >> 16) & 0xffff, next = (uint32_t)v & 0xffff;
    if (!claim_open(v, gen)) return;
    if (!atomic_compare_exchange_weak_explicit(&c->claim, &v, v + 1, memory_order_acquire,
                                               memory_order_acquire))
      continue; /* v now holds the word that beat us */
    const int64_t i0 = (int64_t)next * c->chunk;
    const int64_t i1 = RLM_MIN(c->n, i0 + c->chunk);
    if (i0 < i1) c->fn(c->ctx, i0, i1, ith, c->nth);
    /* seq_cst: pairs with the caller's caller_sleeping store and re-read. */
    if (atomic_fetch_add(&c->done, 1) + 1 == n_chunks && atomic_load(&c->caller_sleeping))
      futex_wake(&c->done, 1);
    v = atomic_load_explicit(&c->claim, memory_order_acquire);
  }
}

static bool leaving(pool_core *c, int ith) {
  return ith >= atomic_load_explicit(&c->n_keep, memory_order_relaxed);
}

/* Waits for a generation other than `seen`; returns it. */
static uint32_t worker_wait(pool_core *c, uint32_t seen, int ith) {
  const int spin = may_spin(c, seen) ? SPIN_ITERS : 0;
  for (int i = 0; i < spin; i++) {
    uint32_t g = atomic_load_explicit(&c->gen, memory_order_acquire);
    if (g != seen || leaving(c, ith)) return g;
    cpu_relax();
  }
  uint32_t g;
  atomic_fetch_add(&c->n_sleeping, 1);
  while ((g = atomic_load(&c->gen)) == seen && !leaving(c, ith)) futex_wait(&c->gen, seen);
  atomic_fetch_sub(&c->n_sleeping, 1);
  return g;
}

static void *worker_main(void *arg) {
  struct pool_worker *w = arg;
  pool_core *c = w->core;
  uint32_t seen = w->start_gen;
  tls_core = c;
  w->watch.nivcsw = preemptions();
  for (;;) {
    seen = worker_wait(c, seen, w->ith);
    if (leaving(c, w->ith)) break;
    work(c, seen, w->ith);
    watch_preemption(c, &w->watch, seen);
  }
  return NULL;
}

/* The caller, after its own claims: until every chunk is done. */
static void caller_wait(pool_core *c, uint32_t n_chunks) {
  for (int i = 0; i < SPIN_ITERS; i++) {
    if (atomic_load_explicit(&c->done, memory_order_acquire) == n_chunks) return;
    cpu_relax();
  }
  atomic_store(&c->caller_sleeping, 1);
  uint32_t d;
  while ((d = atomic_load(&c->done)) != n_chunks) futex_wait(&c->done, d);
  atomic_store(&c->caller_sleeping, 0);
}

/* Starts workers up to n_threads in all (at most the arrays' room). On a
 * failure the workers started so far stay and count. */
static rlm_status core_grow(pool_core *c, int n_threads, rlm_error *err) {
  if (!RLM_CHECK(n_threads <= c->cap))
    return rlm__err(err, RLM_ERR_INTERNAL, "thread pool: %d threads in room for %d", n_threads, c->cap);
  const uint32_t gen = atomic_load(&c->gen);
  for (int i = c->n_threads - 1; i < n_threads - 1; i++) {
    c->workers[i] = (struct pool_worker){.core = c, .ith = i + 1, .start_gen = gen};
    if (pthread_create(&c->threads[i], NULL, worker_main, &c->workers[i]) != 0)
      return rlm__err(err, RLM_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i + 2,
                      n_threads);
    c->n_threads = i + 2;
    atomic_fetch_add(&g_live_workers, 1);
    /* More threads than CPUs: spinning would take a core from one at work. */
    atomic_store_explicit(&c->spin, c->n_threads <= c->n_cpus, memory_order_relaxed);
  }
  return RLM_OK;
}

/* Stops and joins the workers from ith n_threads on; with no job in
 * flight. The new generation wakes the sleepers (a wake alone could come
 * between a sleeper's look at n_keep and its futex wait) and carries no
 * job: its claim word is the last job's, finished. */
static void core_shrink(pool_core *c, int n_threads) {
  atomic_store(&c->n_keep, n_threads);
  atomic_fetch_add(&c->gen, 1);
  futex_wake(&c->gen, INT_MAX);
  for (int i = n_threads - 1; i < c->n_threads - 1; i++) {
    pthread_join(c->threads[i], NULL);
    atomic_fetch_sub(&g_live_workers, 1);
  }
  c->n_threads = RLM_MIN(c->n_threads, n_threads);
  atomic_store(&c->n_keep, INT_MAX);
  atomic_store_explicit(&c->spin, c->n_threads <= c->n_cpus, memory_order_relaxed);
}

static void core_free(pool_core *c) {
  if (!c) return;
  core_shrink(c, 1);
  pthread_mutex_destroy(&c->submit);
  rlm__free(c->threads);
  rlm__free(c->workers);
  rlm__free(c);
}

static void handle_init(rlm_pool *h, pool_core *c, int n_threads, bool shared) {
  *h = (rlm_pool){.core = c, .n_threads = n_threads, .n_cpus = c->n_cpus, .shared = shared};
  h->caller_watch.nivcsw = preemptions(); /* the creator submits, as a rule */
}

/* A core with room for cap threads, running n_threads of them. */
static rlm_status core_create(pool_core **out, int cap, int n_threads, rlm_error *err) {
  *out = NULL;
  pool_core *c = rlm__calloc(1, sizeof *c);
  if (!c) return rlm__err_nomem(err, "thread pool", sizeof *c);
  c->n_threads = 1;
  c->cap = cap;
  c->n_cpus = rlm_cpu_info_get().n_available;
  atomic_store(&c->spin, true);
  atomic_store(&c->n_keep, INT_MAX);
  if (pthread_mutex_init(&c->submit, NULL) != 0) {
    rlm__free(c);
    return rlm__err(err, RLM_ERR_NOMEM, "thread pool: cannot make its mutex");
  }
  if (cap > 1) {
    c->threads = rlm__calloc((size_t)cap - 1, sizeof *c->threads);
    c->workers = rlm__calloc((size_t)cap - 1, sizeof *c->workers);
    if (!c->threads || !c->workers) {
      core_free(c);
      return rlm__err_nomem(err, "thread pool", (size_t)cap * sizeof *c->workers);
    }
  }
  rlm_status rc = core_grow(c, n_threads, err);
  if (rc) {
    core_free(c);
    return rc;
  }
  *out = c;
  return RLM_OK;
}

static rlm_status check_threads(int *n_threads, rlm_error *err) {
  if (*n_threads <= 0) *n_threads = rlm__cpu_physical();
  if (*n_threads > RLM_POOL_MAX_THREADS)
    return rlm__err(err, RLM_ERR_INVALID, "thread pool: %d threads is too many", *n_threads);
  return RLM_OK;
}

rlm_status rlm__pool_create(rlm_pool **out, int n_threads, rlm_error *err) {
  *out = NULL;
  rlm_status rc = check_threads(&n_threads, err);
  pool_core *c;
  if (rc || (rc = core_create(&c, n_threads, n_threads, err))) return rc;
  handle_init(&c->own, c, n_threads, false);
  *out = &c->own;
  return RLM_OK;
}

void rlm__pool_free(rlm_pool *p) {
  if (p && p->shared) rlm__pool_release(p);
  else if (p) core_free(p->core);
}

/* The shared core, made or grown to n_threads; under g_shared_lock. */
static rlm_status shared_core(int n_threads, rlm_error *err) {
  if (!g_shared) return core_create(&g_shared, RLM_POOL_MAX_THREADS, n_threads, err);
  if (n_threads <= g_shared->n_threads) return RLM_OK;
  pthread_mutex_lock(&g_shared->submit); /* no job sees the core change */
  const rlm_status rc = core_grow(g_shared, n_threads, err);
  pthread_mutex_unlock(&g_shared->submit);
  return rc;
}

rlm_status rlm__pool_acquire(rlm_pool **out, int n_threads, rlm_error *err) {
  *out = NULL;
  rlm_status rc = check_threads(&n_threads, err);
  if (rc) return rc;
  rlm_pool *h = rlm__calloc(1, sizeof *h);
  if (!h) return rlm__err_nomem(err, "thread pool handle", sizeof *h);
  pthread_mutex_lock(&g_shared_lock);
  rc = shared_core(n_threads, err);
  if (!rc) {
    handle_init(h, g_shared, n_threads, true);
    h->next = g_shared_handles;
    g_shared_handles = h;
  }
  pthread_mutex_unlock(&g_shared_lock);
  if (rc) {
    rlm__free(h);
    return rc;
  }
  *out = h;
  return RLM_OK;
}

/* Unlinks h; stops the workers no live handle needs any more (all, with
 * the last). Under g_shared_lock. */
static void shared_drop(rlm_pool *h) {
  int most = 0;
  for (rlm_pool **l = &g_shared_handles; *l;) {
    if (*l == h) {
      *l = h->next;
      continue;
    }
    most = RLM_MAX(most, (*l)->n_threads);
    l = &(*l)->next;
  }
  if (!g_shared_handles) {
    core_free(g_shared);
    g_shared = NULL;
  } else if (most < g_shared->n_threads) {
    pthread_mutex_lock(&g_shared->submit); /* the job in flight ends first */
    core_shrink(g_shared, most);
    pthread_mutex_unlock(&g_shared->submit);
  }
}

void rlm__pool_release(rlm_pool *p) {
  if (!p) return;
  if (!p->shared) {
    rlm__pool_free(p);
    return;
  }
  pthread_mutex_lock(&g_shared_lock);
  shared_drop(p);
  pthread_mutex_unlock(&g_shared_lock);
  rlm__free(p);
}

int rlm__pool_size(const rlm_pool *p) { return p ? p->n_threads : 1; }

int rlm__pool_workers(const rlm_pool *p) {
  if (!p) return 0;
  pthread_mutex_lock(&p->core->submit);
  const int n = p->core->n_threads - 1;
  pthread_mutex_unlock(&p->core->submit);
  return n;
}

int rlm__pool_live_workers(void) { return atomic_load(&g_live_workers); }

int rlm__pool_threads_for(const rlm_pool *p, double work) {
  /* More threads than CPUs cannot run at once: waking them per job only
   * adds wake-ups and time slices to wait for (-t 8 on 2 CPUs ran the 15M
   * model at 0.58x -t 2 before this cap). */
  const int size = p ? RLM_MIN(p->n_threads, p->n_cpus) : 1;
  if (work <= 0) return size; /* unknown: as wide as the pool */
  const double useful = work / RLM_POOL_MIN_WORK;
  return useful >= size ? size : RLM_MAX(1, (int)useful);
}

/* One job of nth threads through handle p; with c->submit held. */
static void run_job(rlm_pool *p, int nth, int64_t n, int64_t grain, rlm_range_fn fn, void *ctx) {
  pool_core *c = p->core;
  const int64_t n_grains = (n + grain - 1) / grain;
  const uint32_t gen = atomic_load_explicit(&c->gen, memory_order_relaxed) + 1;
  const int64_t per_thread = may_spin(c, gen) ? 1 : CHUNKS_PER_THREAD;
  const int64_t n_chunks = RLM_MIN(RLM_MIN(n_grains, (int64_t)nth * per_thread), MAX_CHUNKS);
  c->fn = fn;
  c->ctx = ctx;
  c->n = n;
  c->nth = p->n_threads;
  c->chunk = (n_grains + n_chunks - 1) / n_chunks * grain;
  const uint32_t chunks = (uint32_t)((n + c->chunk - 1) / c->chunk);
  atomic_store_explicit(&c->seat_cap, nth < c->n_threads ? nth : 0, memory_order_relaxed);
  atomic_store_explicit(&c->seats, 1, memory_order_relaxed);
  atomic_store_explicit(&c->done, 0, memory_order_relaxed);
  atomic_store_explicit(&c->claim, claim_word(gen, chunks, 0), memory_order_release);
  atomic_store(&c->gen, gen); /* seq_cst: pairs with the sleepers' count */
  const int sleeping = atomic_load(&c->n_sleeping);
  if (sleeping > 0) futex_wake(&c->gen, RLM_MIN(sleeping, nth - 1));
  work(c, gen, 0);
  caller_wait(c, chunks);
  watch_preemption(c, &p->caller_watch, gen);
}

void rlm__pool_for(rlm_pool *p, int64_t n, int64_t grain, double item_work, rlm_range_fn fn,
                   void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t n_grains = (n + grain - 1) / grain;
  const int nth = (int)RLM_MIN((int64_t)rlm__pool_threads_for(p, item_work * (double)n), n_grains);
  /* Inside a job of this core (nested): the mutex is ours or awaits us. */
  if (nth <= 1 || tls_core == p->core) {
    fn(ctx, 0, n, 0, 1);
    return;
  }
  pool_core *c = p->core, *outer = tls_core; /* outer: a job of another core */
  pthread_mutex_lock(&c->submit);
  tls_core = c;
  run_job(p, nth, n, grain, fn, ctx);
  tls_core = outer;
  pthread_mutex_unlock(&c->submit);
}
