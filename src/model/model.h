/* model.h -- a loaded model (configuration + weights bound to mmap'd
 * safetensors) and a session (rows of KV caches and positions, the
 * scratch of one forward pass, the pass plan).
 *
 * Weights stay in the mapping: a linear layer is a view of a dense
 * [out][in] matrix (f32, f16, bf16) or of an MLX affine triple; only norm
 * vectors are copied (to f32). The forward pass (forward.c) works in f32
 * activations and reads the weights where they lie.
 *
 * Read next: config.c (config.json), model.c (loading and binding),
 * session.c (rows, batches, rollback), forward.c (the layers), ops.c (CPU
 * kernels), dense.c (dense products).
 */
#ifndef RLM_MODEL_H
#define RLM_MODEL_H

#include "kv/kv.h"
#include "model/safetensors.h"
#include "quant/kquant.h"

typedef enum rlm_arch {
  RLM_ARCH_LLAMA, RLM_ARCH_QWEN3, RLM_ARCH_MISTRAL, RLM_ARCH_GEMMA3, RLM_ARCH_GEMMA4
} rlm_arch;

enum { RLM_MAX_LAYERS = 512 };

typedef enum rlm_rope_kind {
  RLM_ROPE_DEFAULT, RLM_ROPE_LLAMA3, RLM_ROPE_LINEAR,
  RLM_ROPE_PROPORTIONAL       /* Gemma 4: the first partial*d/2 pairs rotate */
} rlm_rope_kind;

typedef struct rlm_rope {
  rlm_rope_kind kind;
  double theta;
  double factor;              /* llama3 / linear                         */
  double low_freq_factor;     /* llama3                                  */
  double high_freq_factor;    /* llama3                                  */
  double original_max_pos;    /* llama3                                  */
  double partial;             /* proportional: share of pairs rotated    */
} rlm_rope;

typedef struct rlm_model_config {
  char model_type[32];
  rlm_arch arch;
  int vocab, hidden, inter, n_layers, n_heads, n_kv_heads, head_dim;
  int max_head_dim, max_kv_heads, max_inter; /* over the layers          */
  double rms_eps;
  rlm_rope rope;              /* full-attention layers                   */
  rlm_rope rope_local;        /* sliding layers (gemma); else = rope     */
  int sliding_window;         /* 0: none                                 */
  int64_t max_positions;      /* max_position_embeddings; 0: not given   */
  bool sliding[RLM_MAX_LAYERS]; /* layer i slides (mistral: all)         */
  int layer_head_dim[RLM_MAX_LAYERS]; /* Gemma 4: full layers differ     */
  int layer_kv_heads[RLM_MAX_LAYERS];
  int layer_inter[RLM_MAX_LAYERS];    /* Gemma 4: double-wide when shared */
  int kv_donor[RLM_MAX_LAYERS]; /* -1: own cache; else the earlier layer
                                   whose cache this one attends (Gemma 4) */
  bool gemma;                 /* 4 norms per layer, GELU, embeddings x
                                 sqrt(hidden), q/k norms (Gemma 3 and 4) */
  bool norm_plus_one;         /* Gemma 3 scales by (1 + w)               */
  bool v_norm;                /* Gemma 4: V is RMS-normalized, no weight */
  bool k_eq_v;                /* Gemma 4 attention_k_eq_v: full layers'
                                 V is their raw K projection             */
  int ple_dim, ple_vocab;     /* Gemma 4 per-layer inputs, or 0          */
  int n_experts, top_k_experts, moe_inter; /* Gemma 4 MoE block, or 0    */
  double final_softcap;       /* tanh(x/c)*c on the logits, or 0         */
  double attn_scale;          /* softmax scale (head_dim^-0.5 or
                                 query_pre_attn_scalar^-0.5)             */
  bool tie_embeddings;
  rlm_dtype dtype;            /* the checkpoint's compute dtype          */
  int q_bits, q_group;        /* MLX quantization of the weights, or 0   */
  int32_t bos;                /* -1: none                                */
  int32_t eos[8];             /* generation_config.json, else config.json */
  int n_eos;
} rlm_model_config;

/* y = x W^T: dense view, MLX triple, or GGUF blocks computed natively. */
typedef struct rlm_linear {
  int64_t out, in;
  bool quant;
  rlm_dtype dtype;            /* dense element dtype                     */
  const void *w;              /* dense [out][in]                         */
  rlm_qmat q;                 /* quantized                               */
  rlm_kqmat kq;               /* GGUF Q4_K/Q6_K blocks when kq.blocks
                                 (quant false, w NULL): quant/kquant.h   */
} rlm_linear;

