/* backend_cuda.c -- the CUDA backend of the forward pass (backend.h), built
 * with -DRINGLM_CUDA=ON: the model's weights uploaded once, as they are
 * stored; a session's activations, caches and pass plan in device memory;
 * the kernels of cuda_backend.h and cuda_ops.h on one stream; and each
 * decode step captured once as a CUDA graph and replayed.
 *
 * THE CACHES. Each layer with its own cache holds [n_rows][n_kv][cap][dim]
 * K and V in the model's dtype, or MLX-affine codes with their scales and
 * biases (k_bits, v_bits: cuda_ops.h), allocated whole at create (n_ctx slots, or
 * a ring of window + prefill_chunk - 1 for sliding and max_kv layers). The
 * slot of a position is a formula (cuda_ops.h), and a row holds exactly
 * the positions below its length, so the host keeps no table: rollback
 * and clearing only change rlm_row.pos, and a step's kernels read each
 * token's row and position from device arrays (begin_pass uploads them).
 *
 * THE GRAPH. A pass whose runs are all one token (a decode step of one or
 * more rows) is captured the first time its shape (tokens, wanted logits)
 * is seen, and replayed afterwards: begin_pass uploads the plan, then
 * either starts the capture (the ops enqueue into it) or marks the pass a
 * replay (the ops enqueue nothing); copy_logits or end_pass closes the
 * capture, launches the graph, and copies the logits out. Replaying gives
 * the same bits as running the kernels one by one, since it is the same
 * kernels on the same buffers.
 *
 * THE PRODUCTS. Up to GEMM_MIN tokens (decode steps, small batches): our
 * matrix-vector kernels, which read each weight once per MAX_M rows; int8
 * activations (--act-bits 8) are quantized once for the products that
 * share an input (q, k, v; gate, up), and past MAX_M up to I8_MAX tokens
 * go to the int8 tensor cores (qgemm_i8.cu). Otherwise, past GEMM_MIN:
 * MLX weights up to QGEMM_MAX tokens the f16 tensor-core GEMM that reads
 * their codes once (qgemm.cu), the rest cuBLAS (gemm.cu).
 *
 * SNAPSHOTS go through the host: row_out copies each cache's live slots
 * (cuda_sess.top says which a ring still holds) into host caches of the
 * CPU's configuration, which snapshot.c writes as any CPU row; row_in
 * copies such caches, checked and filled from a snapshot, into the slots.
 *
 * GEMMA 4's MoE runs its router on the device and its routing on the host
 * (the CPU's rule), so its passes are not captured.
 *
 * Weights at 2, 3, 5 and 6 bits take the generic products (f32
 * activations for decode: qgemv.cu's unit kernel; many tokens: dequantized
 * to f16 for cuBLAS); the int8-activation and tensor-core products are
 * for 4 and 8 bits. GGUF layers that the CPU computes from their blocks
 * (Q4_K, Q5_K, Q6_K, Q5_0) are converted at upload, exactly, into the
 * affine format (gguf_quant.c's conversion: 4, 5 or 6 bits, Q6_K at
 * groups of 16), each layer into its own device array.
 */
#include "model/backend.h"

#include "cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* LOGIT_ROWS: wanted logits per lm_head product (64: batched decode's
 * head in one product that reads W once; at 16, B = 64 on Llama-8B was
 * four int8 products of 266 us on an H100); MAX_M: rows of x a
 * matrix-vector kernel reads W once for; with int8 activations, passes of
 * MAX_M + 1 to I8_MAX tokens take the int8 tensor-core product
 * (qgemm_i8.cu: batched decode); otherwise GEMM_MIN: passes of more tokens
 * than this take a GEMM instead: up to QGEMM_MAX tokens, MLX weights our
 * tensor-core one that reads the codes (qgemm.cu: 2-4x gemm.cu's path at
 * 32-64 tokens on the H200, slower at 512), else cuBLAS's. Passes past
 * GEMM_MIN are never captured in a graph (graph_shape), so a replayed
 * step runs the kernels the same step without a graph runs. */
enum {
  LOGIT_ROWS = 64, MAX_GRAPHS = 32, MAX_M = 8, GEMM_MIN = 16, QGEMM_MAX = 128,
  I8_MAX = 128, I8_DEFAULT = 64, I8_NARROW_MAX = 64, I8_NARROW_ROWS = 8192
};

/* ---- the model's weights on the device ------------------------------------ */

typedef struct dev_array {
  const char *host;
  size_t bytes;
  char *dev;
} dev_array;

/* A GGUF layer in blocks, converted: its blocks' host address, the
 * converted codes, scales and biases on the device. */
typedef struct dev_kq {
  const void *blocks;
  rlm_kqmat src;              /* the layer's blocks, as the CPU reads them */
  rlm_cuda_qmat q;
  void *mem;                  /* codes, scales, biases (one allocation)  */
} dev_kq;

typedef struct dev_weights {
  dev_array *a;               /* sorted by host address                  */
  size_t n, cap;
  void *block;                /* every array, 256-byte aligned           */
  bool failed;                /* out of host memory while collecting     */
  dev_kq *kq;                 /* sorted by blocks                        */
  size_t n_kq, cap_kq;
  rlm_cuda_qmat head8;        /* lm_head's codes at 8 bits (make_head8)  */
  void *head8_mem;
} dev_weights;

static const dev_kq *kq_of(const dev_weights *w, const void *blocks) {
  size_t lo = 0, hi = w->n_kq;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if ((const char *)w->kq[mid].blocks < (const char *)blocks) lo = mid + 1;
    else hi = mid;
  }
  return lo < w->n_kq && w->kq[lo].blocks == blocks ? &w->kq[lo] : NULL;
}

static void collect(void *ctx, const void *p, size_t bytes) {
  dev_weights *w = ctx;
  if (!p || !bytes || w->failed || kq_of(w, p)) return; /* blocks go converted, not as they are */
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 256;
    dev_array *a = rlm__realloc(w->a, cap * sizeof *a);
    if (!a) {
      w->failed = true;
      return;
    }
    w->a = a, w->cap = cap;
  }
  w->a[w->n++] = (dev_array){p, bytes, NULL};
}

static int by_host(const void *a, const void *b) {
  const char *x = ((const dev_array *)a)->host, *y = ((const dev_array *)b)->host;
  return x < y ? -1 : x > y;
}

static void weights_free(void *p) {
  dev_weights *w = p;
  if (!w) return;
  cudaFree(w->block);
  cudaFree(w->head8_mem);
  for (size_t i = 0; i < w->n_kq; i++) cudaFree(w->kq[i].mem);
  rlm__free(w->kq);
  rlm__free(w->a);
  rlm__free(w);
}

/* The GGUF layers in blocks, each once (a tied head is the embedding). */
static void collect_kq(void *ctx, const rlm_linear *l) {
  dev_weights *w = ctx;
  if (!l->kq.blocks || w->failed) return;
  for (size_t i = 0; i < w->n_kq; i++)
    if (w->kq[i].blocks == l->kq.blocks) return;
  if (w->n_kq == w->cap_kq) {
    const size_t cap = w->cap_kq ? 2 * w->cap_kq : 64;
    dev_kq *k = rlm__realloc(w->kq, cap * sizeof *k);
    if (!k) {
      w->failed = true;
      return;
    }
    w->kq = k, w->cap_kq = cap;
  }
  w->kq[w->n_kq++] = (dev_kq){.blocks = l->kq.blocks, .src = l->kq};
}

static int by_blocks(const void *a, const void *b) {
  const char *x = ((const dev_kq *)a)->blocks, *y = ((const dev_kq *)b)->blocks;
  return x < y ? -1 : x > y;
}


/* The device copy of host address p (inside an uploaded array), or NULL. */
static const void *dev_of(const dev_weights *w, const void *p) {
  if (!p) return NULL;
  size_t lo = 0, hi = w->n;
  while (lo < hi) { /* the last array starting at or before p */
    size_t mid = (lo + hi) / 2;
    if (w->a[mid].host <= (const char *)p) lo = mid + 1;
    else hi = mid;
  }
  if (!lo) return NULL;
  const dev_array *a = &w->a[lo - 1];
  size_t off = (size_t)((const char *)p - a->host);
  return off < a->bytes ? a->dev + off : NULL;
}

static rlm_status cuda_fail(rlm_error *err, cudaError_t e, const char *what) {
  return rlm__err(err, e == cudaErrorMemoryAllocation ? RLM_ERR_NOMEM : RLM_ERR_INTERNAL, "cuda: %s: %s", what,
                  cudaGetErrorString(e));
}

/* kq's layer converted on the host (arena, reset after), copied into one
 * device allocation. */
