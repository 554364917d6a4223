/* kv.h -- the KV-state layer's internals: one struct for every cache kind.
 *
 * THE RING. Each row owns `n_alloc` slots (growing geometrically, in
 * whole steps of 256, up to `capacity`). A token at position p always lives in slot
 *
 *     slot(p) = p                                  plain kinds
 *     slot(p) = p                  if p < keep     rotating kinds (sinks)
 *             = keep + (p - keep) mod (cap - keep) otherwise
 *
 * with cap = window + max_chunk - 1 for rings, and pos[row][slot] records
 * which position a slot holds (-1: empty). Nothing is ever moved:
 *
 *    slot:   0    1  | 2    3    4    5    6    7      (keep 2, cap 8)
 *    pos:    0    1  | 8    9    10   11   6    7      offset 12, window 5
 *           sinks    |<-------- ring, written at slot(p) ------->
 *    a query at 12 sees 0, 1 (sinks) and 9, 10, 11, 12 (window 5 - keep 2 = 3
 *    back, plus itself once written)
 *
 * The slack (cap - window = max_chunk - 1) is what makes rollback free:
 * appending L <= max_chunk tokens overwrites positions at least `window`
 * older than any position a query can still ask for after rolling back to
 * `before + keep`, so rollback only forgets positions (pos = -1). Attention
 * reads slots where they lie; src/attn masks by position.
 *
 * Storage per tensor (K, V): dense [B][H][n_alloc][dim] in dtype, or MLX
 * affine triples [B][H][n_alloc][dim*bits/32] u32 + scales/biases
 * [B][H][n_alloc][dim/group] in dtype. Rows are contiguous, so adding,
 * removing and extracting rows are block copies.
 *
 * Scratch: everything an operation needs besides the storage (the block of
 * a read, gathered queries, attention tiles) is allocated at create time,
 * sized by max_chunk and q_per_kv; operations do not allocate except when
 * the slots grow (geometrically: O(log n) times, never after reserve).
 */
#ifndef RLM_KV_H
#define RLM_KV_H

#include "attn/attn.h"

typedef struct rlm_kv_store {
  int bits;           /* 0: dense                                          */
  int dim;            /* elements per head per slot                         */
  int64_t row_elems;  /* dense: dim; quant: dim*bits/32 (u32 words)        */
  int64_t sb_elems;   /* quant: dim/group_size, else 0                     */
  size_t elem_size;   /* bytes of one row element (dtype or 4 for words)   */
  void *data;         /* [B][H][n_alloc][row_elems]                        */
  void *scales;       /* [B][H][n_alloc][sb_elems] (quant)                 */
  void *biases;
} rlm_kv_store;

struct rlm_kv {
  rlm_kv_config cfg;     /* as created (n_rows updated by row ops)         */
  char signature[80];
  int n_rows;            /* B                                              */
  bool ring;             /* rotating kind                                   */
  int64_t capacity;      /* slots a row may ever use                        */
  int64_t n_alloc;       /* slots allocated per row                         */
  rlm_kv_store k, v;
  int32_t *pos;          /* [B][n_alloc]                                    */
  int64_t *offset;       /* [B] next position                               */
  bool *wrapped;         /* [B] a position >= capacity was ever written     */
  bool dense_pending;    /* dense_first and nothing appended yet            */
  /* scratch, allocated at create (kv.c: scratch_alloc) */
  rlm_kv_store blk_k, blk_v;   /* one chunk of H heads (block reads)        */
  rlm_kv_store den_k, den_v;   /* dense twin of the block (dense_first)     */
  int32_t *blk_pos;            /* [max_chunk]                               */
  float *q_rows;               /* [max_chunk * ratio_max][Dk] gathered q     */
  int64_t *q_pos;              /* [max_chunk * ratio_max]                    */
  float *o_rows;               /* [max_chunk * ratio_max][Dv]                */
  float *attn_scratch;         /* rlm__attn_split_scratch_floats(...)        */
  rlm_pool *pool;              /* attention's threads (NULL: the caller's)  */
  bool int8_q;                 /* reads score 4-bit K with int8 queries     */
                               /* (attn.h; the CPU backend sets it from     */
                               /* act_bits before each attend)              */
  void *conv;                  /* [max(Dk, Dv)] one row rounded to dtype     */
  bool borrowed;               /* the scratch and pool are another cache's  */
};

/* ---- kv.c: lifetime, storage, rows, accounting ------------------------- */
rlm_status rlm__kv_check_config(const rlm_kv_config *c, rlm_error *err);
/* Grows every row to at least n slots (capped at capacity). */
rlm_status rlm__kv_reserve(rlm_kv *kv, int64_t n, rlm_error *err);
/* Growth for `need` slots: nothing if they exist, else at least doubling
 * (whole steps of 256, capped at capacity), so a long context copies its
 * slots O(log n) times rather than once per 256 positions. */
