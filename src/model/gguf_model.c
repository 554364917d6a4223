/* gguf_model.c -- a model from one GGUF file, as llama.cpp writes them:
 * the weights bound by GGUF tensor names and converted exactly
 * (gguf_quant.c), what binding leaves to do, and the model signature.
 *
 * The configuration comes from gguf_config.c.
 *
 * What differs from a folder, as llama.cpp's converter writes the file:
 *  - llama (Llama 3 and Mistral files): attn_q/attn_k rows are
 *    interleaved per head (pair i of half j at row 2i + j) for llama.cpp's
 *    RoPE; binding puts them back (rows permute, blocks stay whole).
 *  - gemma3: norms already hold 1 + w, so nothing is added; embeddings
 *    scale by sqrt(hidden) in f32 (llama.cpp's), not rounded to bf16.
 *  - Llama 3's rope scaling is a tensor rope_freqs.weight of per-pair
 *    divisors, applied to the frequency table after binding.
 *  - gemma4: norms are stored as used; the embeddings (token and
 *    per-layer) scale by sqrt(dim) in f32; rope_freqs.weight is the full
 *    layers' partial RoPE, read into the configuration (gguf_config.c);
 *    expert stacks are 3-D tensors, bound one expert slice at a time.
 *  - the KV caches keep bf16 (a folder's usual dtype); f16/f32 weights
 *    compute in f32 as everywhere.
 */
#include "model/gguf.h"
#include "model/gguf_quant.h"
#include "model/model.h"

#include <math.h>

/* ---- names and binding ------------------------------------------------------ */

/* A layer's Hugging Face sub-names and the GGUF ones (gemma's four norms
 * name the post-attention one differently from llama's two; Gemma 4's
 * extras after). A GGUF name with a dot is whole; others take ".weight". */
static const struct {
  const char *hf, *gguf, *gemma;
} layer_names[] = {
    {"input_layernorm", "attn_norm", NULL},
    {"self_attn.q_proj", "attn_q", NULL},
    {"self_attn.k_proj", "attn_k", NULL},
    {"self_attn.v_proj", "attn_v", NULL},
    {"self_attn.o_proj", "attn_output", NULL},
    {"self_attn.q_norm", "attn_q_norm", NULL},
    {"self_attn.k_norm", "attn_k_norm", NULL},
    {"post_attention_layernorm", "ffn_norm", "post_attention_norm"},
    {"pre_feedforward_layernorm", "ffn_norm", NULL},
    {"post_feedforward_layernorm", "post_ffw_norm", NULL},
    {"mlp.gate_proj", "ffn_gate", NULL},
    {"mlp.up_proj", "ffn_up", NULL},
    {"mlp.down_proj", "ffn_down", NULL},
    {"layer_scalar", "layer_output_scale", NULL},
    {"per_layer_input_gate", "inp_gate", NULL},
    {"per_layer_projection", "proj", NULL},
    {"post_per_layer_input_norm", "post_norm", NULL},
    {"router.proj", "ffn_gate_inp", NULL},
    {"router.scale", "ffn_gate_inp.scale", NULL},
    {"router.per_expert_scale", "ffn_down_exps.scale", NULL},
    {"experts.gate_up_proj", "ffn_gate_up_exps", NULL},
    {"experts.down_proj", "ffn_down_exps", NULL},
    {"pre_feedforward_layernorm_2", "pre_ffw_norm_2", NULL},
    {"post_feedforward_layernorm_1", "post_ffw_norm_1", NULL},
    {"post_feedforward_layernorm_2", "post_ffw_norm_2", NULL},
};

static const struct {
  const char *hf, *gguf;
} top_names[] = {{"model.embed_tokens", "token_embd"},
                 {"model.norm", "output_norm"},
                 {"lm_head", "output"},
                 {"model.embed_tokens_per_layer", "per_layer_token_embd"},
                 {"model.per_layer_model_projection", "per_layer_model_proj"},
                 {"model.per_layer_projection_norm", "per_layer_proj_norm"}};

/* hf ("model.layers.3.mlp.up_proj", with or without ".weight") as the
 * GGUF name ("blk.3.ffn_up.weight") into buf; false when there is none. */
