/* qdot_amx.c -- 4- and 8-bit MLX weights times int8 activations for
 * several input rows on Intel AMX (TDPBUSD): batched decode steps and
 * prefill on CPUs with AMX tiles (Sapphire Rapids and later).
 *
 * Why: a step of 8 rows is bound by qdot.c's VNNI register tiles (about 75
 * GMAC/s a thread on a Sapphire Rapids VM), whose every 64 products cost a
 * vpdpbusd and a share of the loads, conversions and scaling around it.
 * One TDPBUSD multiplies 16 weight rows x 32 columns by 8 inputs (4,096
 * products; a chain of them ran at 628 GMAC/s on one thread there), so
 * what is left is preparing its operands and scaling its sums.
 *
 * NUMERICS: rlm__qmv_q8_ref's, up to the order and association of the f32
 * additions. Each block of 32 columns gives exact int32 sums (u8 codes x
 * s8 activations); a group's blocks add isum * d_b, then acc += s_g times
 * that (the reference: acc += isum * (d_b * s_g) per block), and the bias
 * term sum_g b_g * xsum_g is added per group, as in every kernel of qdot.c.
 *
 * TILES (palette 1): C0..C3 (16 weight rows x 8 inputs, int32: a chunk's 4
 * blocks, each scaled by its own d), A (16 rows x 32 u8 codes), B (8 rows x
 * 8 inputs x 4 s8: the VNNI layout). A block's k order is the activations'
 * nibble layout (quant.h): its 16 even elements, then its 16 odd ones,
 * which are the low nibbles of the block's 16 code bytes, then the high
 * ones. So an A row is one AND and one shift of the codes (a chunk's 4
 * blocks at once, their 128-bit lanes interleaved into a row of 128 bytes
 * that TILELOADD reads with a stride), and a B tile is the 8 inputs' two
 * 16-byte halves of the block with their 4-byte groups side by side.
 * 8-bit weights need no widening: TILELOADD reads A from the codes as they
 * are stored (row stride: the row's bytes), in natural order, and B from
 * the quad layout's int16 codes narrowed back to bytes (|code| <= 127). B
 * depends on x only: it is built once per panel of PANEL chunks and token
 * group, and used by every 16-row tile of the caller's range.
 *
 * SPEED (Sapphire Rapids VM, one thread, bench_qmm -m 8 --reps 9, RINGLM_NO_AMX
 * =1 for the VNNI figures): Gemma-3-1B's q 124-129 GMAC/s against 107, gate
 * 115-117 against 100, down 120 against 113, the 8-bit head's slice
 * 16384 x 1152 115-117 against 61; summing a group's blocks before its
 * scale (scale_chunk) added 2-3%. The TDPBUSD is the cheap
 * part: preparing A (8 instructions a row a chunk) and scaling C (about 5
 * a row pair a block at groups of 64) bound it.
 *
 * Rows past the last whole tile of 16, and products of fewer than
 * AMX_MIN_M inputs, go to qdot.c's VNNI kernel (rlm__qmm_q8_vnni).
 */
#include "quant/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define RLM_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,amx-tile,amx-int8")))

enum {
  TR = 16,        /* weight rows a tile                                       */
  TN = 8,         /* inputs a tile                                            */
  PANEL = 64,     /* chunks of 128 columns whose B tiles are built at once:
                     8,192 columns, every product of a 1B model in one panel
                     (Gemma's down 1152 x 6912 at m = 8, one thread: 120
                     GMAC/s against 104 with panels of 16); 128 KB of stack */
  PB = PANEL * 4, /* blocks of 32 (and at most groups) in a panel             */
  AMX_MIN_M = 8,  /* fewer inputs: the VNNI kernel (B = 4: 55 against 63 tok/s) */
};

/* The tile registers (macros: the intrinsics paste their numbers into
 * the instruction). */
#define T_C0 0
#define T_C1 1
#define T_C2 2
#define T_C3 3
#define T_A 4
#define T_B 5

