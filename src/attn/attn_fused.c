/* attn_fused.c -- the attention kernel of the decode loop (attn.h):
 * position-masked attention over KV segments in one pass, without
 * allocating and without ever dequantizing the cache.
 *
 * attn_ref.c is the definition; tests/test_attn.c checks every variant
 * here against it and bench/bench_attn.c measures them.
 *
 * THE PASS. Slots are taken in tiles of up to TILE slots that some query
 * row can see (empty slots and slots outside every query's window are
 * skipped before any K or V byte is read). For each tile:
 *
 *   scores   s[q][t] = scale * q . k_t for the tile's slots and all query
 *            rows; each K register is loaded once for every row (GQA)
 *   mask     s = -inf where not visible (attn.h's rule; skipped when the
 *            tile's position range is visible to every row, as in decode)
 *   softmax  online: m' = max(m, max_t s), alpha = exp(m - m'),
 *            p = exp(s - m'), l = alpha * l + sum p
 *   accum    acc = alpha * acc + sum_t p[t] * v_t, each V row loaded once
 *            for every query row
 *
 * and at the end out = acc / l (zeros where nothing was visible).
 *
 * QUANTIZED K is never dequantized: per group, q . k = s * sum(q_j c_j) +
 * b * sum(q_j), where the group sums of q are computed once per segment
 * and the codes c_j only widened to floats. The vector tables fold s in
 * as they widen (c_j * s is exact for f16 and bf16 scales: at most 8 + 11
 * significant bits), so a row's groups accumulate in one register per
 * query row and only b * sum(q_j) is added per group, after the
 * reduction. QUANTIZED V is dequantized one register at a time (c * s + b)
 * right before it is multiplied by the weights, so a V row is never
 * written anywhere.
 *
 * INT8 QUERIES (attn.h, a->int8_q: act_bits 8, as llama.cpp makes Q q8_0
 * for a q4_0 K cache). With 4-bit K the vector tables can score with
 * integers instead: each query row is quantized once per call into
 * qdot.c's nibble layout (rlm__q8act_quantize: int8 codes per block of 32
 * with d_b = max|q| / 127; in each chunk of 128 elements the even ones,
 * then the odd ones, so they meet a K row's low and high nibbles with no
 * shuffle). Per step of 64 codes (32 bytes) of a slot, for the 4 rows of
 * a register block (GQA: one K load serves them all), i8_step_sums makes
 * the integer sums over the step's two blocks, one int32 lane per (row,
 * block): vpmaddubsw twice and vpaddw per row, then a tree of vphaddw
 * across the rows and one vpmaddwd (AVX2), or two vpdpbusd per row and a
 * tree of vphaddd (VNNI). Those, exact in float, times d_b (qdt, a table
 * made per call) times s_g go into one f32 register per slot: a convert,
 * a multiply and an FMA per 4 rows and 64 codes, where the exact path
 * spends 32 FMAs and the widening. score_finish adds b_g * sum_g(q) as on
 * the exact path. The scalar table "scalar-i8" computes the same sums a
 * block at a time in natural order: the definition the others are tested
 * against (rlm__attn_i8_isums shows each one's integer sums). Measured
 * with bench_attn (one thread, AVX2, a Zen 2 EPYC; q4 g64 K and V, 16384
 * slots, 4 rows): the integer scores take about 0.63x the time of the
 * exact ones, the whole call 0.8x; the V pass, unchanged, is now the
 * larger half. The VNNI variant shares every line but the two
 * instructions and has not been timed here (no such CPU).
 *
 * 4-BIT ORDER. Widening 4-bit codes in their natural order needs a byte
 * interleave; the vector tables skip it: a block of B codes (B = 2 x the
 * register width: 16 for AVX2, 32 for AVX-512) is read as B/2 bytes, one
 * byte per lane, and the low nibbles give codes 0, 2, 4, ... of the block,
 * the high nibbles codes 1, 3, 5, .... So K is dotted with a copy of q
 * permuted the same way (qk, once per segment), and while the segment's V
 * is 4-bit the accumulator rows are kept in that order too (permuted when
 * such a segment starts, restored when it ends). Group sums do not care.
 * AVX-512 then widens 4-bit codes with a table instead of a conversion:
 * vpermps indexes 16 floats by the low 4 bits of each lane, so the byte
 * and the byte >> 4 select the two nibbles' entries directly. The table
 * (one register per slot and group, never stored) is c * s for K and
 * c * s + b for V: one multiply or FMA per slot and group instead of a
 * mask, a conversion and an FMA per 16 values.
 *
 * MEMORY. The kernels are written to be bound by the bytes they read: per
 * slot the vector score kernels ask for the rows about PF_BYTES ahead
 * (job_prefetch), since a decode step reads each cache row once and the
 * V pass's column order defeats the hardware prefetchers.
 *
 * VARIANTS. One driver (this file's first half) and three kernel tables:
 * scalar (portable C, expf), AVX2+FMA+F16C and AVX-512 (F/BW/VL/DQ). The
 * library is built for baseline x86-64, so the vector functions carry
 * target attributes and are only reached after __builtin_cpu_supports.
 * The vector tables handle dim_k and dim_v that are multiples of 16 (every
 * real head dimension); other shapes take the scalar table. Per format:
 * dense f32/f16/bf16 and 4- and 8-bit codes are widened with vector
 * instructions; 2, 3, 5 and 6 bits (codes straddle words) go through
 * rlm__quant_get, a lane at a time, and are correct rather than fast.
 * The scalar table decodes every element through rlm__load_f or
 * rlm__quant_get (portable, ~20x slower than the vector tables).
 * Query rows are processed in register blocks of QB = 4, so n_q = 4 (the
 * usual GQA group) loads each K and V register once.
 *
 * NUMERICS. Everything is f32. Differences from the reference are
 * rounding only: dot products summed in lane order and per group, FMAs,
 * the online rescaling, and (vector tables) exp from a Cephes-style
 * polynomial with a relative error of about 2 ulp (the scalar table uses
 * expf). Results do not depend on slot order beyond that rounding.
 *
 * SCRATCH (floats, carved in this order; none depends on the slot count):
 *   acc   [n_q][dim_v]     unnormalised output rows
 *   m, l, alpha [n_q] each running max, running sum, tile rescale factor
 *   s     [n_q][TILE]      the tile's scores, then its weights
 *   qsum  [GK][n_q]        group sums of q for the segment's K groups
 *   qperm [n_q][dim_k]     q in 4-bit order (4-BIT ORDER above)
 *   sbk   [TILE][GK][2]    the tile's K scales and biases widened to f32
 *   sbv   [TILE][GV][2]    the same for V
 * with GK = ceil(dim_k / 32), GV = ceil(dim_v / 32) (32: smallest group):
 *   n_q * (dim_k + dim_v + TILE + GK + 3) + 2 * TILE * (GK + GV);
 * and where dim_k is a multiple of 64 (INT8 QUERIES):
 *   qpad  [C]              a query row padded with zeros to C elements
 *   qi    [n_q][QR bytes]  the query rows quantized (nibble layout)
 *   qdt   [NB][dim_k/64][8] d_b of each step for each block of 4 rows
 * with C = dim_k rounded up to 128 (the layout's chunk), QR =
 * rlm__q8act_bytes(C) rounded up to 64 and NB = ceil(n_q / 4):
 * C + n_q * QR / 4 + NB * dim_k / 8 floats more.
 */
#include "attn/attn.h"

#include <stdatomic.h>

enum {
  TILE = 64,       /* slots per tile: with f16 rows of 128 the tile's K  */
                   /* and V (16 KB each) stay in L1 between the passes   */
  QB = 4,          /* query rows per register block                      */
  PF_BYTES = 32768,/* how far ahead (K + V bytes) rows are prefetched    */
  PF_L1_BYTES = 20000, /* tiles of K + V up to this go to L1, not L2 */
  SIMD_DIM = 16,   /* vector tables need dims that are multiples of this */
  BLK = 128,       /* scalar table: elements decoded at a time (>= G)    */
  GROUP_MIN = 32,  /* smallest quantization group                        */
  I8_STEP = 64,    /* int8 queries: K codes per integer step (32 bytes)  */
  I8_CHUNK = 128,  /* int8 queries: the nibble layout's chunk            */
};

/* How a segment's K or V is stored, as the kernels branch on it. */
typedef enum mat_fmt {
  FMT_F32,
  FMT_F16,
  FMT_BF16,
  FMT_Q4,   /* first quantized format: fmt >= FMT_Q4 means quantized */
  FMT_Q8,
  FMT_QANY, /* 2, 3, 5, 6 bits: codes read with rlm__quant_get       */
} mat_fmt;

/* One call's state. The driver fills it; the kernels read the tile and
 * write s (scores, weights) and acc. Lives on the caller's stack. */