static rlm_status upload_kq(const rlm_model *m, dev_kq *kq, rlm_arena *arena, rlm_error *err) {
  rlm_qmat q;
  rlm_status rc = rlm__gguf_kq_affine(m, &kq->src, arena, &q, err);
  if (rc) return rc;
  const size_t wb = (size_t)q.rows * (size_t)rlm__quant_row_words(q.cols, q.bits) * 4;
  const size_t sb = (size_t)q.rows * (size_t)(q.cols / q.group_size) * rlm_dtype_size(q.sdtype);
  const size_t wb_a = (wb + 255) & ~(size_t)255, sb_a = (sb + 255) & ~(size_t)255;
  char *mem = NULL;
  cudaError_t e = cudaMalloc((void **)&mem, wb_a + 2 * sb_a);
  if (e == cudaSuccess) e = cudaMemcpy(mem, q.wq, wb, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(mem + wb_a, q.scales, sb, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(mem + wb_a + sb_a, q.biases, sb, cudaMemcpyHostToDevice);
  rlm__arena_reset(arena);
  if (e != cudaSuccess) {
    cudaFree(mem);
    return cuda_fail(err, e, "uploading a converted GGUF layer");
  }
  kq->mem = mem;
  kq->q = (rlm_cuda_qmat){(const uint32_t *)mem, mem + wb_a, mem + wb_a + sb_a, q.sdtype, q.rows, q.cols, q.bits,
                          q.group_size};
  return RLM_OK;
}

/* The GGUF layers in blocks, converted and uploaded one by one. */
static rlm_status upload_kqs(const rlm_model *m, dev_weights *w, rlm_error *err) {
  rlm__model_linears(m, collect_kq, w);
  if (w->failed) return rlm__err_nomem(err, "cuda weights table", 0);
  if (w->n_kq) qsort(w->kq, w->n_kq, sizeof *w->kq, by_blocks);
  rlm_arena arena;
  rlm__arena_init(&arena, 1 << 20);
  rlm_status rc = RLM_OK;
  for (size_t i = 0; !rc && i < w->n_kq; i++) rc = upload_kq(m, &w->kq[i], &arena, err);
  rlm__arena_free(&arena);
  return rc;
}

/* Every array the forward pass reads, each once (a tied head is the
 * embedding), copied into one device block. */
static rlm_status upload_weights(rlm_model *m, rlm_error *err) {
  dev_weights *w = rlm__calloc(1, sizeof *w);
  if (!w) return rlm__err_nomem(err, "cuda weights table", sizeof *w);
  rlm_status rc = upload_kqs(m, w, err);
  if (rc) {
    weights_free(w);
    return rc;
  }
  rlm__model_arrays(m, collect, w);
  if (w->failed) {
    weights_free(w);
    return rlm__err_nomem(err, "cuda weights table", 0);
  }
  qsort(w->a, w->n, sizeof *w->a, by_host);
  size_t k = 0, total = 0;
  for (size_t i = 0; i < w->n; i++) /* drop repeats and arrays inside another */
    if (!k || w->a[i].host >= w->a[k - 1].host + w->a[k - 1].bytes) w->a[k++] = w->a[i];
  w->n = k;
  for (size_t i = 0; i < w->n; i++) total += (w->a[i].bytes + 255) & ~(size_t)255;
  cudaError_t e = cudaMalloc(&w->block, total);
  for (size_t i = 0, off = 0; e == cudaSuccess && i < w->n; i++) {
    w->a[i].dev = (char *)w->block + off;
    off += (w->a[i].bytes + 255) & ~(size_t)255;
    e = cudaMemcpy(w->a[i].dev, w->a[i].host, w->a[i].bytes, cudaMemcpyHostToDevice);
  }
  if (e != cudaSuccess) {
    weights_free(w);
    return cuda_fail(err, e, "uploading the weights");
  }
  m->dev_weights = w, m->dev_weights_free = weights_free;
  return RLM_OK;
}

/* ---- session state ------------------------------------------------------- */

typedef enum pass_mode { MODE_DIRECT, MODE_CAPTURE, MODE_REPLAY } pass_mode;

typedef struct graph {
  int n, n_want;
  bool short_ctx; /* captured under the short-context promise (cs->seen) */
  cudaGraphExec_t exec;
} graph;

typedef struct cuda_sess {
  cudaStream_t st;
  const dev_weights *w;
  rlm_cuda_kv *kv;            /* [n_layers]; KV-shared layers unused      */
  void *kv_block;
  size_t kv_bytes;
  /* the pass plan: host staging (pinned) and its device copy */
  void *h_plan, *d_plan;
  int32_t *d_ids, *d_rows, *d_want;
  int64_t *d_pos;
  size_t plan_bytes;
  void *q8, *att_scratch;
  rlm_cuda_blas blas;         /* cuBLAS, for passes past GEMM_MIN tokens  */
  void *gemm_scratch;         /* NULL when prefill_chunk <= GEMM_MIN      */
  size_t gemm_bytes;          /* its size                                 */
  float *i8_part;             /* qgemm_i8's split-K partials (I8_MAX rows) */
  /* a split product's outputs left unwritten (i8_products): k of them,
   * m rows; the op that reads them sums them itself (add_norm, act_mul)
   * or settle() writes them first */
  struct {
    int k;
    int64_t m;
    float *y[3];
    rlm_cuda_sum sum[3];
  } late;
  rlm_cuda_qmat head8;        /* the model's make_head8 codes (wq NULL: none) */
  /* the activations q8 holds (reused by the next product on the same x:
   * q, k and v; gate and up); any other op forgets them */
  const float *q8_x;
  int64_t q8_cols;
  int q8_bits, q8_group;
  /* the format norms and gated activations write q8 in along with their
   * output (q8_out), the first layer's q projection's; 0: they do not */
  int q8_fmt_bits, q8_fmt_group;
  int q8_rows;                /* rows of x the q8 scratch holds           */
  int q8_head_bits, q8_head_group; /* the final norm's: lm_head's format (Gemma's 8-bit tied head) */
  int kv_done;                /* the layer whose k, v qkv_norm_rope wrote, or -1 */
  /* Gemma 4's MoE: device scratch (moe_scratch's layout) and the host's
   * copy of the router's logits (pinned), its chosen experts and weights */
  float *moe_dev, *moe_logit;
  int *moe_idx;
  float *moe_w;
  /* each row's highest position written since it last started at 0: a
   * ring holds exactly the positions its later writes have not reached
   * (rollback and snapshots read it; a row's length alone cannot say) */
  int64_t *top;
  rlm_status first;           /* the first error an op met this pass      */
  rlm_error first_err;
  pass_mode mode;
  /* the pass's promise to the attention (rlm__cuda_attend_seen): no
   * query sees more positions than this; 0: none. A graph is captured
   * and replayed under one promise (graph.short_ctx). */
  int64_t seen;
  graph graphs[MAX_GRAPHS];
  int n_graphs, cur;          /* cur: the graph this pass captures/replays */
} cuda_sess;

static cuda_sess *cs_of(rlm_session *s) { return s->dev; }

/* Keeps the first failure of the pass. */
static void note(rlm_session *s, rlm_status rc, const rlm_error *e) {
  cuda_sess *cs = cs_of(s);
  if (rc && !cs->first) cs->first = rc, cs->first_err = *e;
}

/* Whether an op enqueues nothing: a replayed graph holds it, or the pass
 * has failed. The products ask this alone, keeping q8's memo. */
static bool enqueues_nothing(rlm_session *s) { return cs_of(s)->mode == MODE_REPLAY || cs_of(s)->first; }

/* Writes the outputs a split product left to their reader (cs->late),
 * where the op that comes next does not read them as sums. */
static void settle(rlm_session *s) {
  cuda_sess *cs = cs_of(s);
  if (!cs->late.k) return;
  const int k = cs->late.k;
  cs->late.k = 0;
  if (enqueues_nothing(s)) return;
  rlm_error er;
  note(s, rlm__cuda_sums_write(cs->late.sum, cs->late.y, k, cs->late.m, cs->st, &er), &er);
}

/* enqueues_nothing, for every op but the products: it also forgets which
 * activations q8 holds (the op may write them), and settles. */
static bool skip(rlm_session *s) {
  cs_of(s)->q8_x = NULL;
  if (enqueues_nothing(s)) return true;
  settle(s);
  return false;
}

static void *cuda_alloc(rlm_session *s, size_t bytes) {
  (void)s;
  void *p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void cuda_release(rlm_session *s, void *p) {
  (void)s;
  cudaFree(p);
}

/* ---- weights as kernel arguments ---------------------------------------- */

static rlm_cuda_weight weight_of(rlm_session *s, const rlm_linear *l) {
  const dev_weights *w = cs_of(s)->w;
  rlm_cuda_weight d = {.rows = l->out, .cols = l->in, .dtype = l->dtype};
  if (l->kq.blocks) {
    const dev_kq *k = kq_of(w, l->kq.blocks);
    if (k) d.q = k->q;
    return d;
  }
  if (!l->quant) {
    d.w = dev_of(w, l->w);
    return d;
  }
  d.q = (rlm_cuda_qmat){dev_of(w, l->q.wq), dev_of(w, l->q.scales), dev_of(w, l->q.biases), l->q.sdtype,
                        l->q.rows, l->q.cols, l->q.bits, l->q.group_size};
  return d;
}

static const float *dvec(rlm_session *s, const float *p) { return dev_of(cs_of(s)->w, p); }

/* ---- the ops -------------------------------------------------------------- */

static void cuda_embed(rlm_session *s, const rlm_pass *ps, const rlm_linear *e, float scale, float *out) {
  if (skip(s)) return;
  rlm_error er;
  rlm_cuda_weight w = weight_of(s, e);
  note(s, rlm__cuda_embed(&w, cs_of(s)->d_ids, ps->n, scale, out, cs_of(s)->st, &er), &er);
}

/* int8 activations of x for the quantized w, unless q8 already holds them
 * (the same x, width and format as the previous product's: no op ran in
 * between). */
static rlm_status q8_of(rlm_session *s, const rlm_cuda_qmat *w, const float *x, int m, rlm_error *er) {
  cuda_sess *cs = cs_of(s);
  if (cs->q8_x == x && cs->q8_cols == w->cols * m && cs->q8_bits == w->bits && cs->q8_group == w->group_size)
    return RLM_OK;
  rlm_status rc = rlm__cuda_q8act_quantize(x, m, w->cols, w->bits, w->group_size, cs->q8, cs->st, er);
  cs->q8_x = rc ? NULL : x, cs->q8_cols = w->cols * m, cs->q8_bits = w->bits, cs->q8_group = w->group_size;
  return rc;
}

/* RUN-TIME SWITCHES. Each turns one of this file's choices off (or, for
 * RINGLM_CUDA_I8_MAX, sets it), so that one build compares both sides in
 * one call on a shared machine (docs/cuda-notes.md gives each
 * comparison). Read once, on the first use, whichever thread that is. */
typedef struct cuda_switches {
  int64_t i8_max;   /* RINGLM_CUDA_I8_MAX=n: tokens up to which the int8
                       tensor-core product runs, for every product (-1:
                       by rows, i8_max) */
  int64_t i8_wide;  /* RINGLM_CUDA_I8_WIDE=n: the same for products past
                       I8_NARROW_ROWS rows only (gate, up, the head) */
  bool dense_multi; /* RINGLM_CUDA_DENSE_MULTI=0: dense products one by one */
  bool fuse;        /* RINGLM_CUDA_FUSE=0: no producers' int8, no qkv_prep */
  bool attn_tc;     /* RINGLM_CUDA_ATTN_TC=0: flash-decoding kernel for prefill */
  bool xreg6;       /* RINGLM_CUDA_XREG6=0: one-row products of 6-bit weights
                       on the f32 unit kernel, not the int8 path
                       (xreg6_takes) */
  bool sum_late;    /* RINGLM_CUDA_SUM_LATE=0: a split int8 product's sums
                       added by add_splits, not by the add_norm or act_mul
                       that reads them (i8_products) */
  bool sum_qkv;     /* RINGLM_CUDA_SUM_QKV=1: q, k and v's sums added by
                       qkv_prep too (cuda_qkv_norm_rope); off until it has
                       run on a GPU */
  bool qgemm_multi; /* RINGLM_CUDA_QGEMM_MULTI=1: several f16 tensor-core
                       products of one x in one launch (one_launch_qgemm);
                       off until it has run on a GPU */
  bool q8_wide;     /* RINGLM_CUDA_Q8_WIDE=0: producers write int8
                       activations for MAX_M rows at most, not as many as
                       the scratch holds (q8_out_as) */
  bool head8;       /* RINGLM_CUDA_HEAD8=0: a 2-6-bit lm_head past one row
                       on the f32 unit kernel, not its codes at 8 bits
                       (make_head8) */
  bool dense_gated; /* RINGLM_CUDA_DENSE_GATED=0: dense gate and up as two
                       products and an activation launch, not one launch
                       (cuda_gated) */
} cuda_switches;

static cuda_switches g_switches;

/* On unless the variable starts with '0'. */
static bool env_on(const char *name) {
  const char *e = getenv(name);
  return !(e && e[0] == '0');
}

static void read_switches(void) {
  const char *e = getenv("RINGLM_CUDA_I8_MAX");
  g_switches.i8_max = e ? RLM_MIN((int64_t)I8_MAX, (int64_t)atoll(e)) : -1;
  e = getenv("RINGLM_CUDA_I8_WIDE");
  g_switches.i8_wide = e ? RLM_MIN((int64_t)I8_MAX, (int64_t)atoll(e)) : I8_DEFAULT;
  g_switches.dense_multi = env_on("RINGLM_CUDA_DENSE_MULTI");
  g_switches.fuse = env_on("RINGLM_CUDA_FUSE");
  g_switches.attn_tc = env_on("RINGLM_CUDA_ATTN_TC");
  g_switches.xreg6 = env_on("RINGLM_CUDA_XREG6");
  g_switches.q8_wide = env_on("RINGLM_CUDA_Q8_WIDE");
  g_switches.sum_late = env_on("RINGLM_CUDA_SUM_LATE");
  e = getenv("RINGLM_CUDA_SUM_QKV");
  g_switches.sum_qkv = e && e[0] == '1';
  e = getenv("RINGLM_CUDA_QGEMM_MULTI");
  g_switches.qgemm_multi = e && e[0] == '1';
  g_switches.head8 = env_on("RINGLM_CUDA_HEAD8");
  g_switches.dense_gated = env_on("RINGLM_CUDA_DENSE_GATED");
}

static const cuda_switches *switches(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, read_switches);
  return &g_switches;
}

/* Whether w takes the int8-activation and tensor-core products: quantized
 * (in MLX's format, or converted from GGUF blocks) at 4 or 8 bits. */
static bool fast_bits(const rlm_cuda_weight *w) { return w->q.wq && (w->q.bits == 4 || w->q.bits == 8); }

/* Whether a product of n rows of x with w, 6-bit, takes the int8-activation
 * product under --act-bits 8: one row (decode's x-in-registers kernel, as
 * the CPU multiplies 6-bit weights by int8 activations too), where
 * rlm__cuda_q8_takes says so (else, or with RINGLM_CUDA_XREG6=0, the f32
 * unit kernel, qgemv.cu). Llama-8B's head at 6 bits, as the anchor's Q6_K
 * has it: tg128 411-414 tok/s on the unit kernel, 444-447 here (H100,
 * docs/cuda-notes.md). */
static bool xreg6_takes(const rlm_session *s, const rlm_cuda_weight *w, int64_t n) {
  return switches()->xreg6 && s->p.act_bits == 8 && n == 1 && w->q.wq && w->q.bits == 6 &&
         rlm__cuda_q8_takes(&w->q, 1);
}

/* Tokens up to which the int8 tensor-core product runs for a product of
 * `rows` rows: I8_NARROW_MAX where rows <= I8_NARROW_ROWS (qgemm.cu's
 * 256-row tiles are too few there to fill the card: at 64 tokens the 8B's
 * q, o and down took 34 / 85 us against 40 / 108 on the H200), else
 * I8_DEFAULT. Both are 64 since the int8 product's instances of a
 * compile-time group size (qgemm_i8.cu, RINGLM_CUDA_I8_FAST): on the
 * run-time group instances gate and up at 64 tokens took 91 us against
 * qgemm's 67 and 32 was the wide limit; with them batched S_TG B = 64 on
 * the 8B went 6,063 to 6,598 tok/s at 64 (H100, docs/cuda-notes.md).
 * RINGLM_CUDA_I8_MAX=n sets one limit for all (I8_MAX at most), to
 * compare; RINGLM_CUDA_I8_WIDE=n the second only. */
static int64_t i8_max(int64_t rows) {
  const int64_t forced = switches()->i8_max;
  if (forced >= 0) return forced;
  return rows <= I8_NARROW_ROWS ? I8_NARROW_MAX : switches()->i8_wide;
}

/* The int8 tensor-core product of k weights of one x (cs->q8), into ys.
 * A product that splits K leaves its outputs unwritten (cs->late) for the
 * add_norm or act_mul that reads them, which sums the partials as it
 * loads them (RINGLM_CUDA_SUM_LATE=0: add_splits writes them): at B = 32
 * on Llama-8B, add_splits was 128 launches of 4.7 us, 7.7% of the step;
 * batched S_TG B = 32 +0-4%, B = 64 level (H100, docs/cuda-notes.md). */
static rlm_status i8_products(rlm_session *s, const rlm_cuda_qmat *ws, float *const *ys, int k, int64_t n,
                              rlm_error *er) {
  cuda_sess *cs = cs_of(s);
  if (!switches()->sum_late) return rlm__cuda_qgemm_i8_multi(ws, ys, k, cs->q8, n, cs->i8_part, cs->st, er);
  rlm_status rc = rlm__cuda_qgemm_i8_multi_late(ws, ys, k, cs->q8, n, cs->i8_part, cs->late.sum, cs->st, er);
  if (!rc && cs->late.sum[0].S) {
    cs->late.k = k, cs->late.m = n;
    for (int i = 0; i < k; i++) cs->late.y[i] = ys[i];
  }
  return rc;
}

/* Where the outputs a split product left (cs->late) are exactly ys[0 ..
 * k - 1] of m rows and the reader can add them (can): their sums into
 * sums, taken (nothing then settles them). */
static bool take_late(cuda_sess *cs, const float *const *ys, int k, int64_t m, bool can, rlm_cuda_sum *sums) {
  if (!can || cs->late.k != k || cs->late.m != m) return false;
  for (int i = 0; i < k; i++)
    if (cs->late.y[i] != ys[i]) return false;
  memcpy(sums, cs->late.sum, (size_t)k * sizeof *sums);
  cs->late.k = 0;
  return true;
}

/* Whether cuda_linear sends n rows of x times w to the int8 tensor-core
 * product (qgemm_i8.cu), or else to the f16 one (qgemm.cu). */
static bool i8_takes(rlm_session *s, const rlm_cuda_weight *w, int64_t n) {
  return fast_bits(w) && s->p.act_bits == 8 && w->cols % 128 == 0 && n > MAX_M && n <= i8_max(w->rows) &&
         cs_of(s)->i8_part;
}
static bool qgemm_takes(rlm_session *s, const rlm_cuda_weight *w, int64_t n) {
  return !i8_takes(s, w, n) && n > GEMM_MIN && n <= QGEMM_MAX && cs_of(s)->gemm_scratch && fast_bits(w) &&
         w->cols % 64 == 0;
}

/* Rows of x in groups of MAX_M (the kernels read W once per group): the
 * int8-activation product where the CPU would use it, else f32; more than
 * GEMM_MIN rows (prefill, large batches): qgemm or cuBLAS (see the top). */
static void cuda_linear(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y) {
  if (enqueues_nothing(s)) return;
  settle(s); /* x may be a late output; the partials are about to be reused */
  cuda_sess *cs = cs_of(s);
  rlm_error er;
  rlm_cuda_weight w = weight_of(s, l);
  if (n > 1 && l == &s->m->lm_head && cs->head8.wq) w.q = cs->head8;
  rlm_status rc = RLM_OK;
  const bool fast = fast_bits(&w);
  const bool q8 = (fast && s->p.act_bits == 8 && l->in % 128 == 0) || xreg6_takes(s, &w, n);
  if (i8_takes(s, &w, n)) {
    rc = q8_of(s, &w.q, x, (int)n, &er);
    if (!rc) rc = i8_products(s, &w.q, &y, 1, n, &er);
    if (y == cs->q8_x) cs->q8_x = NULL;
    note(s, rc, &er);
    return;
  }
  if (qgemm_takes(s, &w, n)) {
    cs->q8_x = NULL;
    note(s, rlm__cuda_qgemm(&w.q, x, n, y, cs->gemm_scratch, cs->st, &er), &er);
    return;
  }
  /* cuBLAS dequantizes W into the scratch, sized for the layers: not
   * for lm_head (LOGIT_ROWS rows) unless its weights are 4 or 8 bits */
  if (n > GEMM_MIN && cs->gemm_scratch && rlm__cuda_gemm_scratch_bytes(n, l->out, l->in) <= cs->gemm_bytes) {
    cs->q8_x = NULL;
    note(s, rlm__cuda_gemm(cs->blas, &w, x, n, y, cs->gemm_scratch, cs->st, &er), &er);
    return;
  }
  if (!q8 || n > MAX_M) cs->q8_x = NULL; /* the memo covers one group of rows */
  for (int64_t r0 = 0; !rc && r0 < n; r0 += MAX_M) {
    const int m = (int)RLM_MIN((int64_t)MAX_M, n - r0);
    const float *xr = x + r0 * l->in;
    float *yr = y + r0 * l->out;
    if (q8) {
      rc = q8_of(s, &w.q, xr, m, &er);
      if (!rc) rc = rlm__cuda_qgemv_q8(&w.q, cs->q8, m, yr, cs->st, &er);
    } else if (w.q.wq) {
      rc = rlm__cuda_qgemv(&w.q, xr, m, yr, cs->st, &er);
    } else {
      rc = rlm__cuda_dense_gemv(&w, xr, m, yr, cs->st, &er);
    }
  }
  if (y == cs->q8_x) cs->q8_x = NULL; /* overwritten */
  note(s, rc, &er);
}

/* Whether the k weights are 4- or 8-bit MLX matrices of one format that
 * a launch of several products shares: cols (a multiple of mult: 128 for
 * the int8-activation products), bits, group size and scale dtype. */
static bool same_format(const rlm_cuda_weight *ws, int k, int64_t mult) {
  for (int i = 0; i < k; i++) {
    const rlm_cuda_qmat *q = &ws[i].q, *q0 = &ws[0].q;
    if (!fast_bits(&ws[i]) || q->cols % mult || q->cols != q0->cols || q->bits != q0->bits ||
        q->group_size != q0->group_size || q->sdtype != q0->sdtype)
      return false;
  }
  return true;
}

/* Whether k products of one x (weights ws) can be one launch: decode-sized
 * passes of int8-activation products whose weights agree in what the
 * kernel shares. */
static bool one_launch(const rlm_session *s, const rlm_cuda_weight *ws, int k, int64_t n) {
  return n <= MAX_M && s->p.act_bits == 8 && same_format(ws, k, 128);
}

/* Whether k products of one x past MAX_M rows can be one launch of the
 * int8 tensor-core product: where cuda_linear would send each of them
 * there (batched decode's q, k and v), with the same format. At B = 64
 * on Llama-8B k and v were launches of 32 blocks a split each, 9.6 us
 * apiece against q's 27 (ncu on an H100, docs/cuda-notes.md). */
static bool one_launch_i8(rlm_session *s, const rlm_cuda_weight *ws, int k, int64_t n) {
  if (k < 2 || n <= MAX_M || s->p.act_bits != 8 || !cs_of(s)->i8_part || !same_format(ws, k, 128)) return false;
  for (int i = 0; i < k; i++)
    if (n > i8_max(ws[i].q.rows)) return false;
  return true;
}

/* Whether k products of one x past GEMM_MIN rows can be one launch of the
 * f16 tensor-core product: where cuda_linear would send each of them
 * there (batched decode's gate and up at 64 tokens, prefill), with the
 * same format: x scaled once, one launch where there were two of each.
 * RINGLM_CUDA_QGEMM_MULTI=1 until it has run on a GPU. */
static bool one_launch_qgemm(rlm_session *s, const rlm_cuda_weight *ws, int k, int64_t n) {
  if (!switches()->qgemm_multi || k < 2 || !same_format(ws, k, 64)) return false;
  for (int i = 0; i < k; i++)
    if (!qgemm_takes(s, &ws[i], n)) return false;
  return true;
}

/* Whether k dense products of one x can be one launch: decode-sized
 * passes, the same cols and dtype. RINGLM_CUDA_DENSE_MULTI=0 launches
 * them one by one, to compare (docs/cuda-notes.md). */
static bool one_launch_dense(const rlm_cuda_weight *ws, int k, int64_t n) {
  if (!switches()->dense_multi || n > MAX_M) return false;
  for (int i = 0; i < k; i++)
    if (ws[i].q.wq || !ws[i].w || ws[i].cols != ws[0].cols || ws[i].dtype != ws[0].dtype) return false;
  return true;
}

static void cuda_linears(rlm_session *s, const rlm_linear *const *ls, float *const *ys, int k, const float *x,
                         int64_t n) {
  /* not skip(): the norm before q, k, v (and before gate, up) has just
   * written their int8 activations; forgetting them made every such pair
   * of products quantize x again, a launch of its own, twice a layer (ncu
   * of a Llama-8B step, 2026-12-04) */
  if (enqueues_nothing(s)) return;
  settle(s);
  rlm_cuda_weight dw[3];
  for (int i = 0; i < k && i < 3; i++) dw[i] = weight_of(s, ls[i]);
  const bool dense = k <= 3 && one_launch_dense(dw, k, n);
  const bool i8 = k <= 3 && !dense && one_launch_i8(s, dw, k, n);
  const bool qg = k <= 3 && !dense && !i8 && one_launch_qgemm(s, dw, k, n);
  if (k > 3 || (!dense && !i8 && !qg && !one_launch(s, dw, k, n))) {
    for (int i = 0; i < k; i++) cuda_linear(s, ls[i], x, n, ys[i]);
    return;
  }
  cuda_sess *cs = cs_of(s);
  rlm_error er;
  rlm_cuda_qmat ws[3];
  for (int i = 0; i < k; i++) ws[i] = dw[i].q;
  if (qg) {
    cs->q8_x = NULL; /* as cuda_linear's qgemm products */
    note(s, rlm__cuda_qgemm_multi(ws, ys, k, x, n, cs->gemm_scratch, cs->st, &er), &er);
    return;
  }
  if (dense) {
    cs->q8_x = NULL; /* as cuda_linear's dense products */
    note(s, rlm__cuda_dense_gemv_multi(dw, ys, k, x, (int)n, cs->st, &er), &er);
    return;
  }
  /* int8 activations: the tensor-core product past MAX_M rows, else the
   * matrix-vector one */
  rlm_status rc = q8_of(s, &ws[0], x, (int)n, &er);
  if (!rc)
    rc = i8 ? i8_products(s, ws, ys, k, n, &er) : rlm__cuda_qgemv_q8_multi(ws, ys, k, cs->q8, (int)n, cs->st, &er);
  for (int i = 0; i < k; i++)
    if (ys[i] == cs->q8_x) cs->q8_x = NULL; /* overwritten */
  note(s, rc, &er);
}

/* FUSED INT8 ACTIVATIONS. Under --act-bits 8 a product quantizes its x
 * first (q8_of), a launch of its own; the norms and gated activations
 * whose output is a product's x write those activations as they write it
 * (bit for bit what q8_of would), and q8's memo then makes q8_of skip
 * them. q8_out says whether an op of rows x n should, in which format
 * (the model's first product's: a product of another format quantizes
 * again); q8_made records it after the launch. Passes of up to MAX_M
 * rows (more: q8_out_as). RINGLM_CUDA_FUSE=0 turns this and
 * qkv_norm_rope's fusion off, to compare. */
static bool fuse_on(void) { return switches()->fuse; }

/* q8_out in a given format (bits 0: none): the final norm's is lm_head's. */
/* Rows: all the scratch holds (I8_MAX under --act-bits 8; MAX_M under
 * RINGLM_CUDA_Q8_WIDE=0): batched decode's norms, merge and gated
 * activation write what the int8 tensor-core products read, where at B =
 * 64 on Llama-8B a quantize launch ran before q, o and down (430 us of a
 * 12 ms step, ncu on an H100); +1-3% at B = 32 / 64 (docs/cuda-notes.md). */
static const rlm_cuda_q8out *q8_out_as(rlm_session *s, int rows, int n, int bits, int group, rlm_cuda_q8out *buf) {
  const int most = switches()->q8_wide ? cs_of(s)->q8_rows : MAX_M;
  if (!bits || rows > most || n % 128 || n % group) return NULL;
  *buf = (rlm_cuda_q8out){cs_of(s)->q8, bits, group};
  return buf;
}

static const rlm_cuda_q8out *q8_out(rlm_session *s, int rows, int n, rlm_cuda_q8out *buf) {
  const cuda_sess *cs = cs_of(s);
  return q8_out_as(s, rows, n, cs->q8_fmt_bits, cs->q8_fmt_group, buf);
}

static void q8_made(rlm_session *s, const rlm_cuda_q8out *q8, const float *y, int rows, int n) {
  cuda_sess *cs = cs_of(s);
  if (!q8 || cs->first) return;
  cs->q8_x = y, cs->q8_cols = (int64_t)n * rows, cs->q8_bits = q8->bits, cs->q8_group = q8->group_size;
}

/* The hidden state's norms write int8 activations (a product follows);
 * the per-head ones (q, k: rows of head_dim) do not. The final norm
 * writes them in lm_head's format, which may differ from the layers'
 * (an 8-bit head over 4-bit layers): else the head quantizes x again, a
 * launch of its own. A 6-bit head takes them for one row only
 * (xreg6_takes); for more, its 8-bit codes where make_head8 made them,
 * else none. */
static void cuda_rmsnorm(rlm_session *s, float *y, const float *x, const float *w, int rows, int n, double eps) {
  if (skip(s)) return;
  rlm_error er;
  rlm_cuda_q8out buf;
  const cuda_sess *cs = cs_of(s);
  const int head_bits = cs->q8_head_bits == 6 && rows > 1 ? (cs->head8.wq ? 8 : 0) : cs->q8_head_bits;
  const rlm_cuda_q8out *q8 = n != s->m->cfg.hidden ? NULL
                             : w == s->m->final_norm && cs->q8_head_bits
                                 ? q8_out_as(s, rows, n, head_bits, cs->q8_head_group, &buf)
                                 : q8_out(s, rows, n, &buf);
  note(s, rlm__cuda_rmsnorm(y, x, dvec(s, w), rows, n, eps, q8, cs->st, &er), &er);
  q8_made(s, q8, y, rows, n);
}

static void cuda_add(rlm_session *s, float *x, const float *h, size_t n) {
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_add(x, h, (int64_t)n, cs_of(s)->st, &er), &er);
}

static void cuda_add_norm(rlm_session *s, float *x, float *h, const float *post, const float *w, float *y, int rows,
                          int n, double eps) {
  cuda_sess *cs = cs_of(s);
  rlm_error er;
  rlm_cuda_q8out buf;
  const rlm_cuda_q8out *q8 = q8_out(s, rows, n, &buf);
  /* h the one output a split product left (i8_products): summed here */
  rlm_cuda_sum hs;
  const bool late = take_late(cs, (const float *[]){h}, 1, rows, rlm__cuda_add_norm_sum_takes(n, q8), &hs);
  if (skip(s)) return;
  const float *pw = dvec(s, post), *ww = dvec(s, w);
  note(s,
       late ? rlm__cuda_add_norm_sum(x, &hs, pw, ww, y, rows, n, eps, q8, cs->st, &er)
            : rlm__cuda_add_norm(x, h, pw, ww, y, rows, n, eps, q8, cs->st, &er),
       &er);
  q8_made(s, q8, y, rows, n);
}

static void cuda_scale(rlm_session *s, float *x, float a, size_t n) {
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_scale(x, a, (int64_t)n, cs_of(s)->st, &er), &er);
}