typedef struct tile_config {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* x's side of a panel for one group of TN inputs: each block's B tile, its
 * inputs' block scales and each group's sums of x, both as 16 lanes (lanes
 * 8..15 repeat 0..7: a register holds two weight rows' 8 inputs). */
typedef struct panel_x {
  _Alignas(64) int8_t b[PB][8][4 * TN];
  _Alignas(64) float d[PB][16];
  _Alignas(64) float xs[PB][16];
} panel_x;

/* A weight tile's scales and biases over a panel's groups, as f32. */
typedef struct panel_w {
  _Alignas(64) float s[TR][PB];
  _Alignas(64) float b[TR][PB];
} panel_w;

RLM_AMX static void configure(void) {
  tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = T_C0; t <= T_C3; t++) c.rows[t] = TR, c.colsb[t] = 4 * TN;
  c.rows[T_A] = TR, c.colsb[T_A] = 32;
  c.rows[T_B] = 8, c.colsb[T_B] = 4 * TN;
  _tile_loadconfig(&c);
}

/* Panel [c0, c0 + nc) of inputs i0 .. i0 + n - 1 (the rest zero). */
static void build_x(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t i0, int n,
                    int64_t c0, int nc, panel_x *px) {
  const int64_t cols = w->cols, ng = cols / w->group_size;
  const int gp = nc * 128 / w->group_size; /* the panel's groups */
  memset(px, 0, sizeof *px);
  for (int k = 0; k < n; k++) {
    const int8_t *xq = (const int8_t *)scratch + (size_t)(i0 + k) * stride;
    const float *d = rlm__q8act_int8_block_scales(cols, xq); /* nibble or half-block (8 bits) layout */
    for (int pb = 0; pb < nc * 4; pb++) {
      const int64_t c = c0 + pb / 4, j = pb % 4;
      if (w->bits == 8) /* the block's elements in order */
        for (int e = 0; e < 32; e++) px->b[pb][e / 4][4 * k + e % 4] = xq[rlm__q8act_w6_pos(c * 128 + 32 * j + e)];
      else /* k = 4r .. 4r+3: evens of the block, then odds */
        for (int r = 0; r < 8; r++)
          memcpy(&px->b[pb][r][4 * k], xq + c * 128 + (r < 4 ? 16 * j + 4 * r : 64 + 16 * j + 4 * (r - 4)), 4);
      px->d[pb][k] = px->d[pb][k + 8] = d[c * 4 + j];
    }
    for (int g = 0; g < gp; g++) px->xs[g][k] = px->xs[g][k + 8] = xsum[(i0 + k) * ng + c0 * 128 / w->group_size + g];
  }
}

/* Rows o .. o + TR - 1's scales and biases over the panel's groups. */
static void build_w(const rlm_qmat *w, int64_t o, int64_t c0, int nc, panel_w *pw) {
  const int64_t ng = w->cols / w->group_size, g0 = c0 * 128 / w->group_size;
  const int gp = nc * 128 / w->group_size;
  for (int r = 0; r < TR; r++)
    for (int g = 0; g < gp; g++) {
      pw->s[r][g] = rlm__load_f(w->scales, w->sdtype, (o + r) * ng + g0 + g);
      pw->b[r][g] = rlm__load_f(w->biases, w->sdtype, (o + r) * ng + g0 + g);
    }
}

/* Rows 2p (lanes 0..7) and 2p + 1 (lanes 8..15) of a [TR][PB] table at g. */
RLM_AMX static inline __m512 row_pair(const float (*t)[PB], int p, int g) {
  return _mm512_insertf32x8(_mm512_set1_ps(t[2 * p][g]), _mm256_set1_ps(t[2 * p + 1][g]), 1);
}

/* A chunk's codes for the tile's 16 rows, as 4 blocks of A rows: row i's
 * 128 bytes are [lo, hi] of 16-byte lane 0, then of lane 1, 2, 3. */
RLM_AMX static inline void codes_a(const uint8_t *r0, int64_t rb, int64_t c, uint8_t (*a)[128]) {
  const __m512i low = _mm512_set1_epi8(15);
  const __m512i i01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), i23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int i = 0; i < TR; i++) {
    const __m512i v = _mm512_loadu_si512(r0 + i * rb + c * 64);
    const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    _mm512_store_si512(a[i], _mm512_permutex2var_epi64(lo, i01, hi));
    _mm512_store_si512(a[i] + 64, _mm512_permutex2var_epi64(lo, i23, hi));
  }
}

/* acc[p] += a chunk's 4 blocks, rows 2p and 2p + 1: each block's sums
 * times its inputs' d, summed over the BPG blocks of a group, times the
 * group's s (BPG = 1, 2, 4 for groups of 32, 64, 128: a constant where
 * inlined). g0: the chunk's first group in the panel. */
RLM_AMX static inline __attribute__((always_inline)) void scale_chunk(const int32_t (*cs)[TR][TN], const panel_x *px,
                                                                      const panel_w *pw, int pb, int g0, const int BPG,
                                                                      __m512 acc[8]) {
  __m512 d[4];
  for (int j = 0; j < 4; j++) d[j] = _mm512_load_ps(px->d[pb + j]);
  for (int p = 0; p < 8; p++)
    for (int j = 0; j < 4; j += BPG) {
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cs[j][2 * p])), d[j]);
      for (int k = 1; k < BPG; k++)
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cs[j + k][2 * p])), d[j + k], t);
      acc[p] = _mm512_fmadd_ps(t, row_pair(pw->s, p, g0 + j / BPG), acc[p]);
    }
}