typedef struct attn_job {
  const rlm_attn_args *a;
  int64_t q_min, q_max; /* range of q_pos over all rows                    */
  int64_t q_seeing_min; /* smallest q_pos >= 0 (rows < 0 see nothing)      */
  float *acc;           /* [n_q][dim_v]                                    */
  float *m, *l, *alpha; /* [n_q] each                                      */
  float *s;             /* [n_q][TILE]                                     */
  float *qsum;          /* [ngk][n_q]                                      */
  float *qperm;         /* [n_q][dim_k]                                    */
  float *sbk, *sbv;     /* [TILE][ngk][2], [TILE][ngv][2]                  */
  float *qpad;          /* [i8_cols] (int8 queries)                        */
  uint8_t *qi;          /* [n_q][qi_stride] (int8 queries)                 */
  float *qdt;           /* [n_q/QB][dim_k/64][8] d_b by step (int8)        */
  size_t qi_stride;     /* i8_row_bytes(dim_k)                             */
  int64_t qi_cols;      /* i8_cols(dim_k): a quantized row's length        */
  bool qi_ready;        /* qi holds this call's query rows                 */
  const struct attn_isa *isa;
  int acc_block;        /* acc rows in 4-bit order of this block (0: not)  */
  /* the segment being processed */
  const rlm_attn_seg *seg;
  const float *qk;      /* q as the K kernel reads it: a->q or qperm       */
  void (*scores)(struct attn_job *j); /* isa's scores or scores_i8          */
  int64_t pf_ahead;     /* slots between the tile's end and prefetching    */
  bool pf_l1;           /* prefetch into L1 (small rows) rather than L2    */
  mat_fmt kfmt, vfmt;
  int ngk, ngv;         /* groups per K / V row (0: dense)                 */
  int kg_shift;         /* log2 of K's group size (quantized K)            */
  size_t kstride, vstride; /* bytes from one K (V) row to the next        */
  size_t kbytes, vbytes;   /* bytes of one row that the kernels read      */
  /* the tile */
  int n;                      /* slots in the tile                         */
  bool all_visible;           /* every query row sees every slot           */
  int64_t idx[TILE];          /* the slots' indices in the segment         */
  const void *krow[TILE];     /* their K rows                              */
  const void *vrow[TILE];     /* their V rows                              */
  int64_t next;               /* first slot after the tile (prefetching)   */
} attn_job;

/* A kernel table. Each kernel works on the job's current tile. */
typedef struct attn_isa {
  int dim_multiple;            /* dims it handles; others go to scalar  */
  int q4_block;                /* 4-bit order block (0: natural order)  */
  void (*widen)(attn_job *j);  /* sbk, sbv of the tile (quantized only) */
  void (*scores)(attn_job *j); /* s[q][t] = scale * q . k_t (unmasked) */
  void (*softmax)(attn_job *j);/* online update; s becomes weights      */
  void (*accum)(attn_job *j);  /* acc = alpha * acc + sum_t p v_t       */
  /* int8 queries (NULL: this table scores 4-bit K exactly) */
  void (*scores_i8)(attn_job *j);                         /* as scores  */
  void (*quantize_q)(const float *x, int64_t cols, void *out); /* a row */
} attn_isa;

static int groups_max(int dim) { return (RLM_MAX(dim, 0) + GROUP_MIN - 1) / GROUP_MIN; }

/* INT8 QUERIES: whether dim_k can take them, a row's length in the
 * nibble layout, and the scratch bytes of one quantized row. */
static bool i8_dim_ok(int dim_k) { return dim_k > 0 && dim_k % I8_STEP == 0; }
static int64_t i8_cols(int dim_k) { return (int64_t)(dim_k + I8_CHUNK - 1) / I8_CHUNK * I8_CHUNK; }
static size_t i8_row_bytes(int dim_k) {
  return (rlm__q8act_bytes(i8_cols(dim_k)) + 63) & ~(size_t)63;
}
/* Floats of the d table (job_quantize_q): 8 per step per block of QB rows. */
static size_t i8_dt_floats(int n_q, int dim_k) {
  return (size_t)((n_q + QB - 1) / QB) * (size_t)(dim_k / I8_STEP) * 8;
}

size_t rlm__attn_scratch_floats(int n_q, int dim_k, int dim_v) {
  const size_t nq = (size_t)RLM_MAX(n_q, 0);
  const size_t gk = (size_t)groups_max(dim_k), gv = (size_t)groups_max(dim_v);
  const size_t dk = (size_t)RLM_MAX(dim_k, 0), dv = (size_t)RLM_MAX(dim_v, 0);
  const size_t i8 = i8_dim_ok(dim_k) ? (size_t)i8_cols(dim_k) + nq * i8_row_bytes(dim_k) / 4 +
                                         i8_dt_floats(n_q, dim_k) : 0;
  return nq * (dk + dv + TILE + gk + 3) + 2 * TILE * (gk + gv) + i8;
}

/* ========================================================================
 * The driver: tiles, mask, bookkeeping of the online softmax.
 * ====================================================================== */

static void job_init(attn_job *j, const struct attn_isa *isa, const rlm_attn_args *a,
                     float *scratch) {
  const size_t nq = (size_t)a->n_q;
  j->a = a;
  j->isa = isa;
  j->acc_block = 0;
  j->acc = scratch;
  j->m = j->acc + nq * (size_t)a->dim_v;
  j->l = j->m + nq;
  j->alpha = j->l + nq;
  j->s = j->alpha + nq;
  j->qsum = j->s + nq * TILE;
  j->qperm = j->qsum + nq * (size_t)groups_max(a->dim_k);
  j->sbk = j->qperm + nq * (size_t)a->dim_k;
  j->sbv = j->sbk + 2 * TILE * (size_t)groups_max(a->dim_k);
  j->qpad = j->sbv + 2 * TILE * (size_t)groups_max(a->dim_v);
  j->qi = (uint8_t *)(j->qpad + i8_cols(a->dim_k));
  j->qi_cols = i8_cols(a->dim_k);
  j->qi_stride = i8_dim_ok(a->dim_k) ? i8_row_bytes(a->dim_k) : 0;
  j->qi_ready = false;
  j->qdt = (float *)(j->qi + (size_t)a->n_q * j->qi_stride);
  memset(j->acc, 0, nq * (size_t)a->dim_v * sizeof *j->acc);
  j->q_min = j->q_seeing_min = INT64_MAX;
  j->q_max = INT64_MIN;
  for (int q = 0; q < a->n_q; q++) {
    const int64_t qp = a->q_pos[q];
    j->m[q] = -INFINITY;
    j->l[q] = 0.0f;
    j->q_min = RLM_MIN(j->q_min, qp);
    j->q_max = RLM_MAX(j->q_max, qp);
    if (qp >= 0) j->q_seeing_min = RLM_MIN(j->q_seeing_min, qp);
  }
}

static mat_fmt fmt_of(const rlm_attn_mat *m) {
  if (m->bits == 4) return FMT_Q4;
  if (m->bits == 8) return FMT_Q8;
  if (m->bits) return FMT_QANY;
  if (m->dtype == RLM_DTYPE_F16) return FMT_F16;
  return m->dtype == RLM_DTYPE_BF16 ? FMT_BF16 : FMT_F32;
}

/* Reorders each block of `blk` floats (4-BIT ORDER): natural -> even
 * elements then odd elements, or back (inverse). */
static void rows_reorder(float *x, int n, int blk, bool inverse) {
  float t[64];
  const int h = blk / 2;
  if (!RLM_CHECK(blk <= 64 && n % blk == 0)) return; /* t[] holds one block */
  for (int b = 0; b < n; b += blk) {
    memcpy(t, x + b, (size_t)blk * sizeof *t);
    for (int i = 0; i < h && !inverse; i++) x[b + i] = t[2 * i], x[b + h + i] = t[2 * i + 1];
    for (int i = 0; i < h && inverse; i++) x[b + 2 * i] = t[i], x[b + 2 * i + 1] = t[h + i];
  }
}

/* Puts the accumulator rows in 4-bit order of `blk` (0: natural). */
static void job_acc_order(attn_job *j, int blk) {
  const int n = j->a->n_q * j->a->dim_v;
  if (j->acc_block == blk) return;
  if (j->acc_block) rows_reorder(j->acc, n, j->acc_block, true);
  if (blk) rows_reorder(j->acc, n, blk, false);
  j->acc_block = blk;
}

/* qsum[g][q] = sum of q row q over group g, in order (as
 * rlm__group_sums, transposed: the kernels load the rows of one group
 * together). */
static void job_group_sums(attn_job *j, int G) {
  const rlm_attn_args *a = j->a;
  for (int q = 0; q < a->n_q; q++)
    for (int g = 0; g < a->dim_k / G; g++) {
      const float *x = a->q + (size_t)q * a->dim_k + (size_t)g * G;
      float sum = 0.0f;
      for (int e = 0; e < G; e++) sum += x[e];
      j->qsum[g * a->n_q + q] = sum;
    }
}

/* Bytes per element (dense) or per u32 word (quantized). */
static size_t elem_bytes(const rlm_attn_mat *m) {
  return m->bits ? sizeof(uint32_t) : rlm_dtype_size(m->dtype);
}

/* Bytes of the first `dim` elements of a row. */
static size_t row_bytes(const rlm_attn_mat *m, int dim) {
  return m->bits ? (size_t)dim * (size_t)m->bits / 8 : (size_t)dim * elem_bytes(m);
}

/* INT8 QUERIES: row q quantized -- its codes, and the d of its blocks as
 * qdot.c lays them out: xd16 (one per int32 lane of a 128-chunk) and d
 * (one per block). */
static const int8_t *i8_xq(const attn_job *j, int q) {
  return (const int8_t *)(j->qi + (size_t)q * j->qi_stride);
}
static const float *i8_xd16(const attn_job *j, int q) {
  return (const float *)(i8_xq(j, q) + j->qi_cols);
}
static const float *i8_d(const attn_job *j, int q) {
  return i8_xd16(j, q) + j->qi_cols / I8_CHUNK * 16;
}

/* qdt: for each block of QB rows and step u, lane i (< QB) holds row
 * q0+i's d of block 2u and lane QB+i its d of block 2u+1 -- the lanes of
 * i8_step_sums (0 for rows past n_q). */
static void job_d_table(attn_job *j) {
  const int n_q = j->a->n_q, n_u = j->a->dim_k / I8_STEP;
  for (int q0 = 0; q0 < n_q; q0 += QB)
    for (int u = 0; u < n_u; u++) {
      float *dt = j->qdt + ((size_t)(q0 / QB) * n_u + u) * 8;
      for (int l = 0; l < 8; l++) {
        const int q = q0 + l % QB;
        dt[l] = q < n_q ? i8_d(j, q)[2 * u + l / QB] : 0.0f;
      }
    }
}