rlm_status rlm__kv_grow(rlm_kv *kv, int64_t need, rlm_error *err);
/* Forgets every position of every row (as created; slots are kept). */
void rlm__kv_reset(rlm_kv *kv);
/* Empties every row and frees the storage (the scratch stays). */
void rlm__kv_release(rlm_kv *kv);
/* A cache like rlm_kv_create's that uses `owner`'s operation scratch and
 * pool instead of its own: caches of one layer's rows, used one at a time
 * by one thread, need one scratch between them. cfg must equal owner's
 * but for reserve; owner must outlive it. */
rlm_status rlm__kv_create_sharing(rlm_kv **out, const rlm_kv_config *cfg, const rlm_kv *owner,
                                  rlm_error *err);
/* Could `row` go back to position `to` (rollback or trim feasibility)? */
bool rlm__kv_can_rewind(const rlm_kv *kv, int row, int64_t to);
int64_t rlm__kv_slot(const rlm_kv *kv, int64_t p);
/* Row b's positions table, NULL while no slot exists (so that no
 * arithmetic is done on a NULL table). */
static inline int32_t *rlm__kv_row_pos(const rlm_kv *kv, int64_t b) {
  return kv->n_alloc ? kv->pos + b * kv->n_alloc : NULL;
}
/* View of (row, head) of a store as an attention matrix. */
rlm_attn_mat rlm__kv_mat(const rlm_kv *kv, const rlm_kv_store *s, int b, int h,
                         int64_t n_alloc);
/* Writes one token's heads x[H][dim] into slot `slot` of row b. */
void rlm__kv_store_write(const rlm_kv *kv, rlm_kv_store *s, int b, int64_t n_alloc,
                         int64_t slot, const float *x);

/* Reads attend over `pool`'s threads from now on (NULL: the caller's
 * thread); re-sizes the attention scratch for them. The pool must outlive
 * the cache's use of it. */
rlm_status rlm__kv_use_pool(rlm_kv *kv, rlm_pool *pool, rlm_error *err);

/* ---- kv_ops.c: appends, reads, trim, rollback, decode plan ------------- */
/* ---- kv_state.c: state image, live slots (snapshots) ------------------- */
/* The positions one row holds, in position order: [0, n_sinks) (a ring's
 * sinks), then [first, offset) (everything else it keeps: a ring's
 * newest positions, its slack included; a plain cache's every position). */
typedef struct rlm_kv_live {
  int64_t offset;   /* next position                                      */
  int64_t n_sinks;
  int64_t first;
  int64_t n;        /* n_sinks + offset - first                           */
  bool wrapped;     /* the row's ring ever wrapped (decode plans read it)  */
} rlm_kv_live;

/* What `row` holds; RLM_ERR_INTERNAL if its positions are not of that
 * shape (a broken invariant, never outside input). */
rlm_status rlm__kv_live(const rlm_kv *kv, int row, rlm_kv_live *out, rlm_error *err);
/* Bytes one slot of one head takes in storage array a: 0..2 are K's data,
 * scales and biases, 3..5 V's; 0 for an array the kind does not have. */
size_t rlm__kv_array_slot_bytes(const rlm_kv *kv, int a);
/* Copies array a of the row's live slots (lv from rlm__kv_live) to dst,
 * laid out [H][lv->n][slot bytes] in position order. */
void rlm__kv_export(const rlm_kv *kv, int row, const rlm_kv_live *lv, int a, void *dst);
/* Makes `row` hold exactly lv's positions, read from src[a] laid out as
 * rlm__kv_export writes them (NULL where the kind has no array a). A ring
 * with less slack than the one saved drops the oldest positions it cannot
 * hold (no query can see them). lv is checked against this cache first
 * (RLM_ERR_FORMAT: sinks, a ring that lacks part of its window, a plain
 * cache with a hole, more than its capacity); the storage grows next
 * (RLM_ERR_NOMEM); the row changes only after both. */
rlm_status rlm__kv_import(rlm_kv *kv, int row, const rlm_kv_live *lv, const void *const src[6],
                          rlm_error *err);
/* rlm__kv_import's checks of lv alone (nothing changes). */
rlm_status rlm__kv_check_live(const rlm_kv *kv, const rlm_kv_live *lv, rlm_error *err);
/* Room for lv in every row (rlm__kv_import's growth, done ahead). */
rlm_status rlm__kv_reserve_live(rlm_kv *kv, const rlm_kv_live *lv, rlm_error *err);

#endif /* RLM_KV_H */