static void cuda_softcap(rlm_session *s, float *x, float cap, size_t n) {
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_softcap(x, cap, (int64_t)n, cs_of(s)->st, &er), &er);
}

static void cuda_copy(rlm_session *s, float *dst, const float *src, size_t n) {
  if (skip(s)) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDeviceToDevice, cs_of(s)->st);
  rlm_error er;
  if (e != cudaSuccess) note(s, cuda_fail(&er, e, "copy"), &er);
}

static void cuda_act_mul(rlm_session *s, bool gelu, float *y, const float *g, const float *u, int rows, int n,
                         int64_t u_stride) {
  cuda_sess *cs = cs_of(s);
  rlm_error er;
  rlm_cuda_q8out buf;
  const rlm_cuda_q8out *q8 = q8_out(s, rows, n, &buf);
  /* g and u the two outputs of one split product (gate and up,
   * i8_products): summed here; the int8 kernel only */
  rlm_cuda_sum gu[2];
  const bool late = take_late(cs, (const float *[]){g, u}, 2, rows, u_stride == n && q8, gu);
  if (skip(s)) return;
  note(s,
       late ? rlm__cuda_act_mul_sum(gelu, y, &gu[0], &gu[1], rows, n, q8, cs->st, &er)
            : rlm__cuda_act_mul(gelu, y, g, u, rows, n, u_stride, q8, cs->st, &er),
       &er);
  q8_made(s, q8, y, rows, n);
}