/* Quantizes the query rows, once per call (they are the same for every
 * segment); a row short of a whole chunk is padded with zeros, whose
 * codes no kernel reads. */
static void job_quantize_q(attn_job *j) {
  const rlm_attn_args *a = j->a;
  const int64_t cols = j->qi_cols;
  if (j->qi_ready) return;
  for (int q = 0; q < a->n_q; q++) {
    const float *x = a->q + (size_t)q * a->dim_k;
    if (cols != a->dim_k) {
      memcpy(j->qpad, x, (size_t)a->dim_k * sizeof *x);
      memset(j->qpad + a->dim_k, 0, (size_t)(cols - a->dim_k) * sizeof *x);
      x = j->qpad;
    }
    j->isa->quantize_q(x, cols, j->qi + (size_t)q * j->qi_stride);
  }
  job_d_table(j);
  j->qi_ready = true;
}

/* Whether this segment's K is scored with int8 queries (attn.h). */
static bool job_uses_i8(const attn_job *j) {
  return j->a->int8_q && j->isa->scores_i8 && j->kfmt == FMT_Q4 && i8_dim_ok(j->a->dim_k);
}

static void job_segment(attn_job *j, const rlm_attn_seg *seg) {
  const rlm_attn_args *a = j->a;
  j->seg = seg;
  j->kfmt = fmt_of(&seg->k);
  j->vfmt = fmt_of(&seg->v);
  j->kstride = (size_t)seg->k.row_stride * elem_bytes(&seg->k);
  j->vstride = (size_t)seg->v.row_stride * elem_bytes(&seg->v);
  j->kbytes = row_bytes(&seg->k, a->dim_k);
  j->vbytes = row_bytes(&seg->v, a->dim_v);
  j->pf_ahead = RLM_MAX((int64_t)(PF_BYTES / (j->kbytes + j->vbytes)) - TILE, 0);
  j->pf_l1 = (j->kbytes + j->vbytes) * TILE <= PF_L1_BYTES;
  j->ngk = seg->k.bits ? a->dim_k / seg->k.group_size : 0;
  j->kg_shift = seg->k.bits ? __builtin_ctz((unsigned)seg->k.group_size) : 0;
  j->ngv = seg->v.bits ? a->dim_v / seg->v.group_size : 0;
  RLM_ASSERT(!seg->k.bits || a->dim_k % seg->k.group_size == 0);
  RLM_ASSERT(!seg->v.bits || a->dim_v % seg->v.group_size == 0);
  if (seg->k.bits) job_group_sums(j, seg->k.group_size);
  const int blk = j->isa->q4_block;
  j->qk = a->q;
  j->scores = j->isa->scores;
  if (job_uses_i8(j)) {
    job_quantize_q(j);
    j->scores = j->isa->scores_i8;
  } else if (blk && j->kfmt == FMT_Q4) {
    memcpy(j->qperm, a->q, (size_t)a->n_q * (size_t)a->dim_k * sizeof *j->qperm);
    rows_reorder(j->qperm, a->n_q * a->dim_k, blk, false);
    j->qk = j->qperm;
  }
  job_acc_order(j, blk && j->vfmt == FMT_Q4 ? blk : 0);
}

/* False only if no query row can see position kp: empty, after every
 * query, or at least window - sink before the earliest query that sees
 * anything (and not a sink). A slot that passes may still be masked for
 * every row (gaps between query positions); the mask step handles that
 * exactly. */
static bool slot_live(const attn_job *j, int64_t kp) {
  const rlm_attn_args *a = j->a;
  if (kp < 0 || kp > j->q_max) return false;
  return a->window == 0 || kp < a->sink || kp > j->q_seeing_min - (a->window - a->sink);
}

/* True if every query row sees every position in [lo, hi] (lo >= 0). */
static bool range_visible(const attn_job *j, int64_t lo, int64_t hi) {
  const rlm_attn_args *a = j->a;
  if (hi > j->q_min) return false;
  return a->window == 0 || hi < a->sink || j->q_max - lo < a->window - a->sink;
}

/* Fills the tile with the next live slots from slot i on; returns the
 * index after the last slot looked at. */
static int64_t job_gather(attn_job *j, int64_t i) {
  const rlm_attn_seg *seg = j->seg;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  j->n = 0;
  for (; i < seg->n && j->n < TILE; i++) {
    const int64_t kp = seg->pos[i];
    if (!slot_live(j, kp)) continue;
    lo = RLM_MIN(lo, kp);
    hi = RLM_MAX(hi, kp);
    j->idx[j->n] = i;
    j->krow[j->n] = (const char *)seg->k.data + (size_t)i * j->kstride;
    j->vrow[j->n] = (const char *)seg->v.data + (size_t)i * j->vstride;
    j->n++;
  }
  j->all_visible = j->n > 0 && range_visible(j, lo, hi);
  j->next = i;
  return i;
}

/* Masks the scores by position (unless the whole tile is visible); pads
 * each row with -inf to a multiple of 16 so the vector softmax reads whole
 * registers. */
static void job_mask(attn_job *j) {
  const rlm_attn_args *a = j->a;
  const int n_pad = (j->n + 15) & ~15;
  for (int q = 0; q < a->n_q; q++) {
    float *r = j->s + (size_t)q * TILE;
    for (int t = 0; t < j->n && !j->all_visible; t++)
      if (!rlm__attn_visible(a->q_pos[q], j->seg->pos[j->idx[t]], a->window, a->sink))
        r[t] = -INFINITY;
    for (int t = j->n; t < n_pad; t++) r[t] = -INFINITY;
  }
}

/* Softmax bookkeeping shared by the tables. A row that sees nothing in
 * this tile keeps its state (alpha 1) and gets zero weights. */
static void softmax_skip(attn_job *j, int q) {
  j->alpha[q] = 1.0f;
  memset(j->s + (size_t)q * TILE, 0, (size_t)j->n * sizeof(float));
}

/* m_new is finite here; alpha is 0 when the row had seen nothing (m = -inf,
 * and then acc and l are 0 too). */
static void softmax_update(attn_job *j, int q, float m_new, float sum) {
  j->alpha[q] = expf(j->m[q] - m_new);
  j->l[q] = j->l[q] * j->alpha[q] + sum;
  j->m[q] = m_new;
}

static void job_finish(attn_job *j) {
  const rlm_attn_args *a = j->a;
  job_acc_order(j, 0);
  for (int q = 0; q < a->n_q; q++) {
    const float *acc = j->acc + (size_t)q * a->dim_v;
    float *out = a->out + (size_t)q * a->dim_v;
    const float l = j->l[q];
    for (int e = 0; e < a->dim_v; e++) out[e] = l > 0 ? acc[e] / l : 0.0f;
    if (a->lse) a->lse[q] = l > 0 ? j->m[q] + logf(l) : -INFINITY;
  }
}

/* The scales and biases of slot i (a few bytes: one line serves many
 * slots, and prefetching a line already on its way costs little). */
static inline void mat_prefetch_sb(const rlm_attn_mat *m, int64_t i) {
  const size_t o = (size_t)(i * m->sb_stride) * (m->dtype == RLM_DTYPE_F32 ? 4 : 2);
  __builtin_prefetch((const char *)m->scales + o, 0, 2);
  __builtin_prefetch((const char *)m->biases + o, 0, 2);
}

/* Asks for the K and V rows (and scales, biases) of the slot about
 * PF_BYTES ahead of slot t of the tile; the vector score kernels call this
 * once per slot, spreading the requests over the tile's work. The V pass
 * walks a tile column by column, which hardware prefetchers do not
 * follow, and K, V, scales and biases are up to six streams: without
 * this a cache read from memory is bound by latency, at half the
 * bandwidth or less. Small rows (quantized) go to L1, whole f16 tiles
 * would not fit next to the tile being computed and go to L2. */
static inline void job_prefetch(const attn_job *j, int t) {
  const int64_t i = j->next + j->pf_ahead + t;
  if (i >= j->seg->n) return;
  const char *k = (const char *)j->seg->k.data + (size_t)i * j->kstride;
  const char *v = (const char *)j->seg->v.data + (size_t)i * j->vstride;
  if (j->pf_l1) {
    for (size_t b = 0; b < j->kbytes; b += 64) __builtin_prefetch(k + b, 0, 3);
    for (size_t b = 0; b < j->vbytes; b += 64) __builtin_prefetch(v + b, 0, 3);
  } else {
    for (size_t b = 0; b < j->kbytes; b += 64) __builtin_prefetch(k + b, 0, 2);
    for (size_t b = 0; b < j->vbytes; b += 64) __builtin_prefetch(v + b, 0, 2);
  }
  if (j->ngk) mat_prefetch_sb(&j->seg->k, i);
  if (j->ngv) mat_prefetch_sb(&j->seg->v, i);
}

static const attn_isa isa_scalar;

static void attn_run(const attn_isa *isa, const rlm_attn_args *a, float *scratch) {
  if (a->n_q <= 0) return;
  if (a->dim_k % isa->dim_multiple || a->dim_v % isa->dim_multiple) isa = &isa_scalar;
  attn_job j;
  job_init(&j, isa, a, scratch);
  for (int s = 0; s < a->n_segs; s++) {
    if (a->segs[s].n <= 0) continue;
    job_segment(&j, &a->segs[s]);
    for (int64_t i = 0; i < a->segs[s].n;) {
      i = job_gather(&j, i);
      if (j.n == 0) continue;
      isa->widen(&j);
      j.scores(&j);
      job_mask(&j);
      isa->softmax(&j);
      isa->accum(&j);
    }
  }
  job_finish(&j);
}

/* ========================================================================
 * Scalar table: the portable fallback, and the one for odd dimensions.
 * Rows are decoded BLK (or one group of) elements at a time into a stack
 * buffer, then used for every query row.
 * ====================================================================== */

