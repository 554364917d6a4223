/* backend.h -- the interface the forward pass calls (issue 17): what a
 * device must do for one pass of tokens, and nothing about how.
 *
 * forward.c is written once against this table; the CPU backend
 * (backend_cpu.c) runs today's kernels on host memory, the CUDA backend
 * (src/cuda/backend_cuda.c, -DRINGLM_CUDA=ON) runs kernels on device
 * memory. A session picks one at create (rlm_session_params.device) and
 * every activation buffer of the session is that backend's memory: the
 * forward pass only passes the pointers along. Weights and norm vectors
 * are passed as the model's host views (rlm_linear, const float *); a
 * device backend maps them to the copies it uploaded once per model.
 *
 * Element-wise ops cannot fail once the session exists (their buffers are
 * sized at create); a device backend that meets a launch error keeps the
 * first one and returns it from end_pass, so the forward pass checks once.
 * The ops that read the pass (ids, positions, wanted tokens, rows) take
 * it, because a device reads its own copy made by begin_pass: a decode
 * step's launches then depend on nothing that changes from step to step,
 * which is what lets the CUDA backend replay one captured graph.
 */
#ifndef RLM_BACKEND_H
#define RLM_BACKEND_H

#include "model/model.h"

struct rlm_backend {
  const char *name;                    /* "cpu", "cuda"                   */
  /* Wanted tokens' logits per lm_head product: the CPU writes them in
   * place (0: all at once, into the caller's array); a device computes
   * this many rows at a time into its own buffer and copies them out. */
  int logit_rows;
  /* Activation buffers of the session (NULL: out of memory). */
  void *(*alloc)(rlm_session *s, size_t bytes);
  void (*release)(rlm_session *s, void *p);