static bool gguf_name(const rlm_model *m, const char *hf, char *buf, size_t n) {
  char base[200];
  size_t len = strlen(hf);
  if (len >= 7 && !strcmp(hf + len - 7, ".weight")) len -= 7;
  if (len >= sizeof base) return false;
  memcpy(base, hf, len), base[len] = 0;
  for (size_t i = 0; i < sizeof top_names / sizeof *top_names; i++)
    if (!strcmp(base, top_names[i].hf)) return snprintf(buf, n, "%s.weight", top_names[i].gguf) < (int)n;
  int layer, used = 0;
  if (sscanf(base, "model.layers.%d.%n", &layer, &used) != 1 || !used) return false;
  for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++) {
    if (strcmp(base + used, layer_names[i].hf)) continue;
    const char *g = m->cfg.gemma && layer_names[i].gemma ? layer_names[i].gemma : layer_names[i].gguf;
    return snprintf(buf, n, "blk.%d.%s%s", layer, g, strchr(g, '.') ? "" : ".weight") < (int)n;
  }
  return false;
}

const rlm_gguf_tensor *rlm__gguf_model_tensor(const rlm_model *m, const char *hf_name) {
  char name[256];
  return gguf_name(m, hf_name, name, sizeof name) ? rlm__gguf_tensor_find(m->gguf, name) : NULL;
}

static rlm_status find(const rlm_model *m, const char *hf, const rlm_gguf_tensor **t, rlm_error *err) {
  char name[256];
  if (!gguf_name(m, hf, name, sizeof name))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: no GGUF tensor name for '%s'", rlm__gguf_path(m->gguf), hf);
  rlm_status rc = rlm__gguf_tensor_get(m->gguf, name, t, err);
  return rc == RLM_ERR_NOT_FOUND ? RLM_ERR_FORMAT : rc; /* the message names the file and tensor */
}

/* Rows of one head block: HF row j * half + i is GGUF row 2 i + j. */
static void unpermute_rows(uint8_t *dst, const uint8_t *src, size_t row_bytes, int64_t heads, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < 2; j++)
      for (int64_t i = 0; i < half; i++)
        memcpy(dst + (size_t)(h * hd + j * half + i) * row_bytes, src + (size_t)(h * hd + 2 * i + j) * row_bytes,
               row_bytes);
}

/* The same in place over an array the arena owns. */
static rlm_status unpermute_owned(void *p, size_t row_bytes, int64_t heads, int64_t hd, rlm_error *err) {
  const size_t n = (size_t)(heads * hd) * row_bytes;
  uint8_t *tmp = rlm__malloc(n);
  if (!tmp) return rlm__err_nomem(err, "q/k rows", n);
  memcpy(tmp, p, n);
  unpermute_rows(p, tmp, row_bytes, heads, hd);
  rlm__free(tmp);
  return RLM_OK;
}

/* llama's attn_q / attn_k back in Hugging Face's row order. Dense rows
 * and native blocks still point into the read-only mapping: they move to
 * the arena. */
static rlm_status unpermute(rlm_model *m, rlm_linear *l, int64_t heads, rlm_error *err) {
  const int64_t hd = l->out / heads;
  if (l->kq.blocks) {
    const size_t rb = rlm__kq_row_bytes(l->kq.type, l->kq.cols);
    void *d = rlm__arena_alloc(&m->arena, (size_t)l->out * rb);
    if (!d) return rlm__err_nomem(err, "q/k rows", (size_t)l->out * rb);
    unpermute_rows(d, l->kq.blocks, rb, heads, hd);
    l->kq.blocks = d;
    return RLM_OK;
  }
  if (!l->quant) {
    const size_t rb = (size_t)l->in * rlm_dtype_size(l->dtype);
    void *d = rlm__arena_alloc(&m->arena, (size_t)l->out * rb);
    if (!d) return rlm__err_nomem(err, "q/k rows", (size_t)l->out * rb);
    unpermute_rows(d, l->w, rb, heads, hd);
    l->w = d;
    return RLM_OK;
  }
  rlm_qmat *q = &l->q;
  const size_t gb = (size_t)(q->cols / q->group_size) * rlm_dtype_size(q->sdtype);
  rlm_status rc = unpermute_owned((void *)q->wq, (size_t)rlm__quant_row_words(q->cols, q->bits) * 4, heads, hd, err);
  if (!rc) rc = unpermute_owned((void *)q->scales, gb, heads, hd, err);
  if (!rc) rc = unpermute_owned((void *)q->biases, gb, heads, hd, err);
  return rc;
}