/* Elements [e0, e0+n) of a row as floats: the values (dense) or the codes. */
static void row_decode(const rlm_attn_mat *m, const void *row, int e0, int n, float *out) {
  if (m->bits)
    for (int i = 0; i < n; i++) out[i] = (float)rlm__quant_get(row, e0 + i, m->bits);
  else
    for (int i = 0; i < n; i++) out[i] = rlm__load_f(row, m->dtype, e0 + i);
}

static void widen_mat_scalar(const attn_job *j, const rlm_attn_mat *m, int ng, float *out) {
  for (int t = 0; t < j->n && m->bits; t++) {
    const int64_t o = j->idx[t] * m->sb_stride;
    for (int g = 0; g < ng; g++) {
      out[(t * ng + g) * 2] = rlm__load_f(m->scales, m->dtype, o + g);
      out[(t * ng + g) * 2 + 1] = rlm__load_f(m->biases, m->dtype, o + g);
    }
  }
}

static void widen_scalar(attn_job *j) {
  widen_mat_scalar(j, &j->seg->k, j->ngk, j->sbk);
  widen_mat_scalar(j, &j->seg->v, j->ngv, j->sbv);
}

static float dot_scalar(const float *x, const float *y, int n) {
  float d = 0.0f;
  for (int i = 0; i < n; i++) d += x[i] * y[i];
  return d;
}

static void scores_scalar(attn_job *j) {
  const rlm_attn_args *a = j->a;
  const rlm_attn_mat *km = &j->seg->k;
  const int dk = a->dim_k, blk = km->bits ? km->group_size : BLK;
  float buf[BLK];
  for (int t = 0; t < j->n; t++) {
    for (int q = 0; q < a->n_q; q++) j->s[(size_t)q * TILE + t] = 0.0f;
    for (int e0 = 0, g = 0; e0 < dk; e0 += blk, g++) {
      const int nb = RLM_MIN(blk, dk - e0);
      const float *sb = j->sbk + (t * j->ngk + g) * 2;
      row_decode(km, j->krow[t], e0, nb, buf);
      for (int q = 0; q < a->n_q; q++) {
        const float d = dot_scalar(a->q + (size_t)q * dk + e0, buf, nb);
        const float term = km->bits ? sb[0] * d + sb[1] * j->qsum[g * a->n_q + q] : d;
        j->s[(size_t)q * TILE + t] += term;
      }
    }
    for (int q = 0; q < a->n_q; q++) j->s[(size_t)q * TILE + t] *= a->scale;
  }
}

/* ---- int8 queries: the definition --------------------------------------- */

/* Where element e's code sits in qdot.c's nibble layout: per chunk of 128,
 * the even elements, then the odd ones. */
static int64_t i8_pos(int64_t e) {
  const int64_t k = e % I8_CHUNK;
  return e - k + (k % 2 ? I8_CHUNK / 2 + k / 2 : k / 2);
}

/* isum_b = sum over block b (32 elements) of code_e * qi_e, in order. */
static int32_t i8_isum_scalar(const void *krow, const int8_t *xq, int b) {
  int32_t sum = 0;
  for (int e = 32 * b; e < 32 * b + 32; e++)
    sum += (int32_t)rlm__quant_get(krow, e, 4) * xq[i8_pos(e)];
  return sum;
}

/* scale * (sum_b isum_b * (d_b * s_g(b)) + sum_g b_g * qsum_g): the
 * per-block products as rlm__qmv_q8_ref forms them. */
static void scores_i8_scalar(attn_job *j) {
  const rlm_attn_args *a = j->a;
  const int G = j->seg->k.group_size, ngk = j->ngk;
  for (int t = 0; t < j->n; t++) {
    const float *sb = j->sbk + (size_t)t * ngk * 2;
    for (int q = 0; q < a->n_q; q++) {
      const int8_t *xq = i8_xq(j, q);
      const float *d = i8_d(j, q);
      float acc = 0.0f;
      for (int b = 0; b < a->dim_k / 32; b++)
        acc += (float)i8_isum_scalar(j->krow[t], xq, b) * (d[b] * sb[2 * (32 * b / G)]);
      for (int g = 0; g < ngk; g++) acc += sb[2 * g + 1] * j->qsum[g * a->n_q + q];
      j->s[(size_t)q * TILE + t] = acc * a->scale;
    }
  }
}

static void softmax_scalar(attn_job *j) {
  for (int q = 0; q < j->a->n_q; q++) {
    float *r = j->s + (size_t)q * TILE;
    float mx = -INFINITY;
    for (int t = 0; t < j->n; t++) mx = r[t] > mx ? r[t] : mx;
    if (mx == -INFINITY) {
      softmax_skip(j, q);
      continue;
    }
    const float m_new = RLM_MAX(j->m[q], mx);
    float sum = 0.0f;
    for (int t = 0; t < j->n; t++) {
      r[t] = expf(r[t] - m_new); /* masked: expf(-inf) = 0 */
      sum += r[t];
    }
    softmax_update(j, q, m_new, sum);
  }
}

static void accum_scalar(attn_job *j) {
  const rlm_attn_args *a = j->a;
  const rlm_attn_mat *vm = &j->seg->v;
  const int dv = a->dim_v, blk = vm->bits ? vm->group_size : BLK;
  float buf[BLK];
  for (int q = 0; q < a->n_q; q++)
    for (int e = 0; e < dv && j->alpha[q] != 1.0f; e++) j->acc[(size_t)q * dv + e] *= j->alpha[q];
  for (int t = 0; t < j->n; t++) {
    for (int e0 = 0, g = 0; e0 < dv; e0 += blk, g++) {
      const int nb = RLM_MIN(blk, dv - e0);
      const float *sb = j->sbv + (t * j->ngv + g) * 2;
      row_decode(vm, j->vrow[t], e0, nb, buf);
      for (int i = 0; i < nb && vm->bits; i++) buf[i] = buf[i] * sb[0] + sb[1];
      for (int q = 0; q < a->n_q; q++) {
        const float p = j->s[(size_t)q * TILE + t];
        float *o = j->acc + (size_t)q * dv + e0;
        for (int i = 0; i < nb && p != 0.0f; i++) o[i] += p * buf[i];
      }
    }
  }
}

/* The scalar tables: exact scores, or (the reference for int8 queries,
 * never picked by rlm__attn_fused: a CPU without vector integer products
 * keeps the exact path) the integer scores written out. */
#define ISA_SCALAR(scores_int8, quantize)                                      \
  {.dim_multiple = 1, .q4_block = 0, .widen = widen_scalar,                    \
   .scores = scores_scalar, .softmax = softmax_scalar, .accum = accum_scalar,  \
   .scores_i8 = (scores_int8), .quantize_q = (quantize)}
static const attn_isa isa_scalar = ISA_SCALAR(NULL, NULL);
static const attn_isa isa_scalar_i8 = ISA_SCALAR(scores_i8_scalar, rlm__q8act_quantize_ref);

static void fused_scalar(const rlm_attn_args *a, float *scratch) {
  attn_run(&isa_scalar, a, scratch);
}

static void fused_scalar_i8(const rlm_attn_args *a, float *scratch) {
  attn_run(&isa_scalar_i8, a, scratch);
}

#if defined(__x86_64__)

#include <immintrin.h>

#define RLM_F16C __attribute__((target("f16c")))
#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define RLM_INLINE inline __attribute__((always_inline))

/* exp(x) for x <= 0 (Cephes expf): x = n ln2 + r with |r| <= ln2/2, a
 * degree-7 polynomial for e^r, times 2^n. About 2 ulp; below EXP_LO (the
 * log of the smallest normal float, and -inf) the result is 0. */
#define EXP_LO -87.33654f
#define EXP_HI 88.37626f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

/* Scales and biases of the tile widened with F16C (rlm__f16_to_f32 is an
 * out-of-line call per value, too slow here). */
RLM_F16C static float load_sb_f16c(const void *p, rlm_dtype t, int64_t i) {
  if (t == RLM_DTYPE_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
  if (t == RLM_DTYPE_BF16) return rlm__bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

/* ng f16 scales and biases (of one slot, or of a run of consecutive
 * slots) interleaved as (s, b) pairs and widened up to 8 at a time. */
RLM_F16C static void widen_f16_row(const uint16_t *sc, const uint16_t *bi, int ng, float *d) {
  int g = 0;
  for (; g + 8 <= ng; g += 8) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)(sc + g));
    const __m128i b8 = _mm_loadu_si128((const __m128i *)(bi + g));
    _mm256_storeu_ps(d + 2 * g, _mm256_cvtph_ps(_mm_unpacklo_epi16(s8, b8)));
    _mm256_storeu_ps(d + 2 * g + 8, _mm256_cvtph_ps(_mm_unpackhi_epi16(s8, b8)));
  }
  for (; g + 4 <= ng; g += 4) {
    const __m128i s4 = _mm_loadl_epi64((const __m128i *)(sc + g));
    const __m128i b4 = _mm_loadl_epi64((const __m128i *)(bi + g));
    _mm256_storeu_ps(d + 2 * g, _mm256_cvtph_ps(_mm_unpacklo_epi16(s4, b4)));
  }
  for (; g + 2 <= ng; g += 2) {
    uint32_t s2, b2;
    memcpy(&s2, sc + g, sizeof s2);
    memcpy(&b2, bi + g, sizeof b2);
    const __m128i sb = _mm_unpacklo_epi16(_mm_cvtsi32_si128((int)s2), _mm_cvtsi32_si128((int)b2));
    _mm_storeu_ps(d + 2 * g, _mm_cvtph_ps(sb));
  }
  for (; g < ng; g++) d[2 * g] = _cvtsh_ss(sc[g]), d[2 * g + 1] = _cvtsh_ss(bi[g]);
}

