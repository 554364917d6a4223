/* base.h -- the bottom layer: error detail, logging, arenas, files, the
 * thread pool, JSON. It knows nothing of tensors or models; everything else
 * in src/ may include it. Read ringlm.h first for the status conventions.
 *
 * Internal (non-static) functions are prefixed rlm__; they are hidden in the
 * shared library and reachable from the static one (tests link that).
 */
#ifndef RLM_BASE_H
#define RLM_BASE_H

#include "ringlm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RLM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define RLM_UNUSED(x) ((void)(x))
#define RLM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define RLM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Invariant checks: a broken invariant is a bug in ringlm, not bad input.
 * The library never ends the process, so a failed check logs the location,
 * counts it (rlm__assert_failures: the test harness fails on any) and
 * yields false, so the caller can refuse (RLM_ERR_INTERNAL) or skip the
 * work instead of corrupting memory. Input validation never uses this --
 * it returns RLM_ERR_INVALID. */
#define RLM_CHECK(c) ((c) ? true : rlm__assert_fail(#c, __FILE__, __LINE__))
#define RLM_ASSERT(c) ((void)RLM_CHECK(c))
bool rlm__assert_fail(const char *expr, const char *file, int line);
/* How many invariant checks have failed in this process. */
unsigned long rlm__assert_failures(void);

/* ------------------------------------------------------------------------
 * Error detail (status.c).
 * rlm__err sets err (if not NULL) and returns code, so call sites read
 *   return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s': ...", path, name);
 * rlm__err_prefix prepends context ("file.safetensors: ") to a message that
 * a lower layer already wrote, keeping the code.
 * ---------------------------------------------------------------------- */
rlm_status rlm__err(rlm_error *err, rlm_status code, const char *fmt, ...)
    RLM_PRINTF(3, 4);
rlm_status rlm__err_nomem(rlm_error *err, const char *what, size_t bytes);

/* ------------------------------------------------------------------------
 * Logging (log.c). Quiet by default; see rlm_log_set.
 * ---------------------------------------------------------------------- */
void rlm__log(rlm_log_level level, const char *fmt, ...) RLM_PRINTF(2, 3);
bool rlm__log_enabled(rlm_log_level level);
#define RLM_LOGE(...) rlm__log(RLM_LOG_ERROR, __VA_ARGS__)
#define RLM_LOGW(...) rlm__log(RLM_LOG_WARN, __VA_ARGS__)
#define RLM_LOGI(...) rlm__log(RLM_LOG_INFO, __VA_ARGS__)
#define RLM_LOGD(...) rlm__log(RLM_LOG_DEBUG, __VA_ARGS__)

/* ------------------------------------------------------------------------
 * Heap allocation with a counter (arena.c). Everything in the library
 * allocates through these so that tests can (a) count allocations made in
 * a region that must not allocate -- the decode loop -- and (b) fail the
 * N-th allocation to walk every error path.
 * ---------------------------------------------------------------------- */
void *rlm__malloc(size_t n);
void *rlm__calloc(size_t count, size_t size);
void *rlm__realloc(void *p, size_t n);
void rlm__free(void *p);
char *rlm__strdup(const char *s);
uint64_t rlm__alloc_count(void);       /* injection points so far (all threads):
                                          every allocation, a soft region once */
void rlm__alloc_fail_at(int64_t nth);  /* fail the nth from now; <0 = off  */
/* Soft region (nests): an injected failure is counted in
 * rlm_alloc_failures() but the memory is still handed out. Only around a
 * jansson parse, whose lexer writes out of bounds when an allocation
 * fails (akheron/jansson#362, unfixed in 2.14): the parse is then reported
 * as out of memory without jansson ever seeing NULL. A region is one
 * injection point, its first allocation: any failure in it has the same
 * effect, and a sweep over a 500 KB tokenizer.json's 10^5 allocations,
 * each reloading it, would take hours. */
void rlm__alloc_soft(bool on);

/* Arena: bump allocation from large blocks, freed all at once. Used for
 * per-call scratch (reset, not freed, between calls) and for parsed
 * metadata whose lifetime is the owning handle's. Not thread-safe. */
typedef struct rlm_arena rlm_arena;
struct rlm_arena {
  struct rlm_arena_block *head; /* newest block first                     */
  size_t block_size;            /* default size of a new block            */
  size_t used_total;            /* bytes handed out since the last reset  */
};

void rlm__arena_init(rlm_arena *a, size_t block_size);
/* 16-byte aligned, zeroed; NULL if out of memory. */
void *rlm__arena_alloc(rlm_arena *a, size_t n);
void *rlm__arena_alloc_aligned(rlm_arena *a, size_t n, size_t align);
char *rlm__arena_strndup(rlm_arena *a, const char *s, size_t n);
/* Keeps the first block, drops the rest, so a steady-state user stops
 * allocating once the first block is large enough. */