/* Whether hf_prefix is a llama layer's q or k projection; *heads its heads. */
static bool permuted(const rlm_model *m, const char *hf_prefix, int64_t *heads) {
  int layer, used = 0;
  if (m->cfg.arch != RLM_ARCH_LLAMA || sscanf(hf_prefix, "model.layers.%d.%n", &layer, &used) != 1 || !used ||
      layer < 0 || layer >= m->cfg.n_layers)
    return false;
  if (!strcmp(hf_prefix + used, "self_attn.q_proj")) *heads = m->cfg.n_heads;
  else if (!strcmp(hf_prefix + used, "self_attn.k_proj")) *heads = m->cfg.layer_kv_heads[layer];
  else return false;
  return true;
}

/* Q4_K, Q5_K, Q6_K and Q5_0 are computed from their blocks where they
 * lie (quant/kquant.h: llama.cpp's bytes per weight, 4.5, 5.5, 6.56 and
 * 5.5 bits); converted, they would take 6, 7, 10 and 6 bits (f32 scales;
 * Q6_K's groups of 16 on the reference kernels; 5-bit codes have no int8
 * kernel in the affine format). The others convert to the affine format
 * at about llama.cpp's size (Q4_0: 5 bits against 4.5, Q8_0: 9 against
 * 8.5) and its many-row kernels. */
static bool native(const rlm_gguf_tensor *t, rlm_kq_type *kt) {
  if (t->type == RLM_GGML_TYPE_Q4_K) *kt = RLM_KQ_Q4_K;
  else if (t->type == RLM_GGML_TYPE_Q5_K) *kt = RLM_KQ_Q5_K;
  else if (t->type == RLM_GGML_TYPE_Q6_K) *kt = RLM_KQ_Q6_K;
  else if (t->type == RLM_GGML_TYPE_Q5_0) *kt = RLM_KQ_Q5_0;
  else return false;
  return t->n_dims == 2 && t->dims[0] % rlm__kq_block(*kt) == 0;
}

rlm_status rlm__gguf_kq_affine(const rlm_model *m, const rlm_kqmat *kq, rlm_arena *arena, rlm_qmat *out,
                               rlm_error *err) {
  static const rlm_ggml_type types[] = {[RLM_KQ_Q4_K] = RLM_GGML_TYPE_Q4_K, [RLM_KQ_Q6_K] = RLM_GGML_TYPE_Q6_K,
                                        [RLM_KQ_Q8_0] = RLM_GGML_TYPE_Q8_0, [RLM_KQ_Q5_0] = RLM_GGML_TYPE_Q5_0,
                                        [RLM_KQ_Q5_K] = RLM_GGML_TYPE_Q5_K};
  const rlm_gguf_tensor t = {.name = "(a layer's blocks)", .type = types[kq->type], .n_dims = 2,
                             .dims = {kq->cols, kq->rows, 1, 1}, .n_elements = kq->rows * kq->cols,
                             .data = kq->blocks,
                             .nbytes = (size_t)kq->rows * rlm__kq_row_bytes(kq->type, kq->cols)};
  rlm_linear l;
  rlm_status rc = rlm__gguf_linear(NULL, arena, m->gguf, &t, &l, err);
  if (!rc) *out = l.q;
  return rc;
}

rlm_status rlm__gguf_bind_linear(rlm_model *m, const char *hf_prefix, int64_t out, int64_t in, rlm_linear *l,
                                 rlm_error *err) {
  const rlm_gguf_tensor *t;
  rlm_status rc = find(m, hf_prefix, &t, err);
  if (rc) return rc;
  if (t->n_dims != 2 || t->dims[0] != in || t->dims[1] != out)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' has dims [%lld, %lld] (%d-D), expected [%lld, %lld] "
                    "(GGUF order: columns first)", rlm__gguf_path(m->gguf), t->name, (long long)t->dims[0],
                    (long long)t->dims[1], t->n_dims, (long long)in, (long long)out);
  rlm_kq_type kt;
  if (native(t, &kt)) {
    *l = (rlm_linear){.out = out, .in = in, .kq = {t->data, kt, out, in}};
  } else if ((rc = rlm__gguf_linear(m->load_pool, &m->arena, m->gguf, t, l, err))) {
    return rc;
  } else if (l->quant) {
    rlm__gguf_drop_pages(m->gguf, t); /* converted: only the copy is read from now on */
  }
  int64_t heads;
  return permuted(m, hf_prefix, &heads) ? unpermute(m, l, heads, err) : RLM_OK;
}

/* One expert of a stack [n][rows][cols] (GGUF dims cols, rows, n) as a
 * 2-D tensor of its own: expert slices start on block boundaries. */