/* The same for bf16 scales and biases: a bf16 is the top half of its
 * f32, so interleaving each (s, b) pair under zeros widens it (SSE2; the
 * per-value loop it replaces was ~2% of a 16k decode step). */
RLM_F16C static void widen_bf16_row(const uint16_t *sc, const uint16_t *bi, int ng, float *d) {
  const __m128i z = _mm_setzero_si128();
  int g = 0;
  for (; g + 8 <= ng; g += 8) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)(sc + g));
    const __m128i b8 = _mm_loadu_si128((const __m128i *)(bi + g));
    const __m128i lo = _mm_unpacklo_epi16(s8, b8), hi = _mm_unpackhi_epi16(s8, b8);
    _mm_storeu_si128((__m128i *)(d + 2 * g), _mm_unpacklo_epi16(z, lo));
    _mm_storeu_si128((__m128i *)(d + 2 * g + 4), _mm_unpackhi_epi16(z, lo));
    _mm_storeu_si128((__m128i *)(d + 2 * g + 8), _mm_unpacklo_epi16(z, hi));
    _mm_storeu_si128((__m128i *)(d + 2 * g + 12), _mm_unpackhi_epi16(z, hi));
  }
  for (; g < ng; g++) d[2 * g] = rlm__bf16_to_f32(sc[g]), d[2 * g + 1] = rlm__bf16_to_f32(bi[g]);
}

RLM_F16C static void widen_mat_f16c(const attn_job *j, const rlm_attn_mat *m, int ng, float *out) {
  if (!m->bits) return;
  const bool run = j->idx[j->n - 1] - j->idx[0] == j->n - 1 && m->sb_stride == ng;
  void (*row)(const uint16_t *, const uint16_t *, int, float *) =
      m->dtype == RLM_DTYPE_F16 ? widen_f16_row : m->dtype == RLM_DTYPE_BF16 ? widen_bf16_row : NULL;
  if (run && row) { /* consecutive slots: one widening of n * ng */
    const int64_t o = j->idx[0] * m->sb_stride;
    row((const uint16_t *)m->scales + o, (const uint16_t *)m->biases + o, j->n * ng, out);
    return;
  }
  for (int t = 0; t < j->n; t++) {
    const int64_t o = j->idx[t] * m->sb_stride;
    if (row) {
      row((const uint16_t *)m->scales + o, (const uint16_t *)m->biases + o, ng, out + t * 2 * ng);
      continue;
    }
    for (int g = 0; g < ng; g++) {
      out[(t * ng + g) * 2] = load_sb_f16c(m->scales, m->dtype, o + g);
      out[(t * ng + g) * 2 + 1] = load_sb_f16c(m->biases, m->dtype, o + g);
    }
  }
}

RLM_F16C static void widen_f16c(attn_job *j) {
  widen_mat_f16c(j, &j->seg->k, j->ngk, j->sbk);
  widen_mat_f16c(j, &j->seg->v, j->ngv, j->sbv);
}

/* Codes e.. of a 2/3/5/6-bit row, one at a time (the generic path). */
static RLM_INLINE void codes_any(const void *row, int e, int bits, int n, float *out) {
  for (int i = 0; i < n; i++) out[i] = (float)rlm__quant_get(row, e + i, bits);
}

/* ========================================================================
 * AVX2 + FMA + F16C: 8 floats per register.
 * ====================================================================== */

/* Elements e..e+7 of a row as floats: values, or codes for quantized rows
 * (LSB-first, so byte k of a 4-bit row holds codes 2k and 2k+1; 4-bit
 * codes come in 4-BIT ORDER with blocks of 16). */
RLM_AVX2 static RLM_INLINE __m256 load8_avx2(mat_fmt f, const void *row, int e, int bits) {
  const uint8_t *b = row;
  switch (f) {
  case FMT_F32: return _mm256_loadu_ps((const float *)row + e);
  case FMT_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * e)));
  case FMT_BF16: {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2 * e)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  case FMT_Q8: {
    const __m128i c = _mm_loadl_epi64((const __m128i *)(b + e));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
  }
  case FMT_Q4: {
    const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + (e & ~15) / 2)));
    const __m256i c = e & 8 ? _mm256_srli_epi32(w, 4) : _mm256_and_si256(w, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(c);
  }
  default: {
    float c[8];
    codes_any(row, e, bits, 8, c);
    return _mm256_loadu_ps(c);
  }
  }
}

/* [sum v0, ..., sum v7]: hadd pairs within 128-bit halves, then add halves. */
RLM_AVX2 static RLM_INLINE __m256 hsum8_avx2(const __m256 *v) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

/* The scores of slots t, t+ns-1 (ns = 1 or 2) for rows q0..q0+nq-1 from
 * r = their dot products [slot t rows 0..3, slot t+1 rows 0..3]: adds
 * b * sum(q) per group (quantized K), scales, stores. Shared by both
 * vector tables. */
RLM_AVX2 static RLM_INLINE void score_finish(attn_job *j, __m256 r, bool quant, int q0, int nq,
                                             int t, int ns) {
  const int t1 = t + ns - 1, ngk = j->ngk;
  const __m128i rows = _mm_cmpgt_epi32(_mm_set1_epi32(nq), _mm_setr_epi32(0, 1, 2, 3));
  for (int g = 0; g < ngk && quant; g++) {
    const __m128 qs = _mm_maskload_ps(j->qsum + g * j->a->n_q + q0, rows);
    const __m256 b = _mm256_blend_ps(_mm256_set1_ps(j->sbk[(t * ngk + g) * 2 + 1]),
                                     _mm256_set1_ps(j->sbk[(t1 * ngk + g) * 2 + 1]), 0xf0);
    r = _mm256_fmadd_ps(b, _mm256_set_m128(qs, qs), r);
  }
  float out[8];
  float *dst = j->s + (size_t)q0 * TILE + t; /* a local: stores cannot move it */
  _mm256_storeu_ps(out, _mm256_mul_ps(r, _mm256_set1_ps(j->a->scale)));
  for (int s = 0; s < ns; s++)
    for (int i = 0; i < nq; i++) dst[i * TILE + s] = out[s * QB + i];
}

/* Scores of slots t..t+ns-1 (ns = 1 or 2) for rows q0..q0+nq-1. Codes are
 * widened and multiplied by their group's scale (exact for f16 and bf16
 * scales), so s * sum(q_j c_j) accumulates across groups in one register
 * per (slot, row): 8 independent FMA chains for two slots, as many as the
 * FMA units need, within the 16 registers of AVX2. */
RLM_AVX2 static RLM_INLINE void score_slots_avx2(attn_job *j, mat_fmt f, int q0, int nq, int t,
                                                 int ns) {
  const int dk = j->a->dim_k, bits = j->seg->k.bits, ngk = j->ngk;
  const bool quant = f >= FMT_Q4;
  const int G = quant ? j->seg->k.group_size : dk;
  const float *q = j->qk + (size_t)q0 * dk;
  __m256 acc[2][QB];
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < QB; i++) acc[s][i] = _mm256_setzero_ps();
  for (int e0 = 0, g = 0; e0 < dk; e0 += G, g++) {
    __m256 sc[2];
    for (int s = 0; s < ns; s++)
      sc[s] = _mm256_set1_ps(quant ? j->sbk[((t + s) * ngk + g) * 2] : 1.0f);
    for (int e = e0; e < e0 + G; e += 8) {
      __m256 k[2];
      for (int s = 0; s < ns; s++) {
        k[s] = load8_avx2(f, j->krow[t + s], e, bits);
        if (quant) k[s] = _mm256_mul_ps(k[s], sc[s]);
      }
      for (int i = 0; i < nq; i++) {
        const __m256 qv = _mm256_loadu_ps(q + i * dk + e);
        for (int s = 0; s < ns; s++) acc[s][i] = _mm256_fmadd_ps(qv, k[s], acc[s][i]);
      }
    }
  }
  score_finish(j, hsum8_avx2(&acc[0][0]), quant, q0, nq, t, ns);
}

RLM_AVX2 static RLM_INLINE void score_rows_avx2(attn_job *j, mat_fmt f, int q0, int nq) {
  int t = 0;
  for (; t + 2 <= j->n; t += 2) {
    if (q0 == 0) job_prefetch(j, t), job_prefetch(j, t + 1);
    score_slots_avx2(j, f, q0, nq, t, 2);
  }
  if (t < j->n) score_slots_avx2(j, f, q0, nq, t, 1);
}

RLM_AVX2 static RLM_INLINE void scores_fmt_avx2(attn_job *j, mat_fmt f) {
  for (int q0 = 0; q0 < j->a->n_q; q0 += QB) {
    const int nq = RLM_MIN(QB, j->a->n_q - q0);
    if (nq == 4) score_rows_avx2(j, f, q0, 4);
    else if (nq == 3) score_rows_avx2(j, f, q0, 3);
    else if (nq == 2) score_rows_avx2(j, f, q0, 2);
    else score_rows_avx2(j, f, q0, 1);
  }
}

RLM_AVX2 static void scores_avx2(attn_job *j) {
  switch (j->kfmt) {
  case FMT_F32: scores_fmt_avx2(j, FMT_F32); break;
  case FMT_F16: scores_fmt_avx2(j, FMT_F16); break;
  case FMT_BF16: scores_fmt_avx2(j, FMT_BF16); break;
  case FMT_Q4: scores_fmt_avx2(j, FMT_Q4); break;
  case FMT_Q8: scores_fmt_avx2(j, FMT_Q8); break;
  default: scores_fmt_avx2(j, FMT_QANY); break;
  }
}

/* ---- int8 queries (INT8 QUERIES above), 256 bits wide for both tables --- */