typedef struct rlm_layer {
  rlm_linear wq, wk, wv, wo, gate, up, down;
  const float *attn_norm, *mlp_norm; /* [hidden] f32 (gemma: pre-norms)  */
  const float *post_attn_norm, *post_mlp_norm; /* gemma only, else NULL  */
  const float *q_norm, *k_norm;      /* [head_dim] f32, or NULL          */
  /* Gemma 4 per-layer input: x += norm(proj(gelu(gate(x)) * ple_i)) */
  rlm_linear ple_gate, ple_proj;
  const float *ple_norm;
  float scalar;                      /* layer_scalar (1 elsewhere)       */
  /* Gemma 4 MoE, beside the MLP: out = post1(mlp) + post2(experts(pre2(x)))
   * weighted by a router over norm(x) * router_scale / sqrt(hidden) */
  rlm_linear router;                 /* [n_experts][hidden]              */
  const float *router_scale;         /* [hidden]                         */
  const float *expert_scale;         /* [n_experts]                      */
  rlm_linear *expert_gate_up;        /* [n_experts] of [2 moe_inter][hidden] */
  rlm_linear *expert_down;           /* [n_experts] of [hidden][moe_inter] */
  const float *moe_post1, *moe_post2, *moe_pre2;
} rlm_layer;

struct rlm_model {
  rlm_model_config cfg;
  char *config_path;          /* <dir>/config.json: what messages about
                                 config values (also a session's) name   */
  rlm_safetensors *st;         /* a Hugging Face folder's weights, or NULL */
  rlm_gguf *gguf;              /* a GGUF file's (gguf_model.c), or NULL    */
  char *gguf_types;            /* its tensor types and counts (arena)      */
  rlm_pool *load_pool;         /* the shared workers while a GGUF file
                                  converts (model.c's load), else NULL   */
  char signature[96];         /* model_type:config hash:weight table hash */
  rlm_linear embed;           /* [vocab][hidden], rows looked up         */
  rlm_linear lm_head;         /* the embedding when tied                 */
  const float *final_norm;
  rlm_layer *layers;          /* [n_layers]                              */
  /* Gemma 4 per-layer inputs: token part and context part */
  rlm_linear ple_embed;       /* [ple_vocab][n_layers * ple_dim]         */
  rlm_linear ple_model_proj;  /* [n_layers * ple_dim][hidden]            */
  const float *ple_proj_norm; /* [ple_dim]                               */
  float ple_embed_scale;      /* sqrt(ple_dim) in the weights' dtype     */
  float *inv_freq;            /* [max_head_dim / 2] full-attention layers */
  float *inv_freq_local;      /* [max_head_dim / 2] sliding layers       */
  bool has_full, has_sliding; /* which of the two kinds the layers use   */
  float embed_scale;          /* 1, or sqrt(hidden) in the weights' dtype */
  rlm_arena arena;            /* f32 copies of norms, inv_freq, layers   */
  /* The weights on a device (the CUDA backend's, uploaded by the model's
   * first session there; freed with the model), or NULL. */
  void *dev_weights;
  void (*dev_weights_free)(void *);
};

/* One sequence of a session: its own caches (KV-shared layers have none:
 * they attend their donor layer's cache of the same row) and position. */
typedef struct rlm_row {
  rlm_kv **kv;                /* [n_layers]                              */
  int64_t pos;                /* next position                           */
} rlm_row;

/* A row's consecutive tokens [j0, j0 + n) within one pass. */
typedef struct rlm_run {
  int row, j0, n;
} rlm_run;

/* What a forward pass consumes (session.c plans it, forward.c runs it):
 * n tokens in runs of rows, each token's position, and which tokens'
 * logits are written (want[0..n_want) ascending token indices). */
typedef struct rlm_pass {
  const int32_t *ids;         /* [n]                                     */
  int n;
  const rlm_run *runs;
  int n_runs;
  const int64_t *tok_pos;     /* [n]                                     */
  const int *want;
  int n_want;
} rlm_pass;

typedef struct rlm_backend rlm_backend; /* backend.h */

struct rlm_session {
  rlm_model *m;
  rlm_session_params p;
  const rlm_backend *be;      /* the device every pass runs on           */
  void *dev;                  /* that backend's state (NULL on the CPU)  */
  rlm_row *rows;              /* [p.n_rows]; row 0's caches own the
                                 operation scratch the others borrow     */
  rlm_pool *pool;             /* a handle on the process's workers       */
  /* scratch for one pass of up to p.prefill_chunk tokens, the backend's
   * memory (xsum, moe and q8: the CPU backend's only) */
  float *x, *h, *q, *k, *v, *att, *g, *u, *xsum;
  float *logits;              /* [be->logit_rows][vocab] (device backends) */
  float *ple, *ple_tmp;       /* [chunk][n_layers][ple_dim] (Gemma 4)    */
  float *moe;                 /* MoE: one token's router and expert work */
  void *q8;                   /* act_bits 8: quantized activation rows   */
  bool rows_exact;            /* this pass verifies proposals: row-exact
                                 products (backend_cpu.c)                */
  float *rope;                /* [2][chunk][max_head_dim/2][cos, sin]:    */
                              /* the pass's angles, full then sliding     */
  /* the pass plan (session.c) */
  rlm_run *runs;              /* [n_rows]                                */
  int64_t *tok_pos;           /* [chunk]                                 */
  int *want;                  /* [chunk]                                 */
  int64_t *row_mark;          /* [n_rows] batch stamp: a row seen twice  */
  int64_t *row_need;          /* [n_rows] tokens a batch feeds each row  */
  int64_t stamp;
};