/* The MLP's gated product: one launch where gate and up are dense and no
 * int8 activations are wanted of its output (the dense down product reads
 * floats): rlm__cuda_dense_gated, the two steps' bits; else the two
 * products (cuda_linears) and cuda_act_mul. One H100, tg128 alternating
 * three rounds (docs/cuda-notes.md, 2026-12-07, third): Llama-8B bf16
 * 186.0-186.6 tok/s against 184.5-184.8, Gemma-1B bf16 827.9-829.8
 * against 799.1-803.8. RINGLM_CUDA_DENSE_GATED=0 runs the two steps. */
static void cuda_gated(rlm_session *s, bool gelu, const rlm_linear *gate, const rlm_linear *up, const float *x,
                       int64_t n, float *y, float *u) {
  const rlm_cuda_weight gw = weight_of(s, gate), uw = weight_of(s, up);
  rlm_cuda_q8out buf;
  if (!switches()->dense_gated || !switches()->dense_multi || n > MAX_M ||
      q8_out(s, (int)n, (int)gate->out, &buf) || !rlm__cuda_dense_gated_takes(&gw, &uw, x, (int)n)) {
    const rlm_linear *ls[2] = {gate, up};
    float *ys[2] = {y, u};
    cuda_linears(s, ls, ys, 2, x, n);
    cuda_act_mul(s, gelu, y, y, u, (int)n, (int)gate->out, gate->out);
    return;
  }
  if (skip(s)) return; /* as cuda_act_mul: settles, forgets which x q8 holds (y is written) */
  rlm_error er;
  note(s, rlm__cuda_dense_gated(gelu, &gw, &uw, x, (int)n, y, cs_of(s)->st, &er), &er);
}