/* K elements 64u..64u+63 of a 4-bit row (32 bytes) as u8 codes: the low
 * nibbles are the even elements, the high ones the odd. */
RLM_AVX2 static RLM_INLINE void i8_codes_avx2(const void *row, int u, __m256i *lo, __m256i *hi) {
  const __m256i m = _mm256_set1_epi8(15);
  const __m256i w = _mm256_loadu_si256((const __m256i *)((const uint8_t *)row + 32 * u));
  *lo = _mm256_and_si256(w, m);
  *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m);
}

/* The integer block sums of one step for 4 query rows (xq[i]: row i's
 * codes in the nibble layout; rows >= nq are zeros), as one register:
 * lane i holds row i's sum over block 2u, lane 4 + i over block 2u+1.
 *   AVX2: vpmaddubsw of the low and high nibbles against q's even and odd
 *   codes, vpaddw (at most 4 products of 15 * 127 per s16 lane), then
 *   two levels of vphaddw across the rows (at most 16 products: 30480 <
 *   2^15, no wrap) and one vpmaddwd with ones for the last pair.
 *   VNNI: two vpdpbusd per row give int32 lanes of 8 products, then two
 *   levels of vphaddd. The same integers either way.
 * vpdpbusd is written as assembly (EVEX, registers 0-15) because GCC
 * will not inline an AVX-512 function into AVX2 code, and compiling this
 * kernel for AVX-512 would let the compiler use EVEX-only encodings in
 * the AVX2 table. */
RLM_AVX2 static RLM_INLINE __m256i i8_step_sums(__m256i lo, __m256i hi, const int8_t *const *xq,
                                                int u, int nq, bool vnni) {
  const size_t o = (size_t)(I8_CHUNK * (u / 2) + 32 * (u % 2));
  __m256i v[QB];
  for (int i = 0; i < QB; i++) {
    v[i] = _mm256_setzero_si256();
    if (i >= nq) continue;
    const __m256i xe = _mm256_loadu_si256((const __m256i *)(xq[i] + o));
    const __m256i xo = _mm256_loadu_si256((const __m256i *)(xq[i] + o + I8_CHUNK / 2));
    if (vnni) {
      __asm__("%{evex%} vpdpbusd %1, %2, %0" : "+v"(v[i]) : "v"(xe), "v"(lo));
      __asm__("%{evex%} vpdpbusd %1, %2, %0" : "+v"(v[i]) : "v"(xo), "v"(hi));
    } else {
      v[i] = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
    }
  }
  if (vnni)
    return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(v[0], v[1]), _mm256_hadd_epi16(v[2], v[3]));
  return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
}

/* Slot t's K scales for the lanes of step u: lanes 0-3 read block 2u's
 * group, lanes 4-7 block 2u+1's. */
RLM_AVX2 static RLM_INLINE __m256 i8_kscales_avx2(const attn_job *j, int t, int u) {
  const float *sb = j->sbk + (size_t)t * j->ngk * 2;
  const int g0 = I8_STEP * u >> j->kg_shift, g1 = (I8_STEP * u + 32) >> j->kg_shift;
  if (g0 == g1) return _mm256_set1_ps(sb[2 * g0]);
  return _mm256_setr_m128(_mm_set1_ps(sb[2 * g0]), _mm_set1_ps(sb[2 * g1]));
}

/* Scores of slots t..t+ns-1 (ns = 1 or 2) for rows q0..q0+nq-1: per step
 * of 64 codes, a slot's block sums for the 4 rows (i8_step_sums), exact
 * in float, times d_b s_g (qdt's lanes times the slot's scales) into one
 * f32 register per slot, whose halves add up to the 4 scores. */
RLM_AVX2 static RLM_INLINE void i8_slots_avx2(attn_job *j, int q0, int nq, int t, int ns,
                                              bool vnni) {
  const int n_u = j->a->dim_k / I8_STEP;
  const float *dt = j->qdt + (size_t)(q0 / QB) * n_u * 8;
  const int8_t *xq[QB];
  for (int i = 0; i < QB; i++) xq[i] = i8_xq(j, q0 + RLM_MIN(i, nq - 1));
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int u = 0; u < n_u; u++) {
    const __m256 d = _mm256_loadu_ps(dt + 8 * u);
    for (int s = 0; s < ns; s++) {
      __m256i lo, hi;
      i8_codes_avx2(j->krow[t + s], u, &lo, &hi);
      const __m256 f = _mm256_cvtepi32_ps(i8_step_sums(lo, hi, xq, u, nq, vnni));
      acc[s] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, i8_kscales_avx2(j, t + s, u)), acc[s]);
    }
  }
  const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(acc[0], acc[1], 0x20),
                                 _mm256_permute2f128_ps(acc[0], acc[1], 0x31));
  score_finish(j, r, true, q0, nq, t, ns);
}

RLM_AVX2 static RLM_INLINE void i8_rows_avx2(attn_job *j, int q0, int nq, bool vnni) {
  int t = 0;
  for (; t + 2 <= j->n; t += 2) {
    if (q0 == 0) job_prefetch(j, t), job_prefetch(j, t + 1);
    i8_slots_avx2(j, q0, nq, t, 2, vnni);
  }
  if (t < j->n) i8_slots_avx2(j, q0, nq, t, 1, vnni);
}

RLM_AVX2 static RLM_INLINE void scores_i8_rows(attn_job *j, bool vnni) {
  for (int q0 = 0; q0 < j->a->n_q; q0 += QB) {
    const int nq = RLM_MIN(QB, j->a->n_q - q0);
    if (nq == 4) i8_rows_avx2(j, q0, 4, vnni);
    else if (nq == 3) i8_rows_avx2(j, q0, 3, vnni);
    else if (nq == 2) i8_rows_avx2(j, q0, 2, vnni);
    else i8_rows_avx2(j, q0, 1, vnni);
  }
}

RLM_AVX2 static void scores_i8_avx2(attn_job *j) { scores_i8_rows(j, false); }
RLM_AVX2 static void scores_i8_vnni(attn_job *j) { scores_i8_rows(j, true); }

RLM_AVX2 static RLM_INLINE __m256 exp_avx2(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), _mm256_set1_ps(EXP_LO));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
  __m256 y = _mm256_set1_ps(EXP_P0);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P5));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                       _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

RLM_AVX2 static float hmax8_avx2(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

RLM_AVX2 static float hsum8_one_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

RLM_AVX2 static void softmax_avx2(attn_job *j) {
  const int n_pad = (j->n + 15) & ~15; /* job_mask padded with -inf */
  for (int q = 0; q < j->a->n_q; q++) {
    float *r = j->s + (size_t)q * TILE;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < n_pad; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(r + t));
    const float m_tile = hmax8_avx2(mx);
    if (m_tile == -INFINITY) {
      softmax_skip(j, q);
      continue;
    }
    const float m_new = RLM_MAX(j->m[q], m_tile);
    const __m256 mn = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int t = 0; t < n_pad; t += 8) {
      const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(r + t), mn));
      _mm256_storeu_ps(r + t, p);
      sum = _mm256_add_ps(sum, p);
    }
    softmax_update(j, q, m_new, hsum8_one_avx2(sum));
  }
}

/* Elements e..e+7 of V row t, dequantized (group g) if quantized. */
RLM_AVX2 static RLM_INLINE __m256 vload_avx2(const attn_job *j, mat_fmt f, int t, int e, int g) {
  const __m256 v = load8_avx2(f, j->vrow[t], e, j->seg->v.bits);
  if (f < FMT_Q4) return v;
  const float *sb = j->sbv + (t * j->ngv + g) * 2;
  return _mm256_fmadd_ps(v, _mm256_set1_ps(sb[0]), _mm256_set1_ps(sb[1]));
}

/* acc rows q0..q0+nq-1, columns e..e+8*nc-1 (nc = 1 or 2, within one
 * group): alpha * acc + sum_t p[t] v_t, held in registers over the tile
 * (2 x 4 = 8 FMA chains for nc = 2). */
RLM_AVX2 static RLM_INLINE void accum_cols_avx2(attn_job *j, mat_fmt f, int q0, int nq, int e,
                                                int nc) {
  const int dv = j->a->dim_v, n = j->n;
  const int g = f >= FMT_Q4 ? e / j->seg->v.group_size : 0;
  const float *p = j->s + (size_t)q0 * TILE;
  float *o = j->acc + (size_t)q0 * dv + e;
  __m256 acc[2][QB];
  for (int c = 0; c < nc; c++)
    for (int i = 0; i < nq; i++)
      acc[c][i] = _mm256_mul_ps(_mm256_loadu_ps(o + i * dv + 8 * c),
                                _mm256_set1_ps(j->alpha[q0 + i]));
  for (int t = 0; t < n; t++) {
    __m256 v[2];
    for (int c = 0; c < nc; c++) v[c] = vload_avx2(j, f, t, e + 8 * c, g);
    for (int i = 0; i < nq; i++) {
      const __m256 pi = _mm256_set1_ps(p[i * TILE + t]);
      for (int c = 0; c < nc; c++) acc[c][i] = _mm256_fmadd_ps(pi, v[c], acc[c][i]);
    }
  }
  for (int c = 0; c < nc; c++)
    for (int i = 0; i < nq; i++) _mm256_storeu_ps(o + i * dv + 8 * c, acc[c][i]);
}

RLM_AVX2 static RLM_INLINE void accum_rows_avx2(attn_job *j, mat_fmt f, int q0, int nq) {
  const int dv = j->a->dim_v;
  int e = 0;
  for (; e + 16 <= dv; e += 16) accum_cols_avx2(j, f, q0, nq, e, 2);
  if (e < dv) accum_cols_avx2(j, f, q0, nq, e, 1);
}