/* A layer's dense projections: attention's, the MLP's and Gemma 4's
 * per-layer input pair (absent ones have out == 0); not the MoE router and
 * experts. The one list every walk over a layer's products uses. */
enum { RLM_LAYER_LINEARS = 9 };
static inline void rlm__layer_linears(const rlm_layer *L, const rlm_linear *out[RLM_LAYER_LINEARS]) {
  const rlm_linear *ls[RLM_LAYER_LINEARS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down,
                                             &L->ple_gate, &L->ple_proj};
  memcpy(out, ls, sizeof ls);
}

/* ---- model.c: the arrays a device backend uploads ---------------------- */
/* Calls fn for every weight array and norm vector the forward pass reads
 * (a tied head's arrays come twice: the callee dedupes by pointer). */
typedef void (*rlm_model_array_fn)(void *ctx, const void *p, size_t bytes);
void rlm__model_arrays(const rlm_model *m, rlm_model_array_fn fn, void *ctx);
/* fn(ctx, l) for every linear layer the forward pass runs (a tied head is
 * the embedding, visited twice). */
typedef void (*rlm_model_linear_fn)(void *ctx, const rlm_linear *l);
void rlm__model_linears(const rlm_model *m, rlm_model_linear_fn fn, void *ctx);

/* ---- config.c ---------------------------------------------------------- */
rlm_status rlm__config_load(rlm_model_config *c, const char *dir, rlm_error *err);
/* The same from a config.json object already parsed (or built: a GGUF
 * file's metadata, gguf_model.c); messages name `path`. */
rlm_status rlm__config_parse(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err);

/* ---- gguf_model.c: a model from one GGUF file --------------------------- */
/* Opens path into m->gguf and fills m->cfg from its metadata (bos/eos
 * included); m->config_path names the file in later messages. */
rlm_status rlm__gguf_model_open(rlm_model *m, const char *path, rlm_error *err);
/* The GGUF tensor holding what a Hugging Face folder calls `hf_name`
 * ("model.layers.3.self_attn.q_proj.weight"), or NULL. */
const struct rlm_gguf_tensor *rlm__gguf_model_tensor(const rlm_model *m, const char *hf_name);
/* bind_linear / bind_norm of model.c over the GGUF tensors: the same
 * shapes and messages, the GGUF names. A llama file's q/k rows are put
 * back in Hugging Face's order (llama.cpp's converter interleaves them
 * for its RoPE). */
rlm_status rlm__gguf_bind_linear(rlm_model *m, const char *hf_prefix, int64_t out, int64_t in,
                                 rlm_linear *l, rlm_error *err);
/* A layer computed from its GGUF blocks (l->kq) converted, exactly, to the
 * affine format in arena (gguf_quant.c's conversion: 4, 5 or 6 bits, f32
 * or f16 scales; Q6_K at groups of 16), for a backend whose products take
 * only that format. */
rlm_status rlm__gguf_kq_affine(const rlm_model *m, const rlm_kqmat *kq, rlm_arena *arena, rlm_qmat *out,
                               rlm_error *err);
/* A float vector [n] of dtype dt (any alignment) as f32 in m's arena,
 * + 1 with plus_one; NULL when out of memory. */
float *rlm__norm_vector(rlm_model *m, const void *data, rlm_dtype dt, int64_t n, bool plus_one);
/* An expert stack [n][rows][cols] as n linear views or conversions. */
rlm_status rlm__gguf_bind_stack(rlm_model *m, const char *hf_name, int64_t n, int64_t rows, int64_t cols,
                                rlm_linear **out, rlm_error *err);
rlm_status rlm__gguf_bind_norm(rlm_model *m, const char *hf_name, int64_t n, const float **out,
                               rlm_error *err);
/* After binding: llama3 RoPE as a rope_freqs tensor, the signature. */
rlm_status rlm__gguf_model_finish(rlm_model *m, rlm_error *err);
/* Parameters in 1-D tensors (norms), for rlm_model_get_info. */
int64_t rlm__gguf_model_1d_params(const rlm_model *m);