static void cuda_rope_angles(rlm_session *s, const rlm_pass *ps, float *cs, int64_t stride, const float *inv_freq,
                             int half) {
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_rope_angles(cs, stride, dvec(s, inv_freq), half, cs_of(s)->d_pos, ps->n, cs_of(s)->st, &er),
       &er);
}

static void cuda_rope(rlm_session *s, float *x, int n, int heads, int hd, const float *cs, int64_t stride) {
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_rope(x, n, heads, hd, cs, stride, cs_of(s)->st, &er), &er);
}

/* One launch for the head dims it takes (multiples of 64 up to 512),
 * else the ops in turn. A layer with a dense cache of its own has k and v
 * written there too (kv_done: its attend then skips the write). */
static void cuda_qkv_norm_rope(rlm_session *s, int li, float *q, float *k, float *v, int n, int hq, int hkv, int hd,
                               const float *qw, const float *kw, bool vnorm, double eps, const float *cs,
                               int64_t stride) {
  cuda_sess *sess = cs_of(s);
  sess->kv_done = -1;
  if (!fuse_on() || hd % 64 || hd > 512) {
    if (qw) cuda_rmsnorm(s, q, q, qw, n * hq, hd, eps);
    if (k && kw) cuda_rmsnorm(s, k, k, kw, n * hkv, hd, eps);
    if (vnorm) cuda_rmsnorm(s, v, v, NULL, n * hkv, hd, eps);
    cuda_rope(s, q, n, hq, hd, cs, stride);
    if (k) cuda_rope(s, k, n, hkv, hd, cs, stride);
    return;
  }
  /* q, k and v the outputs of one split product (i8_products), under
   * RINGLM_CUDA_SUM_QKV=1: summed here */
  rlm_cuda_sum sums[3];
  const bool late = take_late(sess, (const float *[]){q, k, v}, k ? 3 : 1, n, switches()->sum_qkv, sums);
  if (skip(s)) return;
  const rlm_cuda_kv *kv = k && !sess->kv[li].k_bits ? &sess->kv[li] : NULL;
  rlm_error er;
  const float *dqw = dvec(s, qw), *dkw = dvec(s, kw);
  rlm_status rc = late ? rlm__cuda_qkv_prep_sum(q, k, v, sums, n, hq, hkv, hd, dqw, dkw, vnorm, eps, cs, stride, kv,
                                                sess->d_rows, sess->d_pos, sess->st, &er)
                       : rlm__cuda_qkv_prep(q, k, v, n, hq, hkv, hd, dqw, dkw, vnorm, eps, cs, stride, kv,
                                            sess->d_rows, sess->d_pos, sess->st, &er);
  note(s, rc, &er);
  sess->kv_done = kv && !rc ? li : -1;
}

static void cuda_gather(rlm_session *s, const rlm_pass *ps, int i0, int count, float *dst, const float *src,
                        int64_t width) {
  (void)ps;
  if (skip(s)) return;
  rlm_error er;
  note(s, rlm__cuda_gather_rows(dst, src, cs_of(s)->d_want + i0, count, width, cs_of(s)->st, &er), &er);
}

/* Whether a pass's attention runs on the tensor cores (attn_tc.cu): one
 * row's chunk of at least TC_MIN tokens (a prefill, or a long
 * verification; never a captured step) over a cache the kernel takes.
 * RINGLM_CUDA_ATTN_TC=0 keeps the flash-decoding kernel, to compare. */
enum { TC_MIN = 16 };
static bool attn_tc(const rlm_pass *ps, const rlm_cuda_kv *kv) {
  return switches()->attn_tc && ps->n_runs == 1 && ps->n >= TC_MIN && rlm__cuda_attend_prefill_takes(kv);
}

static rlm_status cuda_attend(rlm_session *s, const rlm_pass *ps, int li, rlm_error *err) {
  (void)err;
  if (skip(s)) return RLM_OK;
  cuda_sess *cs = cs_of(s);
  const rlm_model_config *c = &s->m->cfg;
  const int donor = c->kv_donor[li];
  rlm_error er;
  rlm_status rc = RLM_OK;
  if (donor < 0 && cs->kv_done != li)
    rc = rlm__cuda_kv_write(&cs->kv[li], s->k, s->v, cs->d_rows, cs->d_pos, ps->n, cs->st, &er);
  cs->kv_done = -1;
  const rlm_cuda_kv *kv = &cs->kv[donor >= 0 ? donor : li];
  /* the o projection's x, where the group divides the head dim and the
   * flash-decoding kernel runs (the prefill kernel writes none) */
  rlm_cuda_q8out buf;
  const bool tc = attn_tc(ps, kv);
  const rlm_cuda_q8out *q8 = tc ? NULL : q8_out(s, ps->n, c->n_heads * kv->dim, &buf);
  if (q8 && kv->dim % q8->group_size) q8 = NULL;
  if (!rc && tc)
    rc = rlm__cuda_attend_prefill(kv, s->q, c->n_heads, (float)c->attn_scale, cs->d_rows, cs->d_pos, ps->n, s->att,
                                  cs->st, &er);
  else if (!rc)
    rc = rlm__cuda_attend_seen(kv, s->q, c->n_heads, (float)c->attn_scale, cs->d_rows, cs->d_pos, ps->n, cs->seen,
                               s->att, cs->att_scratch, q8, cs->st, &er);
  note(s, rc, &er);
  q8_made(s, q8, s->att, ps->n, c->n_heads * kv->dim);
  return RLM_OK; /* the pass's first error comes back from end_pass */
}

/* cuda_moe's device scratch at base (NULL: only sized; returns floats):
 * the router's input and logits, x2 and the experts' sum for N tokens,
 * then one token's gate|up, activation and expert output, each part on a
 * 256-byte boundary (the products' vector loads). */
static size_t moe_parts(const rlm_model_config *c, size_t N, float *base, float *at[7]) {
  const size_t H = (size_t)c->hidden, I = (size_t)c->moe_inter;
  const size_t n[7] = {N * H, N * (size_t)c->n_experts, N * H, N * H, 2 * I, I, H};
  size_t off = 0;
  for (int i = 0; i < 7; i++) {
    if (at) at[i] = base + off;
    off += (n[i] + 63) & ~(size_t)63;
  }
  return off;
}

/* Gemma 4's MoE block (backend.h): the router on the device, its logits
 * to the host for the routing rule the CPU uses (rlm__moe_route), then
 * each token's chosen experts, products of one row, accumulated on the
 * device. A pass of a MoE model is never captured (graph_shape), so the
 * host may wait here. */
static void cuda_moe(rlm_session *s, int li, int n) {
  cuda_sess *cs = cs_of(s);
  if (skip(s)) return;
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden, E = c->n_experts, K = c->top_k_experts, I = c->moe_inter;
  float *at[7];
  moe_parts(c, (size_t)s->p.prefill_chunk, cs->moe_dev, at);
  float *rin = at[0], *logit = at[1], *x2 = at[2], *acc = at[3], *gu = at[4], *act = at[5], *eo = at[6];
  cuda_rmsnorm(s, rin, s->x, L->router_scale, n, H, c->rms_eps);
  cuda_scale(s, rin, (float)(1.0 / sqrt((double)H)), (size_t)n * H);
  cuda_linear(s, &L->router, rin, n, logit);
  rlm_error er;
  cudaError_t e = cudaMemcpyAsync(cs->moe_logit, logit, (size_t)n * E * sizeof *logit, cudaMemcpyDeviceToHost, cs->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cs->st);
  if (e != cudaSuccess) note(s, cuda_fail(&er, e, "the MoE router's logits"), &er);
  if (cs->first) return;
  for (int j = 0; j < n; j++)
    rlm__moe_route(c, L, cs->moe_logit + (size_t)j * E, cs->moe_idx + (size_t)j * K, cs->moe_w + (size_t)j * K);
  cuda_rmsnorm(s, x2, s->x, L->moe_pre2, n, H, c->rms_eps);
  e = cudaMemsetAsync(acc, 0, (size_t)n * H * sizeof *acc, cs->st);
  if (e != cudaSuccess) note(s, cuda_fail(&er, e, "clearing the MoE sum"), &er);
  for (int j = 0; j < n; j++)
    for (int k = 0; k < K; k++) {
      const int ex = cs->moe_idx[(size_t)j * K + k];
      cuda_linear(s, &L->expert_gate_up[ex], x2 + (size_t)j * H, 1, gu);
      cuda_act_mul(s, true, act, gu, gu + I, 1, I, I);
      cuda_linear(s, &L->expert_down[ex], act, 1, eo);
      if (!skip(s))
        note(s, rlm__cuda_axpby(acc + (size_t)j * H, cs->moe_w[(size_t)j * K + k], eo, 1.0f, H, cs->st, &er), &er);
    }
  cuda_rmsnorm(s, acc, acc, L->moe_post2, n, H, c->rms_eps);
  cuda_rmsnorm(s, s->h, s->h, L->moe_post1, n, H, c->rms_eps);
  cuda_add(s, s->h, acc, (size_t)n * H);
}

/* ---- the pass: plan upload, capture and replay ---------------------------- */

/* MoE models never: their routing reads the router's output on the host. */
static bool graph_shape(const rlm_session *s, const rlm_pass *ps) {
  if (s->p.no_graph || ps->n_want > LOGIT_ROWS || ps->n > GEMM_MIN || s->m->cfg.n_experts) return false;
  for (int r = 0; r < ps->n_runs; r++)
    if (ps->runs[r].n != 1) return false;
  return true;
}