RLM_AVX2 static RLM_INLINE void accum_fmt_avx2(attn_job *j, mat_fmt f) {
  for (int q0 = 0; q0 < j->a->n_q; q0 += QB) {
    const int nq = RLM_MIN(QB, j->a->n_q - q0);
    if (nq == 4) accum_rows_avx2(j, f, q0, 4);
    else if (nq == 3) accum_rows_avx2(j, f, q0, 3);
    else if (nq == 2) accum_rows_avx2(j, f, q0, 2);
    else accum_rows_avx2(j, f, q0, 1);
  }
}

RLM_AVX2 static void accum_avx2(attn_job *j) {
  switch (j->vfmt) {
  case FMT_F32: accum_fmt_avx2(j, FMT_F32); break;
  case FMT_F16: accum_fmt_avx2(j, FMT_F16); break;
  case FMT_BF16: accum_fmt_avx2(j, FMT_BF16); break;
  case FMT_Q4: accum_fmt_avx2(j, FMT_Q4); break;
  case FMT_Q8: accum_fmt_avx2(j, FMT_Q8); break;
  default: accum_fmt_avx2(j, FMT_QANY); break;
  }
}

static const attn_isa isa_avx2 = {
    .dim_multiple = SIMD_DIM,
    .q4_block = 16,
    .widen = widen_f16c,
    .scores = scores_avx2,
    .softmax = softmax_avx2,
    .accum = accum_avx2,
    .scores_i8 = scores_i8_avx2,
    .quantize_q = rlm__q8act_quantize,
};

/* ========================================================================
 * AVX-512: 16 floats per register; scores take two slots at a time so a
 * K register pair feeds 8 independent FMA chains, and the accumulation
 * holds 32 columns of 4 rows (8 chains) per pass over the tile.
 * ====================================================================== */

/* As load8_avx2, 16 elements; 4-bit blocks are 32 codes. */
RLM_AVX512 static RLM_INLINE __m512 load16_avx512(mat_fmt f, const void *row, int e, int bits) {
  const uint8_t *b = row;
  switch (f) {
  case FMT_F32: return _mm512_loadu_ps((const float *)row + e);
  case FMT_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 2 * e)));
  case FMT_BF16: {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 2 * e)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  case FMT_Q8: {
    const __m128i c = _mm_loadu_si128((const __m128i *)(b + e));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
  }
  case FMT_Q4: { /* the kernels take q4_lut32_avx512; kept so every format reads here */
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (e & ~31) / 2)));
    const __m512i c = e & 16 ? _mm512_srli_epi32(w, 4) : _mm512_and_si512(w, _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(c);
  }
  default: {
    float c[16];
    codes_any(row, e, bits, 16, c);
    return _mm512_loadu_ps(c);
  }
  }
}

/* 4-bit codes as table lookups: vpermps reads the low 4 bits of each
 * lane, so a lane holding a whole byte selects by its low nibble and the
 * byte shifted right by 4 by its high one -- no mask, no int-to-float
 * conversion -- and the table can hold code * scale (K) or code * scale +
 * bias (V), which saves the multiply or the dequantizing FMA as well. */
RLM_AVX512 static RLM_INLINE __m512 lut_iota_avx512(void) {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* Elements e..e+31 (e a multiple of 32; 4-BIT ORDER) of a 4-bit row
 * through tab: v[0] the even codes, v[1] the odd ones. */
RLM_AVX512 static RLM_INLINE void q4_lut32_avx512(const void *row, int e, __m512 tab, __m512 *v) {
  const __m128i bytes = _mm_loadu_si128((const __m128i *)((const uint8_t *)row + e / 2));
  const __m512i w = _mm512_cvtepu8_epi32(bytes);
  v[0] = _mm512_permutexvar_ps(w, tab);
  v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), tab);
}

/* Elements e..e+31 of a row as in load16_avx512 (4-bit: through tab). */
RLM_AVX512 static RLM_INLINE void load32_avx512(mat_fmt f, const void *row, int e, int bits,
                                                __m512 tab, __m512 *v) {
  if (f == FMT_Q4) {
    q4_lut32_avx512(row, e, tab, v);
    return;
  }
  v[0] = load16_avx512(f, row, e, bits);
  v[1] = load16_avx512(f, row, e + 16, bits);
}

RLM_AVX512 static RLM_INLINE __m256 fold_avx512(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

/* Reduces the dot products of slots t, t+ns-1 (ns = 1 or 2) and lets
 * score_finish add the biases, scale and store. */
RLM_AVX512 static RLM_INLINE void score_store_avx512(attn_job *j, __m512 tot[][QB], bool quant,
                                                     int q0, int nq, int t, int ns) {
  __m256 h[8];
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < QB; i++) h[s * QB + i] = fold_avx512(tot[s][i]);
  score_finish(j, hsum8_avx2(h), quant, q0, nq, t, ns);
}

/* Scores of slots t..t+ns-1 (ns <= 4; <= 2 where per-group sums must be
 * kept apart, i.e. quantized but not 4-bit) for rows q0..q0+nq-1. The K
 * registers of ns slots share each q load; dense and 4-bit rows (scale in
 * the table) accumulate across groups directly. */
RLM_AVX512 static RLM_INLINE void score_slots_avx512(attn_job *j, mat_fmt f, int q0, int nq,
                                                     int t, int ns) {
  const int dk = j->a->dim_k, bits = j->seg->k.bits, ngk = j->ngk;
  const bool quant = f >= FMT_Q4, lut = f == FMT_Q4;
  const int G = quant ? j->seg->k.group_size : dk;
  const float *q = j->qk + (size_t)q0 * dk;
  __m512 tot[4][QB];
  for (int s = 0; s < 4; s++)
    for (int i = 0; i < QB; i++) tot[s][i] = _mm512_setzero_ps();
  for (int e0 = 0, g = 0; e0 < dk; e0 += G, g++) {
    __m512 acc[4][QB], tab[4];
    for (int s = 0; s < ns; s++) {
      const float sc = j->sbk[((t + s) * ngk + g) * 2];
      tab[s] = lut ? _mm512_mul_ps(lut_iota_avx512(), _mm512_set1_ps(sc)) : _mm512_setzero_ps();
      for (int i = 0; i < nq; i++) acc[s][i] = lut ? tot[s][i] : _mm512_setzero_ps();
    }
    int e = e0;
    for (; e + 32 <= e0 + G; e += 32) { /* two registers per slot and step */
      __m512 k[4][2];
      for (int s = 0; s < ns; s++) load32_avx512(f, j->krow[t + s], e, bits, tab[s], k[s]);
      for (int i = 0; i < nq; i++)
        for (int h = 0; h < 2; h++) {
          __m512 qv = _mm512_loadu_ps(q + i * dk + e + 16 * h);
          if (ns > 1) __asm__("" : "+v"(qv)); /* one load for all slots */
          for (int s = 0; s < ns; s++) acc[s][i] = _mm512_fmadd_ps(qv, k[s][h], acc[s][i]);
        }
    }
    for (; e < e0 + G; e += 16) { /* dense rows of 16 (mod 32) elements */
      for (int i = 0; i < nq; i++) {
        const __m512 qv = _mm512_loadu_ps(q + i * dk + e);
        for (int s = 0; s < ns; s++)
          acc[s][i] = _mm512_fmadd_ps(qv, load16_avx512(f, j->krow[t + s], e, bits), acc[s][i]);
      }
    }
    for (int s = 0; s < ns; s++) {
      const __m512 sc = _mm512_set1_ps(j->sbk[((t + s) * ngk + g) * 2]);
      for (int i = 0; i < nq && quant && !lut; i++)
        tot[s][i] = _mm512_fmadd_ps(acc[s][i], sc, tot[s][i]);
      for (int i = 0; i < nq && (!quant || lut); i++) tot[s][i] = acc[s][i];
    }
  }
  for (int s0 = 0; s0 < ns; s0 += 2)
    score_store_avx512(j, tot + s0, quant, q0, nq, t + s0, RLM_MIN(2, ns - s0));
}

/* Slots t.. of the tile, ns at a time, prefetching as many slots ahead. */
RLM_AVX512 static RLM_INLINE void score_run_avx512(attn_job *j, mat_fmt f, int q0, int nq, int ns) {
  int t = 0;
  for (; t + ns <= j->n; t += ns) {
    for (int s = 0; s < ns && q0 == 0; s++) job_prefetch(j, t + s);
    score_slots_avx512(j, f, q0, nq, t, ns);
  }
  for (; t < j->n; t++) score_slots_avx512(j, f, q0, nq, t, 1);
}

RLM_AVX512 static RLM_INLINE void score_rows_avx512(attn_job *j, mat_fmt f, int q0, int nq) {
  if (f < FMT_Q4) score_run_avx512(j, f, q0, nq, 4);
  else score_run_avx512(j, f, q0, nq, 2);
}

RLM_AVX512 static RLM_INLINE void scores_fmt_avx512(attn_job *j, mat_fmt f) {
  for (int q0 = 0; q0 < j->a->n_q; q0 += QB) {
    const int nq = RLM_MIN(QB, j->a->n_q - q0);
    if (nq == 4) score_rows_avx512(j, f, q0, 4);
    else if (nq == 3) score_rows_avx512(j, f, q0, 3);
    else if (nq == 2) score_rows_avx512(j, f, q0, 2);
    else score_rows_avx512(j, f, q0, 1);
  }
}

RLM_AVX512 static void scores_avx512(attn_job *j) {
  switch (j->kfmt) {
  case FMT_F32: scores_fmt_avx512(j, FMT_F32); break;
  case FMT_F16: scores_fmt_avx512(j, FMT_F16); break;
  case FMT_BF16: scores_fmt_avx512(j, FMT_BF16); break;
  case FMT_Q4: scores_fmt_avx512(j, FMT_Q4); break;
  case FMT_Q8: scores_fmt_avx512(j, FMT_Q8); break;
  default: scores_fmt_avx512(j, FMT_QANY); break;
  }
}