/* ---- info.c ------------------------------------------------------------ */
/* bos/eos ids: config.json, then generation_config.json where present. */
rlm_status rlm__gen_config_load(rlm_model_config *c, const char *dir, rlm_error *err);
/* The KV cache configuration of layer i under session params p. */
void rlm__layer_kv_config(const rlm_model_config *c, const rlm_session_params *p, int i, rlm_kv_config *k);

/* ---- ops.c: f32 kernels -------------------------------------------------- */
/* Element-wise rows, each in one table per ISA. y may alias x, g or u;
 * rows of any length; nothing is allocated. */
typedef struct rlm_ops_isa {
  const char *name;           /* "scalar", "avx2", "avx512"              */
  /* y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps); w NULL: no weight */
  void (*rmsnorm)(float *y, const float *x, const float *w, int n, double eps);
  /* y = gelu_tanh(g) * u (transformers' gelu_pytorch_tanh)             */
  void (*gelu_tanh_mul)(float *y, const float *g, const float *u, int64_t n);
  /* y = g / (1 + e^-g) * u                                             */
  void (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
  /* x = cap * tanh(x / cap) in place (the final logit cap of Gemma 2/4) */
  void (*softcap)(float *x, float cap, int64_t n);
} rlm_ops_isa;

/* The table for isa ("scalar", "avx2", "avx512"), or NULL where this CPU
 * (or build) lacks it. The scalar table defines the results. */
const rlm_ops_isa *rlm__ops_isa(const char *isa);
/* ops_x86.c: the vector tables, or NULL (always NULL off x86-64). */
const rlm_ops_isa *rlm__ops_x86(const char *isa);
/* Through the fastest table (chosen once per process). w NULL: no weight
 * (Gemma 4's V norm). */
void rlm__rmsnorm(float *y, const float *x, const float *w, int n, double eps);
void rlm__gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n);
void rlm__silu_mul(float *y, const float *g, const float *u, int64_t n);
void rlm__softcap(float *x, float cap, int64_t n);
/* The scalar table's functions. */
void rlm__rmsnorm_ref(float *y, const float *x, const float *w, int n, double eps);
void rlm__gelu_tanh_mul_ref(float *y, const float *g, const float *u, int64_t n);
void rlm__silu_mul_ref(float *y, const float *g, const float *u, int64_t n);
void rlm__softcap_ref(float *x, float cap, int64_t n);
float rlm__gelu_tanh(float x);
/* cs[i] = cos, sin of pos * inv_freq[i] for i < half: computed once per
 * chunk and position, shared by every layer of that kind. */
void rlm__rope_angles(float *cs, const float *inv_freq, int half, int64_t pos);
/* Rotates n_heads heads of head_dim in place by the angles cs. */
void rlm__rope(float *x, int n_heads, int head_dim, const float *cs);
/* y [m][out] = x [m][in] . W^T over the pool; xsum scratch [m][in/32]. */
void rlm__linear(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y,
                 float *xsum);
/* The same with int8 activations where the weights allow it (4- or 8-bit,
 * cols % 128 == 0: every 4-bit layer and the 8-bit tied lm_head of an MLX
 * 4-bit checkpoint); scratch: rlm__qmatmul_q8_bytes. */
void rlm__linear_q8(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch);
/* The same, each row of y with the bits row alone would give
 * (rlm__qmatmul_q8_rows): a speculative verification's products. */
void rlm__linear_q8_rows(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch);
/* Bytes of rlm__linear_q8's scratch for m rows of at most cols inputs
 * (any weight kind). */
size_t rlm__linear_q8_bytes(int64_t m, int64_t cols);
/* One row of an embedding (dense or quantized) into f32. */
void rlm__embed_row(const rlm_linear *e, int64_t row, float *out);

/* ---- dense.c: dense linear products -------------------------------------- */
/* y [m][out] = x [m][in] . W^T for a dense W [out][in] of dtype f32, f16
 * or bf16, over the pool (NULL: inline); x and y f32, any shapes, m >= 1.
 * Allocates nothing. Uses the fastest variant this CPU runs. */
void rlm__dense_matmul(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out, int64_t in,
                       const float *x, int64_t m, float *y);
typedef void (*rlm_dense_fn)(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out,
                             int64_t in, const float *x, int64_t m, float *y);
/* One variant: "scalar" (the reference), "avx2", "avx512"; NULL if the
 * name is unknown or this CPU (or build) lacks the ISA. */
rlm_dense_fn rlm__dense_matmul_isa(const char *isa);

/* ---- forward.c ---------------------------------------------------------- */
/* Runs one pass (n <= prefill_chunk tokens) through every layer, advances
 * the rows of its runs, and writes the wanted tokens' logits [n_want][vocab]
 * into `logits` (NULL: none). The caches must already have room (the
 * session reserved it), so only a broken invariant can fail here. */
rlm_status rlm__forward(rlm_session *s, const rlm_pass *ps, float *logits, rlm_error *err);


#endif /* RLM_MODEL_H */