static int find_graph(const cuda_sess *cs, const rlm_pass *ps) {
  for (int i = 0; i < cs->n_graphs; i++)
    if (cs->graphs[i].n == ps->n && cs->graphs[i].n_want == ps->n_want && cs->graphs[i].short_ctx == (cs->seen > 0))
      return i;
  return -1;
}

/* The attention's short-context promise for the pass (cs->seen): the
 * attention's limit (rlm__cuda_attend_whole_positions) where the pass is
 * one token whose position is below it (a query at p sees at most p + 1
 * positions), else none. The limit itself, not the pass's most, so that
 * a graph captured under it holds for every pass that keeps it: a step's
 * graph is captured once, replayed until the context outgrows the limit,
 * then captured again without it. One-token passes only: the attention
 * takes the promise for no other (rlm__cuda_attend_seen), so a batch's
 * or a draft's graph keyed by it would only be captured twice. */
static int64_t short_promise(const rlm_pass *ps) {
  const int64_t limit = rlm__cuda_attend_whole_positions();
  return limit > 0 && ps->n == 1 && ps->tok_pos[0] + 1 <= limit ? limit : 0;
}

/* The plan into pinned staging, one copy to the device (before any capture:
 * a replayed graph reads what this copy wrote). */
static rlm_status upload_plan(rlm_session *s, const rlm_pass *ps, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  const size_t N = (size_t)s->p.prefill_chunk;
  int64_t *pos = cs->h_plan;
  int32_t *ids = (int32_t *)(pos + N), *rows = ids + N, *want = rows + N;
  for (int j = 0; j < ps->n; j++) ids[j] = ps->ids[j], pos[j] = ps->tok_pos[j];
  for (int r = 0; r < ps->n_runs; r++)
    for (int t = 0; t < ps->runs[r].n; t++) rows[ps->runs[r].j0 + t] = ps->runs[r].row;
  for (int i = 0; i < ps->n_want; i++) want[i] = ps->want[i];
  cudaError_t e = cudaMemcpyAsync(cs->d_plan, cs->h_plan, cs->plan_bytes, cudaMemcpyHostToDevice, cs->st);
  return e == cudaSuccess ? RLM_OK : cuda_fail(err, e, "uploading the pass plan");
}

static rlm_status cuda_begin(rlm_session *s, const rlm_pass *ps, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  cs->first = RLM_OK, cs->mode = MODE_DIRECT, cs->cur = -1, cs->q8_x = NULL, cs->late.k = 0;
  for (int r = 0; r < ps->n_runs; r++) {
    const rlm_run *u = &ps->runs[r];
    const int64_t p0 = ps->tok_pos[u->j0];
    if (p0 == 0) cs->top[u->row] = 0; /* a fresh (or cleared) row */
    cs->top[u->row] = RLM_MAX(cs->top[u->row], p0 + u->n);
  }
  cs->seen = short_promise(ps);
  rlm_status rc = upload_plan(s, ps, err);
  if (rc || !graph_shape(s, ps)) return rc;
  cs->cur = find_graph(cs, ps);
  if (cs->cur >= 0) {
    cs->mode = MODE_REPLAY;
    return RLM_OK;
  }
  if (cs->n_graphs == MAX_GRAPHS) return RLM_OK; /* shapes past the table run directly */
  cudaError_t e = cudaStreamBeginCapture(cs->st, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return cuda_fail(err, e, "starting a graph capture");
  cs->mode = MODE_CAPTURE;
  cs->graphs[cs->n_graphs] = (graph){ps->n, ps->n_want, cs->seen > 0, NULL};
  return RLM_OK;
}

/* Ends a capture (keeping the graph if every op enqueued) and launches the
 * pass's graph; afterwards the pass's remaining copies run directly. */
static rlm_status run_graph(rlm_session *s, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  if (cs->mode == MODE_CAPTURE) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cs->st, &g);
    cs->mode = MODE_DIRECT;
    if (cs->first) {
      if (g) cudaGraphDestroy(g);
      return RLM_OK;
    }
    if (e != cudaSuccess) return cuda_fail(err, e, "capturing the decode step");
    graph *gr = &cs->graphs[cs->n_graphs];
    e = cudaGraphInstantiate(&gr->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return cuda_fail(err, e, "instantiating the decode step's graph");
    cs->cur = cs->n_graphs++;
    cs->mode = MODE_REPLAY;
  }
  if (cs->mode == MODE_REPLAY) {
    cs->mode = MODE_DIRECT;
    cudaError_t e = cudaGraphLaunch(cs->graphs[cs->cur].exec, cs->st);
    if (e != cudaSuccess) return cuda_fail(err, e, "launching the decode step's graph");
  }
  return RLM_OK;
}

static rlm_status cuda_copy_logits(rlm_session *s, float *host, const float *dev, size_t n, rlm_error *err) {
  settle(s);
  rlm_status rc = run_graph(s, err);
  if (rc || cs_of(s)->first) return rc;
  cudaError_t e = cudaMemcpyAsync(host, dev, n * sizeof *host, cudaMemcpyDeviceToHost, cs_of(s)->st);
  return e == cudaSuccess ? RLM_OK : cuda_fail(err, e, "copying the logits");
}

static rlm_status cuda_end(rlm_session *s, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  settle(s);
  rlm_status rc = run_graph(s, err);
  cudaError_t e = cudaStreamSynchronize(cs->st);
  if (cs->first) {
    if (err) *err = cs->first_err;
    return cs->first;
  }
  if (!rc && e != cudaSuccess) rc = cuda_fail(err, e, "the pass");
  return rc;
}

static int cuda_rewind_blocker(const rlm_session *s, int row, int64_t to);
static size_t cuda_row_kv_bytes(const rlm_session *s, int row);
static void cuda_fini(rlm_session *s);
static rlm_status cuda_row_out(const rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err);
static rlm_status cuda_row_in(rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err);

/* Page-locked host memory: the logits' device-to-host copies run at the
 * bus's speed into it (33 MB, 64 rows of Llama's vocabulary: 0.6 ms
 * against 2 ms into pageable memory on the H200's host). */
static void *cuda_host_alloc(size_t bytes) {
  void *p = NULL;
  return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
}
static void cuda_host_free(void *p) { cudaFreeHost(p); }

static const rlm_backend backend_cuda = {
    .name = "cuda",
    .logit_rows = LOGIT_ROWS,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .begin_pass = cuda_begin,
    .embed = cuda_embed,
    .linear = cuda_linear,
    .linears = cuda_linears,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .add_norm = cuda_add_norm,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .copy = cuda_copy,
    .act_mul = cuda_act_mul,
    .gated = cuda_gated,
    .rope_angles = cuda_rope_angles,
    .rope = cuda_rope,
    .qkv_norm_rope = cuda_qkv_norm_rope,
    .gather_wanted = cuda_gather,
    .attend = cuda_attend,
    .moe = cuda_moe,
    .copy_logits = cuda_copy_logits,
    .end_pass = cuda_end,
    .rewind_blocker = cuda_rewind_blocker,
    .row_kv_bytes = cuda_row_kv_bytes,
    .fini = cuda_fini,
    .row_out = cuda_row_out,
    .row_in = cuda_row_in,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

/* ---- create / free --------------------------------------------------------- */

/* q8_out's format: the first layer's q projection's, where it takes the
 * int8-activation products (fast_bits, cols a multiple of 128). The final
 * norm's: lm_head's where it takes them, a 6-bit head only for one row
 * (xreg6_takes; cuda_rmsnorm). */
static void set_q8_fmt(rlm_session *s) {
  const rlm_cuda_weight w = weight_of(s, &s->m->layers[0].wq);
  cuda_sess *cs = cs_of(s);
  if (fuse_on() && s->p.act_bits == 8 && fast_bits(&w) && w.q.cols % 128 == 0)
    cs->q8_fmt_bits = w.q.bits, cs->q8_fmt_group = w.q.group_size;
  const rlm_cuda_weight h = weight_of(s, &s->m->lm_head);
  if (cs->q8_fmt_bits && ((fast_bits(&h) && h.q.cols % 128 == 0) || xreg6_takes(s, &h, 1)))
    cs->q8_head_bits = h.q.bits, cs->q8_head_group = h.q.group_size;
}

static rlm_status unsupported(rlm_error *err, const char *what) {
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "device cuda: %s is not supported on the GPU yet", what);
}

/* MLX's widths, 2-6 and 8 bits, at the groups the products take. */
static bool bits_ok(const rlm_linear *l) {
  if (!l->out || l->kq.blocks || !l->quant) return true; /* blocks: converted at upload */
  if (l->q.bits < 2 || l->q.bits == 7 || l->q.bits > 8) return false;
  return l->q.group_size >= 32 || (l->q.group_size == 16 && l->q.bits % 2 == 0 && l->q.bits != 4 && l->q.bits != 8);
}

/* What this backend cannot run yet, named, before anything is allocated. */
static rlm_status check_support(const rlm_model *m, const rlm_session_params *p, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  if (!bits_ok(&m->lm_head) || !bits_ok(&m->ple_model_proj))
    return unsupported(err, "an output head at 16-wide groups (but 2 and 6 bits)");
  if (m->embed.quant && (!bits_ok(&m->embed) || m->embed.q.group_size < 32))
    return unsupported(err, "an embedding at 16-wide groups");
  for (int i = 0; i < c->n_layers; i++) {
    const rlm_layer *L = &m->layers[i];
    const rlm_linear *ls[RLM_LAYER_LINEARS];
    rlm__layer_linears(L, ls);
    for (int j = 0; j < RLM_LAYER_LINEARS; j++)
      if (!bits_ok(ls[j]))
        return unsupported(err, "a linear layer at 16-wide groups (but 2 and 6 bits)");
    bool experts_ok = bits_ok(&L->router);
    for (int e = 0; e < c->n_experts; e++)
      experts_ok = experts_ok && bits_ok(&L->expert_gate_up[e]) && bits_ok(&L->expert_down[e]);
    if (!experts_ok) return unsupported(err, "a MoE router or expert at 16-wide groups (but 2 and 6 bits)");
    if (c->layer_head_dim[i] > 512) return unsupported(err, "a head dim above 512");
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "device cuda: no CUDA device is visible");
  return RLM_OK;
}

/* Layer i's cache geometry (rlm__layer_kv_config's windows): a ring where
 * the window is shorter than the context, else n_ctx plain slots. */