void rlm__arena_reset(rlm_arena *a);
void rlm__arena_free(rlm_arena *a);

/* ------------------------------------------------------------------------
 * Files (file.c).
 * ---------------------------------------------------------------------- */
typedef struct rlm_mapped_file {
  const uint8_t *data; /* read-only mapping, NULL for an empty file */
  size_t size;
  char *path;          /* owned copy, for error messages           */
} rlm_mapped_file;

rlm_status rlm__file_map(rlm_mapped_file *f, const char *path, rlm_error *err);
void rlm__file_unmap(rlm_mapped_file *f);
/* Whole file into a NUL-terminated heap buffer (config files). */
rlm_status rlm__file_read_all(const char *path, char **out, size_t *len,
                              rlm_error *err);
bool rlm__path_is_dir(const char *path);
bool rlm__path_exists(const char *path);
/* dir + "/" + name into a new heap string; NULL if out of memory. */
char *rlm__path_join(const char *dir, const char *name);
/* mkdir -p of one level (the parent must exist); ok if it exists. */
rlm_status rlm__mkdir(const char *path, rlm_error *err);
rlm_status rlm__file_copy(const char *src, const char *dst, rlm_error *err);

/* Atomic write: data goes to "<path>.tmp.<pid>", is fsync'd, renamed over
 * path, and the folder is fsync'd, so a crash leaves either the old file
 * or the new one, and a commit that returned is durable. On any failure
 * the temporary file is removed and path is untouched. */
typedef struct rlm_file_writer {
  int fd;
  char *path;     /* final name            */
  char *tmp_path; /* name while writing    */
  uint64_t written;
} rlm_file_writer;

rlm_status rlm__writer_open(rlm_file_writer *w, const char *path,
                            rlm_error *err);
rlm_status rlm__writer_write(rlm_file_writer *w, const void *p, size_t n,
                             rlm_error *err);
rlm_status rlm__writer_commit(rlm_file_writer *w, rlm_error *err);
void rlm__writer_abort(rlm_file_writer *w); /* removes the temp file */
/* The whole of buf as path, through the writer above. */
rlm_status rlm__file_write_atomic(const char *path, const void *buf, size_t n, rlm_error *err);
/* Fault injection (tests): the nth write or fsync from now (0: the next)
 * of every rlm_file_writer fails with errno e (ENOSPC, EIO); n < 0: off. */
void rlm__io_fail_at(int64_t nth, int e);

/* Checksums (checksum.c). FNV-1a 64 of data continuing h (RLM_FNV_START
 * to start); CRC-32C of data continuing `crc` (0 to start). */
#define RLM_FNV_START 1469598103934665603ull
uint64_t rlm__fnv1a64(uint64_t h, const void *data, size_t n);
uint32_t rlm__crc32c(uint32_t crc, const void *data, size_t n);
uint32_t rlm__crc32c_ref(uint32_t crc, const void *data, size_t n); /* bitwise */

/* ------------------------------------------------------------------------
 * Thread pool (pool.c). A fixed set of workers created once; work is a
 * parallel-for over [0, n) cut into contiguous chunks that the threads,
 * the caller's included, claim as they come, so a thread the kernel has
 * not scheduled holds nothing up. Workers spin briefly, then block on a
 * futex (no spinning at all when threads outnumber the CPUs), so
 * back-to-back calls in decode cost no system calls. Work too small to
 * pay for waking a thread stays on the caller's.
 * A pool is a handle onto a set of workers: a private one
 * (rlm__pool_create) or the one the process shares (rlm__pool_acquire,
 * for sessions). Any threads may submit through any handles: the jobs of
 * one set of workers run one at a time, a submitter waits (sleeping) for
 * the job before its own. A job submitted from inside a job of the same
 * workers runs inline on its thread.
 * ---------------------------------------------------------------------- */
typedef struct rlm_pool rlm_pool;

/* fn processes [i0, i1) on thread ith (0 = the caller) of the pool's nth
 * (its rlm__pool_size; 1 when run inline); ith is unique among the threads
 * of one job, but a worker's ith may change from job to job. One thread
 * may get several ranges of a job, so ith may index per-thread scratch
 * but not per-range results. */
typedef void (*rlm_range_fn)(void *ctx, int64_t i0, int64_t i1, int ith,
                             int nth);