/* Rows o .. o + TR - 1 over the panel, into y (set at the first panel,
 * added to after it) for inputs i0 .. i0 + n - 1. */
RLM_AMX static void tile_panel(const rlm_qmat *w, int64_t o, int64_t c0, int nc, const panel_x *px, panel_w *pw,
                               int64_t i0, int n, float *y) {
  const int64_t rb = w->cols * w->bits / 8;
  const int G = w->group_size, gp = nc * 128 / G;
  _Alignas(64) uint8_t a[TR][128];
  _Alignas(64) int32_t cs[4][TR][TN];
  __m512 acc[8];
  for (int p = 0; p < 8; p++) acc[p] = _mm512_setzero_ps();
  build_w(w, o, c0, nc, pw);
  const uint8_t *r0 = (const uint8_t *)w->wq + o * rb;
  for (int ci = 0; ci < nc; ci++) {
    /* A rows: 8-bit codes as they are stored (a row's block j is its 32
     * bytes at 128 c + 32 j), 4-bit ones widened into a */
    const uint8_t *ab = w->bits == 8 ? r0 + (c0 + ci) * 128 : a[0];
    const int64_t as = w->bits == 8 ? rb : 128;
    if (w->bits == 4) codes_a(r0, rb, c0 + ci, a);
    const int pb = ci * 4;
    /* the tile intrinsics are statements (immediate tile numbers) */
    _tile_zero(T_C0);
    _tile_zero(T_C1);
    _tile_zero(T_C2);
    _tile_zero(T_C3);
    _tile_loadd(T_A, ab, as);
    _tile_loadd(T_B, px->b[pb], 4 * TN);
    _tile_dpbusd(T_C0, T_A, T_B);
    _tile_loadd(T_A, ab + 32, as);
    _tile_loadd(T_B, px->b[pb + 1], 4 * TN);
    _tile_dpbusd(T_C1, T_A, T_B);
    _tile_loadd(T_A, ab + 64, as);
    _tile_loadd(T_B, px->b[pb + 2], 4 * TN);
    _tile_dpbusd(T_C2, T_A, T_B);
    _tile_loadd(T_A, ab + 96, as);
    _tile_loadd(T_B, px->b[pb + 3], 4 * TN);
    _tile_dpbusd(T_C3, T_A, T_B);
    _tile_stored(T_C0, cs[0], 4 * TN);
    _tile_stored(T_C1, cs[1], 4 * TN);
    _tile_stored(T_C2, cs[2], 4 * TN);
    _tile_stored(T_C3, cs[3], 4 * TN);
    const int g0 = ci * 128 / G;
    if (G == 32)
      scale_chunk(cs, px, pw, pb, g0, 1, acc);
    else if (G == 64)
      scale_chunk(cs, px, pw, pb, g0, 2, acc);
    else
      scale_chunk(cs, px, pw, pb, g0, 4, acc);
  }
  for (int g = 0; g < gp; g++) {
    const __m512 xs = _mm512_load_ps(px->xs[g]);
    for (int p = 0; p < 8; p++) acc[p] = _mm512_fmadd_ps(row_pair(pw->b, p, g), xs, acc[p]);
  }
  _Alignas(64) float t[16];
  for (int p = 0; p < 8; p++) {
    _mm512_store_ps(t, acc[p]);
    for (int k = 0; k < n; k++)
      for (int h = 0; h < 2; h++) {
        float *yo = y + (i0 + k) * w->rows + o + 2 * p + h;
        *yo = c0 ? *yo + t[8 * h + k] : t[8 * h + k];
      }
  }
}

RLM_AMX void rlm__qmm_q8_amx(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                             int64_t o0, int64_t o1, float *y) {
  const int64_t tiled = o0 + (o1 - o0) / TR * TR, chunks = w->cols / 128;
  if ((w->bits != 4 && w->bits != 8) || m < AMX_MIN_M || tiled == o0) {
    rlm__qmm_q8_vnni(w, scratch, stride, xsum, m, o0, o1, y);
    return;
  }
  panel_x px;
  panel_w pw;
  configure();
  for (int64_t c0 = 0; c0 < chunks; c0 += PANEL) {
    const int nc = chunks - c0 < PANEL ? (int)(chunks - c0) : PANEL;
    for (int64_t i0 = 0; i0 < m; i0 += TN) {
      const int n = m - i0 < TN ? (int)(m - i0) : TN;
      build_x(w, scratch, stride, xsum, i0, n, c0, nc, &px);
      for (int64_t o = o0; o < tiled; o += TR) tile_panel(w, o, c0, nc, &px, &pw, i0, n, y);
    }
  }
  _tile_release();
  if (tiled < o1) rlm__qmm_q8_vnni(w, scratch, stride, xsum, m, tiled, o1, y);
}

#endif