  rlm_status (*begin_pass)(rlm_session *s, const rlm_pass *ps, rlm_error *err);
  /* out[j] = embedding row ids[j] (widened to f32) * scale, j < ps->n. */
  void (*embed)(rlm_session *s, const rlm_pass *ps, const rlm_linear *e, float scale, float *out);
  /* y [n][out] = x [n][in] . W^T (int8 activations when p.act_bits 8). */
  void (*linear)(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y);
  /* k <= 3 products of one x (q, k, v; gate, up): ys[i] = x W_i^T, as k
   * calls of linear give them; a device may launch them as one. */
  void (*linears)(rlm_session *s, const rlm_linear *const *ls, float *const *ys, int k, const float *x, int64_t n);
  /* rows of n floats: y = w * x / rms(x); w NULL: unweighted; y may be x */
  void (*rmsnorm)(rlm_session *s, float *y, const float *x, const float *w, int rows, int n, double eps);
  void (*add)(rlm_session *s, float *x, const float *h, size_t n);            /* x += h     */
  /* The residual of one block and the next block's input norm, rows of n:
   * x += post ? rmsnorm(h) * post : h; then y = rmsnorm(x) * w (y may be h). */
  void (*add_norm)(rlm_session *s, float *x, float *h, const float *post, const float *w, float *y, int rows, int n,
                   double eps);
  void (*scale)(rlm_session *s, float *x, float a, size_t n);                 /* x *= a     */
  void (*softcap)(rlm_session *s, float *x, float cap, size_t n);             /* tanh(x/c)c */
  void (*copy)(rlm_session *s, float *dst, const float *src, size_t n);
  /* y[r][i] = act(g[r][i]) * u[r * u_stride + i]; gelu_tanh or silu. */
  void (*act_mul)(rlm_session *s, bool gelu, float *y, const float *g, const float *u, int rows, int n,
                  int64_t u_stride);
  /* Optional (NULL: linears, then act_mul): the MLP's gated product of
   * n rows of x, y [n][gate.out] = act(x gate^T) * (x up^T), gelu_tanh or
   * silu; u [n][up.out] is scratch for a device that runs the two steps.
   * A device may fuse them (no activation launch), as the two steps'
   * bits. */
  void (*gated)(rlm_session *s, bool gelu, const rlm_linear *gate, const rlm_linear *up, const float *x, int64_t n,
                float *y, float *u);
  /* cs[j * stride ..] = cos, sin of tok_pos[j] * inv_freq[i], i < half. */
  void (*rope_angles)(rlm_session *s, const rlm_pass *ps, float *cs, int64_t stride, const float *inv_freq,
                      int half);
  /* Token j's heads of x [n][heads][hd] rotated by cs + j * stride. */
  void (*rope)(rlm_session *s, float *x, int n, int heads, int hd, const float *cs, int64_t stride);
  /* Optional (NULL: rmsnorm and rope in turn): layer li's q [n][hq][hd]
   * normed by qw (NULL: not normed) and rotated by cs (rope's layout); k
   * [n][hkv][hd] likewise by kw, unless k is NULL (a KV-shared layer); v
   * normed without a weight when vnorm. One launch on a device, which may
   * also write k and v into li's cache there (its attend then does not). */
  void (*qkv_norm_rope)(rlm_session *s, int li, float *q, float *k, float *v, int n, int hq, int hkv, int hd,
                        const float *qw, const float *kw, bool vnorm, double eps, const float *cs, int64_t stride);
  /* dst[i] = src[ps->want[i0 + i]] for i < count, rows of width floats. */
  void (*gather_wanted)(rlm_session *s, const rlm_pass *ps, int i0, int count, float *dst, const float *src,
                        int64_t width);
  /* Layer li: the pass's k, v (s->k, s->v) into each token's row's cache,
   * then s->q attends it into s->att (a KV-shared layer attends its
   * donor's cache, appended to earlier in this pass). */
  rlm_status (*attend)(rlm_session *s, const rlm_pass *ps, int li, rlm_error *err);
  /* Gemma 4's MoE block of layer li for the pass's n tokens: s->h (the
   * MLP's output) becomes post1(h) + post2(sum_k w_k expert_k(pre2(x))),
   * each token routed to its own experts (rlm__moe_route). */
  void (*moe)(rlm_session *s, int li, int n);
  /* The pass is done: the first error an op met, else the wanted logits
   * computed in the backend's buffer (count rows) copied to host. */
  rlm_status (*copy_logits)(rlm_session *s, float *host, const float *dev, size_t n, rlm_error *err);
  rlm_status (*end_pass)(rlm_session *s, rlm_error *err);
  /* The rows' caches: the first layer that cannot take `row` back to
   * position `to` (a ring past its slack), or -1; the KV bytes a row holds;
   * the backend's state freed (after the session's buffers). */
  int (*rewind_blocker)(const rlm_session *s, int row, int64_t to);
  size_t (*row_kv_bytes)(const rlm_session *s, int row);
  void (*fini)(rlm_session *s);
  /* A row's caches through the host, for snapshots (snapshot.c): `twin`
   * [n_layers] holds host caches of the CPU's configuration, one row each
   * (NULL for KV-shared layers). row_out makes them hold what the device
   * row holds (every position a query can still see, in the CPU's format);
   * row_in makes the device row hold what they hold (checked by then).
   * NULL on the CPU, whose rows are host caches already. */
  rlm_status (*row_out)(const rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err);
  rlm_status (*row_in)(rlm_session *s, int row, rlm_kv *const *twin, rlm_error *err);
  /* Host memory the device copies logits into at the bus's speed
   * (page-locked), and its release; NULL on the CPU (the heap's). */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
};

/* The MoE router's rule, shared by the backends: logit [n_experts] (the
 * router's output for one token) becomes its softmax; idx [top_k] the
 * chosen experts in ascending order, w [top_k] their weights (the kept
 * probabilities renormalized, times each expert's scale). */
void rlm__moe_route(const rlm_model_config *c, const rlm_layer *L, float *logit, int *idx, float *w);

/* The CPU backend: host memory, the kernel tables of ops.c, dense.c,
 * src/quant and the KV-state layer. */
extern const rlm_backend rlm__backend_cpu;

/* The CUDA backend (src/cuda/backend_cuda.c; RLM_HAVE_CUDA builds only).
 * session_init checks what the GPU cannot run yet (RLM_ERR_UNSUPPORTED,
 * named), uploads the model's weights at its first session there, sets
 * s->be and s->dev and allocates the caches whole (n_ctx chosen when 0);
 * rows then have no rlm_kv caches of their own. */
rlm_status rlm__cuda_session_init(rlm_session *s, rlm_error *err);

#endif /* RLM_BACKEND_H */