static rlm_gguf_tensor expert_slice(const rlm_gguf_tensor *t, int64_t e) {
  rlm_gguf_tensor s = *t;
  s.n_dims = 2, s.dims[2] = 1;
  s.n_elements = t->dims[0] * t->dims[1];
  s.nbytes = t->nbytes / (size_t)t->dims[2];
  s.data = (const uint8_t *)t->data + (size_t)e * s.nbytes;
  s.offset = t->offset + (uint64_t)e * s.nbytes;
  return s;
}

rlm_status rlm__gguf_bind_stack(rlm_model *m, const char *hf_name, int64_t n, int64_t rows, int64_t cols,
                                rlm_linear **out, rlm_error *err) {
  const rlm_gguf_tensor *t;
  rlm_status rc = find(m, hf_name, &t, err);
  if (rc) return rc;
  if (t->n_dims != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != n)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' has dims [%lld, %lld, %lld] (%d-D), expected [%lld, "
                    "%lld, %lld] (GGUF order: columns first)", rlm__gguf_path(m->gguf), t->name,
                    (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2], t->n_dims, (long long)cols,
                    (long long)rows, (long long)n);
  rlm_linear *l = rlm__arena_alloc(&m->arena, (size_t)n * sizeof *l);
  if (!l) return rlm__err_nomem(err, hf_name, (size_t)n * sizeof *l);
  bool converted = false;
  for (int64_t e = 0; e < n && !rc; e++) {
    const rlm_gguf_tensor s = expert_slice(t, e);
    rlm_kq_type kt;
    if (native(&s, &kt)) l[e] = (rlm_linear){.out = rows, .in = cols, .kq = {s.data, kt, rows, cols}};
    else rc = rlm__gguf_linear(m->load_pool, &m->arena, m->gguf, &s, &l[e], err);
    converted |= !rc && l[e].quant;
  }
  if (converted) rlm__gguf_drop_pages(m->gguf, t);
  *out = l;
  return rc;
}

rlm_status rlm__gguf_bind_norm(rlm_model *m, const char *hf_name, int64_t n, const float **out, rlm_error *err) {
  const rlm_gguf_tensor *t;
  rlm_status rc = find(m, hf_name, &t, err);
  if (rc) return rc;
  const rlm_dtype dt = t->type == RLM_GGML_TYPE_F32   ? RLM_DTYPE_F32
                       : t->type == RLM_GGML_TYPE_F16 ? RLM_DTYPE_F16
                       : t->type == RLM_GGML_TYPE_BF16 ? RLM_DTYPE_BF16
                                                       : RLM_DTYPE_COUNT;
  if (dt == RLM_DTYPE_COUNT || t->n_dims != 1 || t->dims[0] != n)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' (%s, %d-D, %lld elements) is not a float vector of "
                    "%lld", rlm__gguf_path(m->gguf), t->name, rlm__ggml_type_name(t->type),
                    t->n_dims, (long long)t->dims[0], (long long)n);
  *out = rlm__norm_vector(m, t->data, dt, n, false);
  return *out ? RLM_OK : rlm__err_nomem(err, hf_name, (size_t)n * sizeof **out);
}

/* ---- after binding ---------------------------------------------------------- */

/* Llama 3's rope scaling: inv_freq[i] /= rope_freqs[i] (llama.cpp's
 * freq_factors), on the full-attention table. */
static rlm_status apply_rope_freqs(rlm_model *m, rlm_error *err) {
  const rlm_gguf_tensor *t = rlm__gguf_tensor_find(m->gguf, "rope_freqs.weight");
  if (!t) return RLM_OK;
  const int64_t half = m->cfg.head_dim / 2;
  if (t->type != RLM_GGML_TYPE_F32 || t->n_dims != 1 || t->dims[0] != half || m->cfg.max_head_dim != m->cfg.head_dim)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' (%s, %lld elements) is not F32 [%lld]",
                    rlm__gguf_path(m->gguf), rlm__ggml_type_name(t->type), (long long)t->dims[0],
                    (long long)half);
  for (int64_t i = 0; i < half; i++) {
    float f;
    memcpy(&f, (const uint8_t *)t->data + i * 4, 4);
    if (!(f > 0) || !isfinite(f))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor 'rope_freqs.weight'[%lld] is %g: factors must be "
                      "positive", rlm__gguf_path(m->gguf), (long long)i, (double)f);
    m->inv_freq[i] = (float)((double)m->inv_freq[i] / f);
  }
  return RLM_OK;
}