/* Multiply-adds (or equally cheap steps) a thread must get to be worth
 * waking: ~0.5 us of a 4-bit decode product, about what a hand-off to a
 * spinning worker costs (the 15M model's 128 x 384 K/V products split
 * in two measured level with splitting everything; 64k lost 3%). */
#define RLM_POOL_MIN_WORK 16384.0

/* Threads one pool may have, the caller's included. */
#define RLM_POOL_MAX_THREADS 1024

/* A private pool of n_threads (<= 0: the physical cores, rlm__cpu_physical),
 * its workers started here and joined by rlm__pool_free. */
rlm_status rlm__pool_create(rlm_pool **out, int n_threads, rlm_error *err);
void rlm__pool_free(rlm_pool *p); /* NULL ok; an acquired handle: released */
/* A handle onto the process's shared workers, started by the first
 * acquire and joined by the last release. They number the largest
 * n_threads (<= 0: the physical cores) of the live handles, less the
 * caller's: an acquire asking more starts more, waiting for the job in
 * flight. A job through the handle uses at most its n_threads. Thread-safe;
 * not from inside a job. */
rlm_status rlm__pool_acquire(rlm_pool **out, int n_threads, rlm_error *err);
void rlm__pool_release(rlm_pool *p); /* NULL ok; a private pool: freed */
/* Most threads per job, the caller's included (1 for NULL): the n_threads
 * the handle was made with, however many workers it shares. */
int rlm__pool_size(const rlm_pool *p);
/* Worker threads behind the handle, shared ones included (0 for NULL). */
int rlm__pool_workers(const rlm_pool *p);
/* Worker threads of all pools of the process, started and not yet joined. */
int rlm__pool_live_workers(void);
/* Threads worth using for `work` multiply-adds in all (<= 0: unknown, the
 * whole pool): at least 1, at most the pool's size and the CPUs of the
 * affinity mask (threads beyond them cannot run at once). */
int rlm__pool_threads_for(const rlm_pool *p, double work);
/* Runs fn over [0, n) in chunks whose bounds are multiples of `grain`
 * (except the last), on up to rlm__pool_threads_for(p, n * item_work)
 * threads; returns when all are done. pool may be NULL: runs inline. */
void rlm__pool_for(rlm_pool *p, int64_t n, int64_t grain, double item_work,
                   rlm_range_fn fn, void *ctx);
int rlm__cpu_count(void);    /* online logical CPUs */
int rlm__cpu_physical(void); /* physical cores of the affinity mask */

/* ------------------------------------------------------------------------
 * Vector instruction sets (cpu.c), OS support included; false off x86-64.
 * ---------------------------------------------------------------------- */
bool rlm__cpu_avx2(void);        /* AVX2, FMA, F16C                     */
bool rlm__cpu_avx512(void);      /* and AVX-512 F, BW, VL, DQ           */
bool rlm__cpu_avx512_vnni(void); /* and AVX-512 VNNI                    */
bool rlm__cpu_amx_int8(void);    /* and AMX tiles, int8, granted by the OS */
bool rlm__cpu_vnni_panels(void); /* VNNI, and the panel kernel not turned off (RINGLM_NO_PANEL=1) */

/* ------------------------------------------------------------------------
 * JSON (json.c) over jansson. Parse errors name the file, line and column.
 *
 * jansson allocates through rlm__malloc/rlm__free (json.c installs them at
 * load), so its allocations are counted and can be made to fail like ours.
 * jansson 2.14 survives a failed allocation while it builds or dumps, but
 * not while it parses: its lexer ignores a string buffer that could not
 * grow, then drops a byte or writes past the buffer (akheron/jansson#362).
 * So every parse goes through rlm_json_loadb (ringlm.h), and code that
 * builds JSON compares rlm_alloc_failures() before and after, since a
 * builder that ignores json_object_set_new's result loses a member.
 * ---------------------------------------------------------------------- */
typedef struct json_t json_t;
typedef struct json_error_t json_error_t;

/* rlm_json_loadb, typed. */
json_t *rlm__json_parse(const char *buf, size_t len, size_t flags, json_error_t *je, bool *nomem);
/* json_dumps(j, flags), NULL when any allocation failed; free with rlm__free. */
char *rlm__json_dumps(const json_t *j, size_t flags);

rlm_status rlm__json_load_file(const char *path, json_t **out, rlm_error *err);
rlm_status rlm__json_load_buf(const char *buf, size_t len, const char *what,
                              json_t **out, rlm_error *err);
/* Writes with 2-space indent and sorted keys, atomically. */
rlm_status rlm__json_save_file(const json_t *j, const char *path,
                               rlm_error *err);
void rlm__json_free(json_t *j);

#endif /* RLM_BASE_H */