RLM_AVX512 static RLM_INLINE __m512 exp_avx512(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_HI)), _mm512_set1_ps(EXP_LO));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
  __m512 y = _mm512_set1_ps(EXP_P0);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P1));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P2));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P3));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P4));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P5));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(y, n));
}

RLM_AVX512 static void softmax_avx512(attn_job *j) {
  const int n_pad = (j->n + 15) & ~15; /* job_mask padded with -inf */
  for (int q = 0; q < j->a->n_q; q++) {
    float *r = j->s + (size_t)q * TILE;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int t = 0; t < n_pad; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(r + t));
    const float m_tile = _mm512_reduce_max_ps(mx);
    if (m_tile == -INFINITY) {
      softmax_skip(j, q);
      continue;
    }
    const float m_new = RLM_MAX(j->m[q], m_tile);
    const __m512 mn = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int t = 0; t < n_pad; t += 16) {
      const __m512 p = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(r + t), mn));
      _mm512_storeu_ps(r + t, p);
      sum = _mm512_add_ps(sum, p);
    }
    softmax_update(j, q, m_new, _mm512_reduce_add_ps(sum));
  }
}

RLM_AVX512 static RLM_INLINE __m512 vload_avx512(const attn_job *j, mat_fmt f, int t, int e,
                                                 int g) {
  const __m512 v = load16_avx512(f, j->vrow[t], e, j->seg->v.bits);
  if (f < FMT_Q4) return v;
  const float *sb = j->sbv + (t * j->ngv + g) * 2;
  return _mm512_fmadd_ps(v, _mm512_set1_ps(sb[0]), _mm512_set1_ps(sb[1]));
}

/* Columns e.. of 4-bit V row t dequantized through the table of its group. */
RLM_AVX512 static RLM_INLINE __m512 q4_vtab_avx512(const attn_job *j, int t, int g) {
  const float *sb = j->sbv + (t * j->ngv + g) * 2;
  return _mm512_fmadd_ps(lut_iota_avx512(), _mm512_set1_ps(sb[0]), _mm512_set1_ps(sb[1]));
}

/* acc rows q0..q0+nq-1, columns e..e+16*nc-1 (nc = 1, 2 or 4, never
 * crossing a group): alpha * acc + sum_t p[t] v_t. */
RLM_AVX512 static RLM_INLINE void accum_cols_avx512(attn_job *j, mat_fmt f, int q0, int nq,
                                                    int e, int nc) {
  const int dv = j->a->dim_v, n = j->n;
  const int g = f >= FMT_Q4 ? e / j->seg->v.group_size : 0;
  const float *p = j->s + (size_t)q0 * TILE;
  float *o = j->acc + (size_t)q0 * dv + e;
  __m512 acc[4][QB];
  for (int c = 0; c < nc; c++)
    for (int i = 0; i < nq; i++)
      acc[c][i] = _mm512_mul_ps(_mm512_loadu_ps(o + i * dv + 16 * c),
                                _mm512_set1_ps(j->alpha[q0 + i]));
  for (int t = 0; t < n; t++) {
    __m512 v[4];
    if (f == FMT_Q4 && nc >= 2) {
      const __m512 tab = q4_vtab_avx512(j, t, g);
      for (int c = 0; c < nc; c += 2) q4_lut32_avx512(j->vrow[t], e + 16 * c, tab, v + c);
    } else {
      for (int c = 0; c < nc; c++) v[c] = vload_avx512(j, f, t, e + 16 * c, g);
    }
    for (int i = 0; i < nq; i++) {
      const __m512 pi = _mm512_set1_ps(p[i * TILE + t]);
      for (int c = 0; c < nc; c++) acc[c][i] = _mm512_fmadd_ps(pi, v[c], acc[c][i]);
    }
  }
  for (int c = 0; c < nc; c++)
    for (int i = 0; i < nq; i++) _mm512_storeu_ps(o + i * dv + 16 * c, acc[c][i]);
}

/* 64 columns per pass where a group spans them (fewer broadcasts of the
 * weights per FMA), else 32, then 16. */
RLM_AVX512 static RLM_INLINE void accum_rows_avx512(attn_job *j, mat_fmt f, int q0, int nq) {
  const int dv = j->a->dim_v;
  const bool wide = f < FMT_Q4 || j->seg->v.group_size >= 64;
  int e = 0;
  for (; wide && e + 64 <= dv; e += 64) accum_cols_avx512(j, f, q0, nq, e, 4);
  for (; e + 32 <= dv; e += 32) accum_cols_avx512(j, f, q0, nq, e, 2);
  if (e < dv) accum_cols_avx512(j, f, q0, nq, e, 1);
}

RLM_AVX512 static RLM_INLINE void accum_fmt_avx512(attn_job *j, mat_fmt f) {
  for (int q0 = 0; q0 < j->a->n_q; q0 += QB) {
    const int nq = RLM_MIN(QB, j->a->n_q - q0);
    if (nq == 4) accum_rows_avx512(j, f, q0, 4);
    else if (nq == 3) accum_rows_avx512(j, f, q0, 3);
    else if (nq == 2) accum_rows_avx512(j, f, q0, 2);
    else accum_rows_avx512(j, f, q0, 1);
  }
}

RLM_AVX512 static void accum_avx512(attn_job *j) {
  switch (j->vfmt) {
  case FMT_F32: accum_fmt_avx512(j, FMT_F32); break;
  case FMT_F16: accum_fmt_avx512(j, FMT_F16); break;
  case FMT_BF16: accum_fmt_avx512(j, FMT_BF16); break;
  case FMT_Q4: accum_fmt_avx512(j, FMT_Q4); break;
  case FMT_Q8: accum_fmt_avx512(j, FMT_Q8); break;
  default: accum_fmt_avx512(j, FMT_QANY); break;
  }
}

/* The AVX-512 tables differ only in how int8 queries are scored:
 * vpmaddubsw, or vpdpbusd where the CPU has VNNI. */
#define ISA_AVX512(scores_int8)                                                \
  {.dim_multiple = SIMD_DIM, .q4_block = 32, .widen = widen_f16c,              \
   .scores = scores_avx512, .softmax = softmax_avx512, .accum = accum_avx512,  \
   .scores_i8 = (scores_int8), .quantize_q = rlm__q8act_quantize}
static const attn_isa isa_avx512 = ISA_AVX512(scores_i8_avx2);
static const attn_isa isa_avx512_vnni = ISA_AVX512(scores_i8_vnni);

static void fused_avx2(const rlm_attn_args *a, float *scratch) { attn_run(&isa_avx2, a, scratch); }
static void fused_avx512(const rlm_attn_args *a, float *scratch) {
  attn_run(&isa_avx512, a, scratch);
}
static void fused_avx512_vnni(const rlm_attn_args *a, float *scratch) {
  attn_run(&isa_avx512_vnni, a, scratch);
}

/* rlm__attn_i8_isums for the vector tables: the step sums of the row as
 * all 4 rows of a block; false if the rows' lanes disagree. */
RLM_AVX2 static bool i8_isums_avx2(const uint32_t *krow, const int8_t *xq, int dim, bool vnni,
                                   int32_t *isum) {
  const int8_t *rows[QB] = {xq, xq, xq, xq};
  bool same = true;
  for (int u = 0; u < dim / I8_STEP; u++) {
    __m256i lo, hi;
    int32_t lane[8];
    i8_codes_avx2(krow, u, &lo, &hi);
    _mm256_storeu_si256((__m256i *)lane, i8_step_sums(lo, hi, rows, u, QB, vnni));
    for (int i = 1; i < QB; i++) same = same && lane[i] == lane[0] && lane[4 + i] == lane[4];
    isum[2 * u] = lane[0];
    isum[2 * u + 1] = lane[4];
  }
  return same;
}

#endif /* __x86_64__ */

/* ========================================================================
 * Selection.
 * ====================================================================== */

rlm_attn_fused_fn rlm__attn_fused_isa(const char *isa) {
  if (!strcmp(isa, "scalar")) return fused_scalar;
  if (!strcmp(isa, "scalar-i8")) return fused_scalar_i8;
#if defined(__x86_64__)
  if (!strcmp(isa, "avx2")) return rlm__cpu_avx2() ? fused_avx2 : NULL;
  if (!strcmp(isa, "avx512")) return rlm__cpu_avx512() ? fused_avx512 : NULL;
  if (!strcmp(isa, "avx512vnni")) return rlm__cpu_avx512_vnni() ? fused_avx512_vnni : NULL;
#endif
  return NULL;
}

bool rlm__attn_i8_isums(const char *isa, const uint32_t *krow, const void *xq, int dim,
                        int32_t *isum) {
  if (!rlm__attn_fused_isa(isa) || !i8_dim_ok(dim)) return false;
  if (!strcmp(isa, "scalar-i8")) {
    for (int b = 0; b < dim / 32; b++) isum[b] = i8_isum_scalar(krow, xq, b);
    return true;
  }
#if defined(__x86_64__)
  if (strcmp(isa, "scalar")) return i8_isums_avx2(krow, xq, dim, !strcmp(isa, "avx512vnni"), isum);
#endif
  return false;
}

void rlm__attn_fused(const rlm_attn_args *a, float *scratch) {
  static _Atomic(rlm_attn_fused_fn) chosen; /* zero: not chosen yet */
  rlm_attn_fused_fn fn = atomic_load(&chosen);
  if (!fn) {
    fn = rlm__attn_fused_isa("avx512vnni");
    if (!fn) fn = rlm__attn_fused_isa("avx512");
    if (!fn) fn = rlm__attn_fused_isa("avx2");
    if (!fn) fn = fused_scalar;
    atomic_store(&chosen, fn);
  }
  fn(a, scratch);
}