/* FNV-1a 64 of a value: scalars by their widened bits, strings, arrays. */
static uint64_t hash_array(uint64_t h, const rlm_gguf_array *a) {
  h = rlm__fnv1a64(h, &a->n, sizeof a->n);
  for (uint64_t i = 0; a->strs && i < a->n; i++) h = rlm__fnv1a64(h, a->strs[i].s, a->strs[i].n + 1);
  for (uint64_t i = 0; a->arrs && i < a->n; i++) h = hash_array(h, &a->arrs[i]);
  if (a->data) {
    rlm_gguf_kv e;
    for (uint64_t i = 0; i < a->n && rlm__gguf_arr_elem(a, i, &e); i++) h = rlm__fnv1a64(h, &e.v, sizeof e.v.u);
  }
  return h;
}

/* What a KV snapshot must match: the architecture, then hashes of every
 * key and value and of every tensor's name, type, dims and three 64-byte
 * samples (model.c's make_signature, over the GGUF's contents). */
static void make_signature(rlm_model *m) {
  const rlm_gguf *g = m->gguf;
  uint64_t hk = RLM_FNV_START, hw = RLM_FNV_START;
  for (size_t i = 0; i < rlm__gguf_kv_count(g); i++) {
    const rlm_gguf_kv *kv = rlm__gguf_kv_at(g, i);
    hk = rlm__fnv1a64(hk, kv->key, strlen(kv->key) + 1);
    hk = rlm__fnv1a64(hk, &kv->type, sizeof kv->type);
    if (kv->type == RLM_GGUF_TYPE_STRING) hk = rlm__fnv1a64(hk, kv->v.s.s, kv->v.s.n);
    else if (kv->type == RLM_GGUF_TYPE_ARRAY) hk = hash_array(hk, &kv->v.a);
    else hk = rlm__fnv1a64(hk, &kv->v.u, sizeof kv->v.u);
  }
  for (size_t i = 0; i < rlm__gguf_tensor_count(g); i++) {
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(g, i);
    hw = rlm__fnv1a64(hw, t->name, strlen(t->name) + 1);
    hw = rlm__fnv1a64(hw, &t->type, sizeof t->type);
    hw = rlm__fnv1a64(hw, t->dims, sizeof t->dims);
    const size_t k = RLM_MIN(t->nbytes, (size_t)64), at[3] = {0, (t->nbytes - k) / 2, t->nbytes - k};
    for (int j = 0; j < 3; j++) hw = rlm__fnv1a64(hw, (const uint8_t *)t->data + at[j], k);
  }
  snprintf(m->signature, sizeof m->signature, "%s:%016llx:%016llx", m->cfg.model_type, (unsigned long long)hk,
           (unsigned long long)hw);
}

/* "Q4_K x97, Q6_K x14, F32 x45": the types in order of first use. */
static rlm_status describe_types(rlm_model *m, rlm_error *err) {
  int count[RLM_GGML_TYPE_COUNT] = {0}, order[RLM_GGML_TYPE_COUNT], n = 0;
  for (size_t i = 0; i < rlm__gguf_tensor_count(m->gguf); i++) {
    const int t = (int)rlm__gguf_tensor_at(m->gguf, i)->type;
    if (!count[t]++) order[n++] = t;
  }
  const size_t cap = (size_t)n * 24 + 1;
  if (!(m->gguf_types = rlm__arena_alloc(&m->arena, cap))) return rlm__err_nomem(err, "model", cap);
  size_t at = 0;
  m->gguf_types[0] = 0;
  for (int k = 0; k < n; k++)
    at += (size_t)snprintf(m->gguf_types + at, cap - at, "%s%s x%d", k ? ", " : "",
                           rlm__ggml_type_name((uint32_t)order[k]), count[order[k]]);
  return RLM_OK;
}

rlm_status rlm__gguf_model_finish(rlm_model *m, rlm_error *err) {
  rlm_status rc = m->cfg.arch == RLM_ARCH_LLAMA ? apply_rope_freqs(m, err) : RLM_OK;
  if (!rc) rc = describe_types(m, err);
  if (!rc) make_signature(m);
  return rc;
}

int64_t rlm__gguf_model_1d_params(const rlm_model *m) {
  int64_t n = 0;
  for (size_t i = 0; i < rlm__gguf_tensor_count(m->gguf); i++) {
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(m->gguf, i);
    if (t->n_dims == 1 && strcmp(t->name, "rope_freqs.weight")) n += t->dims[0];
  }
  return n;
}