static rlm_cuda_kv layer_kv(const rlm_session *s, int i) {
  const rlm_model_config *c = &s->m->cfg;
  const int64_t window = c->sliding[i] ? c->sliding_window : s->p.max_kv;
  const int keep = c->sliding[i] ? 0 : s->p.kv_sinks;
  /* one of k_bits, v_bits set quantizes both (rlm__layer_kv_config's rule) */
  const int kb = s->p.k_bits ? s->p.k_bits : s->p.v_bits, vb = s->p.v_bits ? s->p.v_bits : s->p.k_bits;
  rlm_cuda_kv k = {.dtype = c->dtype, .k_bits = kb, .v_bits = vb, .group = kb ? s->p.kv_group_size : 0,
                   .n_kv = c->layer_kv_heads[i], .dim = c->layer_head_dim[i], .cap = s->p.n_ctx, .window = window,
                   .keep = window ? keep : 0};
  if (window && window + s->p.prefill_chunk - 1 < s->p.n_ctx) {
    k.cap = window + s->p.prefill_chunk - 1;
    k.ring = k.cap - k.keep;
  }
  return k;
}

/* The next `bytes` of the cache block at *at (256-byte aligned pieces). */
static void *carve(char **at, size_t bytes) {
  void *p = *at;
  *at += (bytes + 255) & ~(size_t)255;
  return p;
}

/* Layer i's K (or V) arrays: codes or elements, then scales and biases
 * when quantized, each [n_rows][n_kv][cap][...]; at NULL: only counted. */
static size_t carve_tensor(const rlm_session *s, const rlm_cuda_kv *k, int bits, char **at, void **data,
                           void **scales, void **biases) {
  const size_t slots = (size_t)s->p.n_rows * (size_t)k->n_kv * (size_t)k->cap;
  const size_t d = slots * rlm__cuda_kv_row_bytes(k, bits), sb = slots * rlm__cuda_kv_sb_bytes(k, bits);
  size_t total = (d + 255) & ~(size_t)255;
  if (sb) total += 2 * ((sb + 255) & ~(size_t)255);
  if (!*at) return total;
  *data = carve(at, d);
  if (sb) *scales = carve(at, sb), *biases = carve(at, sb);
  return total;
}

static rlm_status make_caches(rlm_session *s, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  const rlm_model_config *c = &s->m->cfg;
  if (!(cs->kv = rlm__calloc((size_t)c->n_layers, sizeof *cs->kv))) return rlm__err_nomem(err, "cuda caches", 0);
  size_t total = 0;
  char *none = NULL;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->kv_donor[i] >= 0) continue;
    rlm_cuda_kv *k = &cs->kv[i];
    *k = layer_kv(s, i);
    total += carve_tensor(s, k, k->k_bits, &none, NULL, NULL, NULL) + carve_tensor(s, k, k->v_bits, &none, NULL, NULL, NULL);
  }
  cudaError_t e = cudaMalloc(&cs->kv_block, RLM_MAX(total, (size_t)1));
  if (e != cudaSuccess) return cuda_fail(err, e, "allocating the KV caches");
  cs->kv_bytes = total;
  char *at = cs->kv_block;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->kv_donor[i] >= 0) continue;
    rlm_cuda_kv *k = &cs->kv[i];
    carve_tensor(s, k, k->k_bits, &at, &k->k, &k->ks, &k->kb);
    carve_tensor(s, k, k->v_bits, &at, &k->v, &k->vs, &k->vb);
  }
  return RLM_OK;
}

/* The largest product a pass past GEMM_MIN tokens runs (every linear of
 * the layers and Gemma 4's per-layer projection; the head takes at most
 * LOGIT_ROWS rows: qgemm at 4 and 8 bits, else groups of MAX_M rows,
 * cuda_linear); qgemm needs less (room for x alone). */
static size_t gemm_bytes(const rlm_model *m, int64_t n) {
  size_t most = rlm__cuda_gemm_scratch_bytes(n, m->ple_model_proj.out, m->ple_model_proj.in);
  for (int i = 0; i < m->cfg.n_layers; i++) {
    const rlm_layer *L = &m->layers[i];
    const rlm_linear *ls[RLM_LAYER_LINEARS];
    rlm__layer_linears(L, ls);
    for (int j = 0; j < RLM_LAYER_LINEARS; j++)
      most = RLM_MAX(most, rlm__cuda_gemm_scratch_bytes(n, ls[j]->out, ls[j]->in));
    most = RLM_MAX(most, rlm__cuda_gemm_scratch_bytes(n, L->router.out, L->router.in)); /* MoE (experts: one row) */
  }
  return most;
}

/* cuBLAS and its scratch, for sessions whose passes can pass GEMM_MIN. */
static rlm_status make_gemm(rlm_session *s, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  if (s->p.prefill_chunk <= GEMM_MIN) return RLM_OK;
  cublasStatus_t b = cublasCreate((cublasHandle_t *)&cs->blas);
  if (b != CUBLAS_STATUS_SUCCESS) {
    cs->blas = NULL;
    return rlm__err(err, b == CUBLAS_STATUS_ALLOC_FAILED ? RLM_ERR_NOMEM : RLM_ERR_INTERNAL,
                    "cuda: creating a cuBLAS handle: status %d", (int)b);
  }
  cs->gemm_bytes = gemm_bytes(s->m, s->p.prefill_chunk);
  cudaError_t e = cudaMalloc(&cs->gemm_scratch, cs->gemm_bytes);
  if (e != cudaSuccess) cs->gemm_scratch = NULL, cs->gemm_bytes = 0;
  return e == cudaSuccess ? RLM_OK : cuda_fail(err, e, "allocating the GEMM scratch");
}

static rlm_status make_scratch(rlm_session *s, rlm_error *err) {
  cuda_sess *cs = cs_of(s);
  const rlm_model_config *c = &s->m->cfg;
  const size_t N = (size_t)s->p.prefill_chunk;
  cs->plan_bytes = N * (sizeof(int64_t) + 3 * sizeof(int32_t));
  cudaError_t e = cudaMallocHost(&cs->h_plan, cs->plan_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&cs->d_plan, cs->plan_bytes);
  if (e != cudaSuccess) return cuda_fail(err, e, "allocating the pass plan");
  cs->d_pos = cs->d_plan;
  cs->d_ids = (int32_t *)(cs->d_pos + N), cs->d_rows = cs->d_ids + N, cs->d_want = cs->d_rows + N;
  const int64_t in_max = RLM_MAX(RLM_MAX(RLM_MAX((int64_t)c->max_inter, (int64_t)c->hidden),
                                         (int64_t)c->n_heads * c->max_head_dim),
                                 (int64_t)c->moe_inter);
  size_t q8 = 0;
  const int q8_rows = s->p.act_bits == 8 ? (int)RLM_MIN((int64_t)I8_MAX, (int64_t)N) : MAX_M;
  cs->q8_rows = RLM_MAX(q8_rows, MAX_M);
  for (int g = 32; g <= 128; g *= 2) q8 = RLM_MAX(q8, rlm__cuda_q8act_bytes(in_max, g, cs->q8_rows));
  size_t att = 0; /* the split count depends on the pass's tokens: the most any pass needs */
  for (int n = 1; n <= (int)N; n++) att = RLM_MAX(att, rlm__cuda_attend_scratch_bytes(n, c->n_heads, c->max_head_dim));
  e = cudaMalloc(&cs->q8, q8);
  if (e == cudaSuccess) e = cudaMalloc(&cs->att_scratch, att);
  if (e == cudaSuccess && q8_rows > MAX_M) e = cudaMalloc((void **)&cs->i8_part, rlm__cuda_qgemm_i8_part_bytes(q8_rows));
  if (e == cudaSuccess && c->n_experts) {
    e = cudaMalloc((void **)&cs->moe_dev, moe_parts(c, N, NULL, NULL) * sizeof(float));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&cs->moe_logit, N * (size_t)c->n_experts * sizeof(float));
    cs->moe_idx = rlm__malloc(N * (size_t)c->top_k_experts * sizeof *cs->moe_idx);
    cs->moe_w = rlm__malloc(N * (size_t)c->top_k_experts * sizeof *cs->moe_w);
    if (e == cudaSuccess && (!cs->moe_idx || !cs->moe_w)) return rlm__err_nomem(err, "cuda MoE routing", N);
  }
  if (e != cudaSuccess) return cuda_fail(err, e, "allocating the session scratch");
  return make_gemm(s, err);
}

/* PAST ONE ROW A 2-6-BIT HEAD HAS NO FAST PRODUCT: the int8 tensor-core
 * product (qgemm_i8.cu) and qgemm take 4 and 8 bits, so such a head ran
 * MAX_M rows at a time on the f32 unit kernel, reading all of W for each
 * 8 rows: Llama-8B with its tied head at 6 bits (the anchor's Q6_K) did
 * batched decode at B = 64 at 2,465 tok/s against 6,790 with the head at
 * 8 bits (H100, docs/cuda-notes.md). Its codes widened to 8 bits, with
 * the same scales and biases, hold the same values exactly and take
 * those products: 1,732 / 5,336 / 6,761 tok/s at B = 8 / 32 / 64 against
 * 1,219 / 2,258 / 2,465 (and 1,739 / 5,342 / 6,754 with the head stored
 * at 8 bits). Made once for the model, under the upload lock, for the
 * first session that batches rows (RINGLM_CUDA_HEAD8=0: never): rows x
 * cols bytes (525 MB for Llama-8B's head), which a single stream does
 * not pay. */
static rlm_status make_head8(rlm_model *m, const rlm_session_params *p, rlm_error *err) {
  dev_weights *w = m->dev_weights;
  const rlm_linear *h = &m->lm_head;
  /* bits_ok (check_support) leaves 2-6 and 8: all but the fast widths;
   * groups of 16 (GGUF's, converted) the int8 products do not take */
  if (!switches()->head8 || w->head8.wq || p->n_rows < 2 || p->act_bits != 8 || !h->out || !h->quant ||
      h->kq.blocks || h->q.bits == 4 || h->q.bits == 8 || h->q.group_size < 32 || h->q.cols % 128)
    return RLM_OK;
  void *mem = NULL;
  cudaError_t e = cudaMalloc(&mem, (size_t)h->q.rows * (size_t)h->q.cols);
  if (e != cudaSuccess) return cuda_fail(err, e, "allocating lm_head's 8-bit codes");
  rlm_status rc = rlm__cuda_widen_codes(dev_of(w, h->q.wq), h->q.bits, h->q.rows, h->q.cols, mem, NULL, err);
  if (!rc && (e = cudaDeviceSynchronize()) != cudaSuccess) rc = cuda_fail(err, e, "widening lm_head's codes");
  if (rc) {
    cudaFree(mem);
    return rc;
  }
  w->head8_mem = mem;
  w->head8 = (rlm_cuda_qmat){mem, dev_of(w, h->q.scales), dev_of(w, h->q.biases), h->q.sdtype,
                             h->q.rows, h->q.cols, 8, h->q.group_size};
  return RLM_OK;
}

rlm_status rlm__cuda_session_init(rlm_session *s, rlm_error *err) {
  rlm_status rc = check_support(s->m, &s->p, err);
  if (rc) return rc;
  if (!s->p.n_ctx) { /* the caches are allocated whole: a context must be chosen */
    const int64_t mp = s->m->cfg.max_positions;
    s->p.n_ctx = mp > 0 && mp < 4096 ? mp : 4096;
  }
  /* A model may be shared by sessions on several threads: one uploads. */
  static pthread_mutex_t upload_mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&upload_mu);
  if (!s->m->dev_weights) rc = upload_weights(s->m, err);
  if (!rc) rc = make_head8(s->m, &s->p, err);
  /* read under the lock: another session's make_head8 may write it */
  const rlm_cuda_qmat head8 = rc || s->p.n_rows < 2 ? (rlm_cuda_qmat){0} : ((dev_weights *)s->m->dev_weights)->head8;
  pthread_mutex_unlock(&upload_mu);
  if (rc) return rc;
  cuda_sess *cs = rlm__calloc(1, sizeof *cs);
  if (!cs) return rlm__err_nomem(err, "cuda session", sizeof *cs);
  s->dev = cs, s->be = &backend_cuda;
  cs->w = s->m->dev_weights;
  cs->head8 = head8;
  cs->kv_done = -1;
  if (!(cs->top = rlm__calloc((size_t)s->p.n_rows, sizeof *cs->top)))
    return rlm__err_nomem(err, "cuda rows", (size_t)s->p.n_rows * sizeof *cs->top);
  cudaError_t e = cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_fail(err, e, "creating a stream");
  rc = make_caches(s, err);
  if (!rc) rc = make_scratch(s, err);
  if (!rc) set_q8_fmt(s);
  return rc;
}

static void cuda_fini(rlm_session *s) {
  cuda_sess *cs = s->dev;
  if (!cs) return;
  if (cs->st) cudaStreamSynchronize(cs->st);
  for (int i = 0; i < cs->n_graphs; i++) cudaGraphExecDestroy(cs->graphs[i].exec);
  cudaFree(cs->kv_block), cudaFree(cs->d_plan), cudaFree(cs->q8), cudaFree(cs->att_scratch), cudaFree(cs->i8_part);
  cudaFree(cs->gemm_scratch);
  if (cs->blas) cublasDestroy((cublasHandle_t)cs->blas);
  cudaFreeHost(cs->h_plan), cudaFreeHost(cs->moe_logit), cudaFree(cs->moe_dev);
  rlm__free(cs->moe_idx), rlm__free(cs->moe_w);
  if (cs->st) cudaStreamDestroy(cs->st);
  rlm__free(cs->kv), rlm__free(cs->top);
  rlm__free(cs);
  s->dev = NULL;
}

/* Row `row`'s highest write that still counts: none for an empty row (a
 * cleared row keeps its old top until its next pass starts at 0). */
static int64_t row_top(const rlm_session *s, int row) {
  const int64_t pos = s->rows[row].pos;
  return pos ? RLM_MAX(((const cuda_sess *)s->dev)->top[row], pos) : 0;
}

static int cuda_rewind_blocker(const rlm_session *s, int row, int64_t to) {
  const cuda_sess *cs = s->dev;
  const int64_t top = row_top(s, row);
  for (int i = 0; i < s->m->cfg.n_layers; i++) {
    const rlm_cuda_kv *k = &cs->kv[i];
    /* a ring keeps what a query at `to` sees while its highest write is
     * less than its slack past `to`, or while it never wrapped */
    if (s->m->cfg.kv_donor[i] < 0 && k->ring && top > k->cap && top - to > k->cap - k->window) return i;
  }
  return -1;
}

static size_t cuda_row_kv_bytes(const rlm_session *s, int row) {
  (void)row; /* every row has the same slots */
  const cuda_sess *cs = s->dev;
  return cs ? cs->kv_bytes / (size_t)s->p.n_rows : 0;
}

/* ---- rows through the host (snapshots) ------------------------------------- */

/* What row `row` of cache k holds that a query can still see, as the
 * CPU's rlm_kv_live: the sinks, then [first, pos): all of it in a plain
 * cache; in a ring, the positions the row's highest write has not reached
 * around the ring (>= top - ring; top >= pos, row_top). */
static rlm_kv_live row_live(const rlm_cuda_kv *k, int64_t pos, int64_t top) {
  const int64_t sinks = RLM_MIN((int64_t)k->keep, pos);
  int64_t first = sinks;
  if (k->ring) first = RLM_MIN(pos, RLM_MAX(first, top - k->ring)); /* pos <= keep: the sinks alone */
  return (rlm_kv_live){.offset = pos, .n_sinks = sinks, .first = first, .n = sinks + pos - first,
                       .wrapped = k->ring && top > k->cap};
}

/* Array a (0..2 K's codes or elements, scales, biases; 3..5 V's) of cache
 * k, and its bytes per slot and head (0: the cache has no such array). */
static void *kv_array(const rlm_cuda_kv *k, int a, size_t *slot_bytes) {
  void *const arr[6] = {k->k, k->ks, k->kb, k->v, k->vs, k->vb};
  const int bits = a < 3 ? k->k_bits : k->v_bits;
  *slot_bytes = a % 3 ? rlm__cuda_kv_sb_bytes(k, bits) : rlm__cuda_kv_row_bytes(k, bits);
  return arr[a];
}

/* Array a of row `row`'s positions lv between the device and h, laid out
 * [n_kv][lv->n][slot bytes] in position order (rlm__kv_export's layout):
 * the sinks, then the rest in at most two runs of slots (a ring wraps once
 * from cap to keep), each one 2-D copy over the heads. */
static cudaError_t copy_row(cudaStream_t st, const rlm_cuda_kv *k, int a, int row, const rlm_kv_live *lv, void *h,
                            bool down) {
  size_t sb;
  char *dev = kv_array(k, a, &sb);
  int64_t t = 0, p = 0, end = lv->n_sinks;
  cudaError_t e = cudaSuccess;
  for (int pass = 0; pass < 2 && e == cudaSuccess; pass++, p = lv->first, end = lv->offset)
    while (p < end && e == cudaSuccess) {
      const int64_t slot = !k->ring || p < k->keep ? p : k->keep + (p - k->keep) % k->ring;
      const int64_t len = RLM_MIN(end - p, k->cap - slot);
      char *d = dev + ((size_t)row * (size_t)k->n_kv * (size_t)k->cap + (size_t)slot) * sb;
      char *hp = (char *)h + (size_t)t * sb;
      const size_t dp = (size_t)k->cap * sb, hpitch = (size_t)lv->n * sb, w = (size_t)len * sb;
      e = down ? cudaMemcpy2DAsync(hp, hpitch, d, dp, w, (size_t)k->n_kv, cudaMemcpyDeviceToHost, st)
               : cudaMemcpy2DAsync(d, dp, hp, hpitch, w, (size_t)k->n_kv, cudaMemcpyHostToDevice, st);
      t += len, p += len;
    }
  return e;
}

/* Layer i's arrays between the device row and host buffers h[6] (malloc'd
 * here for the positions lv; the caller frees them). */
static rlm_status layer_copy(const rlm_session *s, int i, int row, const rlm_kv *twin, const rlm_kv_live *lv,
                             void *h[6], bool down, rlm_error *err) {
  const cuda_sess *cs = s->dev;
  const rlm_cuda_kv *k = &cs->kv[i];
  for (int a = 0; a < 6; a++) {
    size_t sb;
    kv_array(k, a, &sb);
    if (sb != rlm__kv_array_slot_bytes(twin, a))
      return rlm__err(err, RLM_ERR_INTERNAL, "cuda: layer %d array %d: %zu bytes a slot on the device, %zu on the host",
                      i, a, sb, rlm__kv_array_slot_bytes(twin, a));
    if (!sb) continue;
    const size_t n = (size_t)k->n_kv * (size_t)lv->n * sb;
    if (!(h[a] = rlm__malloc(n ? n : 1))) return rlm__err_nomem(err, "a snapshot's layer", n);
    if (!down) rlm__kv_export(twin, 0, lv, a, h[a]);
    cudaError_t e = copy_row(cs->st, k, a, row, lv, h[a], down);
    if (e != cudaSuccess) return cuda_fail(err, e, down ? "copying a row to the host" : "copying a row to the device");
  }
  cudaError_t e = cudaStreamSynchronize(cs->st);
  return e == cudaSuccess ? RLM_OK : cuda_fail(err, e, "copying a row");
}

static void free_bufs(void *h[6]) {
  for (int a = 0; a < 6; a++) rlm__free(h[a]), h[a] = NULL;
}

static rlm_status cuda_row_out(const rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err) {
  const cuda_sess *cs = s->dev;
  rlm_status rc = RLM_OK;
  for (int i = 0; !rc && i < s->m->cfg.n_layers; i++) {
    if (!twin[i]) continue;
    const rlm_kv_live lv = row_live(&cs->kv[i], s->rows[row].pos, row_top(s, row));
    void *h[6] = {0};
    rc = layer_copy(s, i, row, twin[i], &lv, h, true, err);
    if (!rc) rc = rlm__kv_import(twin[i], 0, &lv, (const void *const *)h, err);
    free_bufs(h);
  }
  return rc;
}

/* Whether the device cache k can hold positions lv in place. */
static bool fits(const rlm_cuda_kv *k, const rlm_kv_live *lv) {
  return k->ring ? lv->n - lv->n_sinks <= k->ring && lv->n_sinks <= k->keep : lv->offset <= k->cap;
}

static rlm_status cuda_row_in(rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err) {
  cuda_sess *cs = s->dev;
  int64_t top = 0;
  for (int i = 0; i < s->m->cfg.n_layers; i++) { /* every check before the first copy */
    rlm_kv_live lv;
    if (!twin[i]) continue;
    rlm_status rc = rlm__kv_live(twin[i], 0, &lv, err);
    if (rc) return rc;
    if (!fits(&cs->kv[i], &lv))
      return rlm__err(err, RLM_ERR_FORMAT, "snapshot: layer %d holds %lld positions, more than its GPU cache's %lld",
                      i, (long long)lv.n, (long long)cs->kv[i].cap);
    /* the highest write that explains what the ring lacks (row_live's rule) */
    top = RLM_MAX(top, cs->kv[i].ring && lv.first > lv.n_sinks ? lv.first + cs->kv[i].ring : lv.offset);
  }
  rlm_status rc = RLM_OK;
  for (int i = 0; !rc && i < s->m->cfg.n_layers; i++) {
    rlm_kv_live lv;
    if (!twin[i]) continue;
    void *h[6] = {0};
    rc = rlm__kv_live(twin[i], 0, &lv, err);
    if (!rc) rc = layer_copy(s, i, row, twin[i], &lv, h, false, err);
    free_bufs(h);
  }
  if (!rc) cs->top[row] = top;
  return rc;
}
