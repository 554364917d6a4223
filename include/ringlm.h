/* ringlm.h -- the public C API of libringlm.
 *
 * ringlm is an LLM inference engine. This header is the whole of what the
 * CLI, the server and any embedding program may use; tensor layouts, cache
 * internals and kernels never appear here.
 *
 * Conventions (they hold for every declaration below):
 *  - Every call that can fail returns rlm_status: RLM_OK (0) on success,
 *    a negative RLM_ERR_* on failure, a positive value for a recoverable
 *    condition. Predicates return bool.
 *  - Every fallible call takes a trailing `rlm_error *err`. It may be NULL.
 *    When it is not NULL and the call fails, err->code is the returned status
 *    and err->msg a one-line message that names the file (or argument) and
 *    what is wrong. There is no process-global error string.
 *  - Handles are opaque (`typedef struct rlm_x rlm_x;`, no _t suffix).
 *    Constructors write the handle through an out-parameter and set it to
 *    NULL on failure; every *_free accepts NULL.
 *  - The library never calls exit() or abort() for anything a caller can
 *    trigger: bad files, bad arguments and out-of-memory are statuses.
 *  - Thread safety: distinct handles may be used from distinct threads.
 *    A single handle is not thread-safe unless its doc says so. The log
 *    settings are the only process-wide state and are set atomically.
 */
#ifndef RINGLM_H
#define RINGLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RLM_BUILD)
#define RLM_API __attribute__((visibility("default")))
#else
#define RLM_API
#endif

/* ------------------------------------------------------------------------
 * Version. Code and formats are versioned separately: RLM_QUANT_VERSION
 * changes only if the packed-weight format changes (it is MLX's, so never).
 * ---------------------------------------------------------------------- */
#define RLM_VERSION_MAJOR 0
#define RLM_VERSION_MINOR 1
#define RLM_VERSION_PATCH 0
#define RLM_VERSION_HEX                                                     \
  ((RLM_VERSION_MAJOR << 16) | (RLM_VERSION_MINOR << 8) | RLM_VERSION_PATCH)
#define RLM_VERSION_STRING "0.1.0"
#define RLM_QUANT_VERSION 1

/* The version of the library actually linked, as "MAJOR.MINOR.PATCH". */
RLM_API const char *rlm_version(void);

/* The machine as the library sees it, for thread defaults and messages.
 * Worked out once per process; thread-safe. */
typedef struct rlm_cpu_info {
  int n_physical;       /* physical cores this process may run on (SMT
                           siblings counted once): the default n_threads */
  int n_available;      /* logical CPUs of this process's affinity mask */
  const char *features; /* vector sets the kernels use here, e.g.
                           "AVX2 AVX-512 VNNI", or "scalar"; static    */
} rlm_cpu_info;

RLM_API rlm_cpu_info rlm_cpu_info_get(void);

/* ------------------------------------------------------------------------
 * Status and error detail.
 * Values are append-only: they may be stored or sent over the wire.
 * ---------------------------------------------------------------------- */
typedef enum rlm_status {
  RLM_OK = 0,
  RLM_ERR_NOMEM = -1,       /* an allocation failed                        */
  RLM_ERR_INVALID = -2,     /* a bad argument (shape, range, NULL, option) */
  RLM_ERR_IO = -3,          /* open/read/write/mmap failed                 */
  RLM_ERR_FORMAT = -4,      /* a file's contents are malformed             */
  RLM_ERR_UNSUPPORTED = -5, /* well-formed but not supported (dtype, arch) */
  RLM_ERR_NOT_FOUND = -6,   /* a named tensor/file/key does not exist      */
  RLM_ERR_INTERNAL = -7,    /* a broken invariant inside the library       */
  RLM_KV_FULL = 1,          /* the KV cache has no room; state unchanged   */
  RLM_ABORTED = 2,          /* a callback asked to stop; state unchanged   */
} rlm_status;

#define RLM_ERROR_MSG_MAX 512

typedef struct rlm_error {
  rlm_status code;              /* same as the call's return value */
  char msg[RLM_ERROR_MSG_MAX];  /* one line, NUL-terminated        */
} rlm_error;

/* A constant name for a status ("RLM_ERR_FORMAT: malformed file"). */
RLM_API const char *rlm_status_str(rlm_status s);

/* ------------------------------------------------------------------------
 * Logging. Quiet by default: the library prints nothing unless asked.
 * The callback (NULL = stderr) receives one line without the newline.
 * ---------------------------------------------------------------------- */
typedef enum rlm_log_level {
  RLM_LOG_NONE = 0,
  RLM_LOG_ERROR = 1,
  RLM_LOG_WARN = 2,
  RLM_LOG_INFO = 3,
  RLM_LOG_DEBUG = 4,
} rlm_log_level;

typedef void (*rlm_log_fn)(rlm_log_level level, const char *line, void *ctx);

RLM_API void rlm_log_set(rlm_log_level level, rlm_log_fn fn, void *ctx);

/* ------------------------------------------------------------------------
 * Element types. Values are append-only (they appear in saved caches).
 * ---------------------------------------------------------------------- */
typedef enum rlm_dtype {
  RLM_DTYPE_F32 = 0,
  RLM_DTYPE_F16 = 1,
  RLM_DTYPE_BF16 = 2,
  RLM_DTYPE_U32 = 3,
  RLM_DTYPE_F64 = 4,
  RLM_DTYPE_I8 = 5,
  RLM_DTYPE_U8 = 6,
  RLM_DTYPE_I16 = 7,
  RLM_DTYPE_U16 = 8,
  RLM_DTYPE_I32 = 9,
  RLM_DTYPE_I64 = 10,
  RLM_DTYPE_U64 = 11,
  RLM_DTYPE_BOOL = 12,
  RLM_DTYPE_COUNT
} rlm_dtype;

/* Bytes per element, or 0 for an invalid value. */
RLM_API size_t rlm_dtype_size(rlm_dtype t);
/* safetensors' spelling ("F32", "BF16", ...), or NULL. */
RLM_API const char *rlm_dtype_name(rlm_dtype t);

/* ------------------------------------------------------------------------
 * MLX affine quantization, bit-exact with MLX's GPU kernels (mx.quantize).
 *
 * A matrix of `rows` x `cols` floats (dtype f32, f16 or bf16) is cut into
 * groups of `group_size` (32, 64, 128) consecutive elements along a row.
 * Each group stores a scale and a bias in the input's dtype and `bits`
 * (2, 3, 4, 5, 6, 8) per element, packed LSB-first into u32 words:
 *   wq     [rows][cols * bits / 32]        u32
 *   scales [rows][cols / group_size]       input dtype
 *   biases [rows][cols / group_size]       input dtype
 * Dequantized value: q * scale + bias.
 * ---------------------------------------------------------------------- */
RLM_API rlm_status rlm_quantize(const void *x, rlm_dtype dtype, int64_t rows,
                                int64_t cols, int bits, int group_size,
                                uint32_t *wq, void *scales, void *biases,
                                rlm_error *err);

/* The inverse: writes rows x cols elements of `dtype` (the scales' dtype)
 * to `out`, computing q*scale + bias in that dtype as MLX does. */
RLM_API rlm_status rlm_dequantize(const uint32_t *wq, const void *scales,
                                  const void *biases, rlm_dtype dtype,
                                  int64_t rows, int64_t cols, int bits,
                                  int group_size, void *out, rlm_error *err);

/* y[m][n_out] = x[m][k] . W^T where W [n_out][k] is quantized as above with
 * scales/biases of `sdtype`. Accumulates in f32 per group as
 * scale * sum(x*q) + bias * sum(x). n_threads <= 0 means all cores. */
RLM_API rlm_status rlm_quantized_matmul(const float *x, int64_t m,
                                        const uint32_t *wq, const void *scales,
                                        const void *biases, rlm_dtype sdtype,
                                        int64_t n_out, int64_t k, int bits,
                                        int group_size, float *y,
                                        int n_threads, rlm_error *err);

/* ------------------------------------------------------------------------
 * Weights: a read-only view of safetensors files (a single file, or a
 * Hugging Face folder with model.safetensors or a sharded index). Data stay
 * mmap'd; pointers are valid until rlm_weights_free.
 * ---------------------------------------------------------------------- */
typedef struct rlm_weights rlm_weights;

#define RLM_MAX_DIMS 8

typedef struct rlm_tensor_info {
  const char *name;              /* owned by the rlm_weights            */
  rlm_dtype dtype;
  int ndim;
  int64_t shape[RLM_MAX_DIMS];
  const void *data;              /* mmap'd, possibly unaligned          */
  size_t nbytes;
  const char *file;              /* the shard it lives in               */
} rlm_tensor_info;

RLM_API rlm_status rlm_weights_open(rlm_weights **out, const char *path,
                                    rlm_error *err);
RLM_API void rlm_weights_free(rlm_weights *w);
RLM_API size_t rlm_weights_count(const rlm_weights *w);
/* i in [0, count): tensors in name order. */
RLM_API rlm_status rlm_weights_get(const rlm_weights *w, size_t i,
                                   rlm_tensor_info *info, rlm_error *err);
/* By name; RLM_ERR_NOT_FOUND if absent. */
RLM_API rlm_status rlm_weights_find(const rlm_weights *w, const char *name,
                                    rlm_tensor_info *info, rlm_error *err);

/* ------------------------------------------------------------------------
 * GGUF files (llama.cpp's format, versions 2 and 3): a read-only view for
 * listing what a file holds (`ringlm inspect FILE.gguf`). The file is
 * mmap'd and checked whole on open: a malformed one is RLM_ERR_FORMAT, a
 * version other than 2 or 3 (or a big-endian file) RLM_ERR_UNSUPPORTED,
 * the message naming the file and the key or tensor. Keys and tensors
 * keep the file's order. Strings and pointers are valid until
 * rlm_gguf_free. Once open, a handle may be read from several threads.
 * ---------------------------------------------------------------------- */
typedef struct rlm_gguf rlm_gguf;

#define RLM_GGUF_MAX_DIMS 4

RLM_API rlm_status rlm_gguf_open(rlm_gguf **out, const char *path, rlm_error *err);
RLM_API void rlm_gguf_free(rlm_gguf *g);
/* The format version (2 or 3) and the data alignment (general.alignment,
 * else 32). */
RLM_API uint32_t rlm_gguf_version(const rlm_gguf *g);
RLM_API uint32_t rlm_gguf_alignment(const rlm_gguf *g);

typedef struct rlm_gguf_key_info {
  const char *key;      /* owned by the rlm_gguf                         */
  char type[24];        /* "uint32", "float32", "string", "array[int32]" */
  uint64_t n;           /* an array's elements, a string's bytes; else 1 */
} rlm_gguf_key_info;

RLM_API size_t rlm_gguf_key_count(const rlm_gguf *g);
/* Key i in [0, count) and its value rendered for a person into
 * value[0, value_size) (NUL-terminated, cut to fit; may be NULL if
 * value_size is 0): numbers in decimal (floats in the fewest digits that
 * read back the same), true/false, strings quoted with C escapes and cut
 * after 64 bytes as "...", with their byte length; arrays as their first
 * 8 elements ("[1, 2, ...]"), with their length when cut. */
RLM_API rlm_status rlm_gguf_key_get(const rlm_gguf *g, size_t i, rlm_gguf_key_info *info,
                                    char *value, size_t value_size, rlm_error *err);

typedef struct rlm_gguf_tensor_info {
  const char *name;                /* owned by the rlm_gguf                */
  const char *type;                /* ggml type name: "F16", "Q4_K", ...   */
  uint32_t type_id;                /* ggml's id of it                      */
  int n_dims;                      /* 1..RLM_GGUF_MAX_DIMS                 */
  int64_t dims[RLM_GGUF_MAX_DIMS]; /* GGUF's order: dims[0] varies fastest
                                      (the reverse of rlm_tensor_info's)  */
  const void *data;                /* mmap'd; aligned to the alignment
                                      when that is at most the page size  */
  size_t nbytes;
  uint64_t offset;                 /* of the data, from the file's start   */
} rlm_gguf_tensor_info;

RLM_API size_t rlm_gguf_tensor_count(const rlm_gguf *g);
/* i in [0, count). */
RLM_API rlm_status rlm_gguf_tensor_get(const rlm_gguf *g, size_t i, rlm_gguf_tensor_info *info,
                                       rlm_error *err);

/* ------------------------------------------------------------------------
 * Model quantization (`ringlm quantize`): every 2-D `*.weight` tensor that
 * is not a norm (and not an embedding unless asked) becomes the MLX triple
 * name.weight (u32), name.scales, name.biases; everything else is copied.
 * `in` is a .safetensors file or a Hugging Face model folder; for a folder,
 * `out` is a folder that receives model.safetensors, config.json (the
 * input's text with "quantization": {"group_size", "bits"} added, every
 * other value spelled as it was), and copies of the other files. A file in
 * gives a file out (or `out`/model.safetensors when `out` is a folder).
 *
 * The output appears whole or not at all: it is built under a temporary
 * sibling name and renamed into place, and a failure leaves nothing. An
 * existing output is refused (RLM_ERR_INVALID) unless `overwrite`, and then
 * replaced only once the new one is complete. The output may never be the
 * input, lie inside it, or contain it.
 * ---------------------------------------------------------------------- */
/* A per-layer choice, as mlx-lm's mixed recipes make them: tensors whose
 * name contains `match` get these bits and group size (bits 0: left
 * dense). The first matching override applies; config.json then lists
 * each such layer under "quantization" ({"bits", "group_size"}, or false
 * for a dense one), the layout mlx-lm writes and reads. */
typedef struct rlm_quantize_override {
  const char *match;
  int bits;                  /* 0: not quantized                       */
  int group_size;            /* 0: the default group size              */
} rlm_quantize_override;

/* The most overrides one call takes (their hits are counted in the stats). */
#define RLM_QUANTIZE_MAX_OVERRIDES 64

typedef struct rlm_quantize_params {
  int bits;                  /* 2, 3, 4, 5, 6, 8 (default 4)          */
  int group_size;            /* 32, 64, 128 (default 64)              */
  bool quantize_embeddings;  /* also embed_tokens etc. (default false) */
  int n_threads;             /* <= 0: the physical cores               */
  const rlm_quantize_override *overrides;
  int n_overrides;           /* <= RLM_QUANTIZE_MAX_OVERRIDES          */
  bool overwrite;            /* replace an existing output (default false) */
} rlm_quantize_params;

RLM_API rlm_quantize_params rlm_quantize_params_default(void);

/* Tensors quantized with one (bits, group size). */
typedef struct rlm_quantize_format {
  int bits;
  int group_size;
  int64_t n_tensors;
} rlm_quantize_format;

typedef struct rlm_quantize_stats {
  int64_t n_tensors;          /* tensors written                 */
  int64_t n_quantized;        /* of which quantized              */
  int64_t n_kept_dense;       /* 2-D weights (not norms) left dense: embeddings,
                                 overrides with bits 0, widths not a multiple of G */
  int64_t bytes_in;           /* tensor bytes read               */
  int64_t bytes_out;          /* tensor bytes written            */
  /* The quantized tensors by format, in order of first use (at most 6 bits
   * x 3 group sizes). */
  rlm_quantize_format formats[18];
  int n_formats;
  /* 2-D weights (not norms) each override was the first match of; 0: it
   * matched none, or only ones an earlier override took: [n_overrides]. */
  int64_t n_override_hits[RLM_QUANTIZE_MAX_OVERRIDES];
} rlm_quantize_stats;

RLM_API rlm_status rlm_quantize_model(const char *in, const char *out,
                                      const rlm_quantize_params *params,
                                      rlm_quantize_stats *stats,
                                      rlm_error *err);

/* ------------------------------------------------------------------------
 * KV-state layer: the caches one attention layer keeps, usable on its own.
 *
 * A cache holds B rows (batch sequences), each with its own positions.
 * Keys and values of a token are written once, at a slot chosen from its
 * position, and never moved; attention masks come from positions. Kinds:
 *   PLAIN           every position, dense (f32, f16 or bf16)
 *   QUANT           every position, MLX affine-quantized (K and V may use
 *                   different bit widths, e.g. K8V4)
 *   ROTATING        a sliding window: a query at position p sees positions
 *                   p-window < k <= p, plus the first `keep` positions
 *                   ("sink" tokens) when keep > 0; dense
 *   ROTATING_QUANT  the same ring, quantized; with dense_first, the first
 *                   append attends its own keys unquantized (the keys are
 *                   stored quantized) -- mlx-lm's quantized_kv_start for rings
 * A ring holds window + max_chunk - 1 slots: the slack lets any append or
 * rollback of up to max_chunk tokens proceed without losing a key that a
 * later query needs, so rollback after wrap-around recomputes nothing.
 *
 * Tensor layouts (all f32, row-major):
 *   k   [B][N][H][Dk]     v   [B][N][H][Dv]
 *   q   [B][N][Hq][Dk]    out [B][N][Hq][Dv]
 * Hq is a multiple of H; query head j uses kv head j / (Hq / H) (GQA,
 * without copying K/V). Row b's token n has position offset(b) + n - pad(b)
 * where pad(b) = left_pad[b] leading padding tokens (not stored; their
 * outputs are zeros).
 *
 * Every operation is all-or-nothing: on error the cache is unchanged.
 * A cache is not thread-safe; distinct caches may be used concurrently.
 * ---------------------------------------------------------------------- */
typedef struct rlm_kv rlm_kv;

typedef enum rlm_kv_kind {
  RLM_KV_PLAIN = 0,
  RLM_KV_QUANT = 1,
  RLM_KV_ROTATING = 2,
  RLM_KV_ROTATING_QUANT = 3,
} rlm_kv_kind;

typedef struct rlm_kv_config {
  rlm_kv_kind kind;
  int n_rows;          /* B >= 1                                            */
  int n_kv_heads;      /* H >= 1                                            */
  int head_dim_k;      /* Dk                                                */
  int head_dim_v;      /* Dv (0: same as Dk)                                */
  rlm_dtype dtype;     /* dense storage and scale/bias dtype: F32/F16/BF16  */
  int k_bits, v_bits;  /* quantized kinds: 2, 3, 4, 5, 6, 8                 */
  int group_size;      /* quantized kinds: 32, 64, 128                      */
  int window;          /* rotating kinds: positions one query sees          */
  int keep;            /* rotating kinds: sink positions, 0 <= keep < window */
  int max_chunk;       /* most tokens one append step or rollback spans     */
  int64_t reserve;     /* slots to allocate up front (0: grow on demand)    */
  bool dense_first;    /* ROTATING_QUANT only: see above                    */
  int q_per_kv;        /* largest Hq / H a read will use (scratch sizing)   */
} rlm_kv_config;

/* Defaults: 1 row, dtype BF16, 4-bit K and V with group 64, window 4096,
 * keep 0, max_chunk 512, q_per_kv 8; heads and dims must be set by the
 * caller. */
RLM_API rlm_kv_config rlm_kv_config_default(rlm_kv_kind kind);
RLM_API rlm_status rlm_kv_create(rlm_kv **out, const rlm_kv_config *cfg,
                                 rlm_error *err);
RLM_API void rlm_kv_free(rlm_kv *kv);
/* "kv:plain", "kv:quant:B:G" (B = "8" or "k8v4"), "kv:rotating:W:K",
 * "kv:rotating-quant:B:G" (+ ":W:K"), "...-dense-first...". */
RLM_API const char *rlm_kv_signature(const rlm_kv *kv);
RLM_API int rlm_kv_rows(const rlm_kv *kv);
/* Next position of a row: the number of real tokens it has seen. */
RLM_API int64_t rlm_kv_offset(const rlm_kv *kv, int row);

typedef struct rlm_kv_batch {
  int n_tokens;          /* N per row                                    */
  const float *k;        /* [B][N][H][Dk]                                */
  const float *v;        /* [B][N][H][Dv]                                */
  const float *q;        /* [B][N][Hq][Dk], or NULL to append only       */
  int n_q_heads;         /* Hq                                           */
  float scale;           /* softmax scale                                */
  const int *left_pad;   /* [B] padding tokens at the start, or NULL     */
  float *out;            /* [B][N][Hq][Dv]                               */
} rlm_kv_batch;

/* One token per row (N = 1), written in place at the ring head. */
RLM_API rlm_status rlm_kv_append_decode(rlm_kv *kv, const rlm_kv_batch *b,
                                        rlm_error *err);
/* N tokens per row, each attending causally (bottom-right aligned) within
 * the window; processed in steps of at most max_chunk tokens. */
RLM_API rlm_status rlm_kv_append_window(rlm_kv *kv, const rlm_kv_batch *b,
                                        rlm_error *err);
/* N tokens per row, one decode per position (same outputs as a window). */
RLM_API rlm_status rlm_kv_append_committed(rlm_kv *kv, const rlm_kv_batch *b,
                                           rlm_error *err);
/* Attends the live window plus the N block tokens (N <= max_chunk) under
 * the same mask as an append, stored as the cache would store them, but
 * appends nothing (a verification read). */
RLM_API rlm_status rlm_kv_read_block(rlm_kv *kv, const rlm_kv_batch *b,
                                     rlm_error *err);
/* Donor attention (KV sharing): queries for each row's last n appended
 * positions attend this cache as those positions did. k, v are unused. */
RLM_API rlm_status rlm_kv_attend_last(rlm_kv *kv, const rlm_kv_batch *b,
                                      rlm_error *err);
/* The same, one query at a time, each reading the cache as a one-token
 * step at its position did: rlm_kv_append_committed's counterpart, whose
 * outputs are a run of decode steps' to the bit. */
RLM_API rlm_status rlm_kv_attend_committed(rlm_kv *kv, const rlm_kv_batch *b,
                                           rlm_error *err);
/* Forgets the last n positions of every row (n is clamped per row). */
RLM_API rlm_status rlm_kv_trim(rlm_kv *kv, int64_t n, rlm_error *err);
/* Ragged rollback: row i keeps keep[i] of the tokens appended since its
 * offset was before[i]; the rest are forgotten as if never appended, also
 * after the ring wrapped (no recomputation). RLM_ERR_INVALID if a row
 * would need a key the ring no longer holds (more than max_chunk tokens
 * appended since `before`). */
RLM_API rlm_status rlm_kv_rollback(rlm_kv *kv, const int64_t *before,
                                   const int64_t *keep, rlm_error *err);

/* Rows: append n empty rows; remove one; copy one out as a new 1-row cache. */
RLM_API rlm_status rlm_kv_add_rows(rlm_kv *kv, int n, rlm_error *err);
RLM_API rlm_status rlm_kv_remove_row(rlm_kv *kv, int row, rlm_error *err);
RLM_API rlm_status rlm_kv_extract_row(const rlm_kv *kv, int row, rlm_kv **out,
                                      rlm_error *err);

/* Memory: bytes of K+V storage per cached token per row (quantized: codes
 * plus scales and biases; bookkeeping excluded), and all bytes held. A
 * ring's total is bounded by its window + max_chunk - 1 slots. */
RLM_API double rlm_kv_bytes_per_token(const rlm_kv *kv);
RLM_API size_t rlm_kv_nbytes(const rlm_kv *kv);
RLM_API size_t rlm_kv_nbytes_total(rlm_kv *const *kvs, int n);

/* State: a self-describing, checksummed byte image of the whole cache.
 * save allocates *buf (free it with rlm_free); restore requires a cache
 * created with the same configuration (RLM_ERR_FORMAT otherwise). */
RLM_API rlm_status rlm_kv_state_save(const rlm_kv *kv, void **buf, size_t *len,
                                     rlm_error *err);
RLM_API rlm_status rlm_kv_state_restore(rlm_kv *kv, const void *buf, size_t len,
                                        rlm_error *err);
RLM_API void rlm_free(void *p);

/* Allocations that have failed on the calling thread, the library's and
 * jansson's: libringlm gives jansson its malloc-backed allocator
 * (json_set_alloc_funcs) when it loads, so that they are counted and
 * tests can make them fail. A host that builds JSON with jansson compares
 * this count before and after, since an ignored json_object_set_new
 * failure silently loses a member. */
RLM_API uint64_t rlm_alloc_failures(void);

/* jansson's json_loadb(buf, len, flags, error) for hosts that use jansson
 * (error: a json_error_t * or NULL; returns the json_t *), safe when an
 * allocation fails: jansson 2.14's lexer then drops a byte of a string or
 * writes past its buffer (akheron/jansson#362), so the library's injected
 * failures are only counted during the parse, and a parse during which
 * any allocation failed returns NULL with *nomem set and "out of memory"
 * in error. A real malloc failure inside jansson remains jansson's bug. */
RLM_API void *rlm_json_loadb(const char *buf, size_t len, size_t flags, void *error, bool *nomem);

/* Compiled decode: prepare does the host bookkeeping of the next decode
 * step (growth of the buffers, rotation) and says where each row's token
 * goes; a fixed device graph then writes that slot and attends, and commit
 * advances the positions. CONCAT: the row has not wrapped, its live slots
 * are [0, active_len) in position order and the token goes to active_len;
 * RING: the row has wrapped, the whole ring is attended (unordered, masked
 * by position). rlm_kv_append_decode is exactly prepare + write + attend +
 * commit. */
typedef enum rlm_kv_fetch { RLM_KV_FETCH_CONCAT = 0, RLM_KV_FETCH_RING = 1 } rlm_kv_fetch;

typedef struct rlm_kv_decode_plan {
  rlm_kv_fetch fetch;
  int64_t write_pos;   /* slot the token is written to            */
  int64_t active_len;  /* slots to attend after the write          */
  int64_t position;    /* the token's position (RoPE offset)        */
} rlm_kv_decode_plan;

/* plans: [B]. Idempotent until commit. */
RLM_API rlm_status rlm_kv_prepare_decode(rlm_kv *kv, rlm_kv_decode_plan *plans,
                                         rlm_error *err);
/* The commit that follows a prepare: writes each row's token k [B][1][H][Dk],
 * v [B][1][H][Dv] at its plan's write_pos and advances the positions. */
RLM_API rlm_status rlm_kv_commit_decode(rlm_kv *kv, const rlm_kv_decode_plan *plans,
                                        const float *k, const float *v,
                                        rlm_error *err);
/* The live window of a row in position order (mlx-lm's temporal order):
 * the slots of the newest positions a ring of `window` slots holds -- the
 * sinks, then the last window - keep positions -- or of every position for
 * plain kinds. Writes up to max slot indices; *n is the count
 * (RLM_ERR_INVALID if it exceeds max). */
RLM_API rlm_status rlm_kv_temporal_view(const rlm_kv *kv, int row, int64_t *slots,
                                        int64_t max, int64_t *n, rlm_error *err);
/* Slots allocated per row now (growth at least doubles, in whole steps of
 * 256, up to capacity). */
RLM_API int64_t rlm_kv_slots_allocated(const rlm_kv *kv);
RLM_API int64_t rlm_kv_capacity(const rlm_kv *kv);

/* ------------------------------------------------------------------------
 * Tokenizer: a Hugging Face tokenizer.json or a GGUF file's vocabulary
 * (byte-level BPE as Llama 3 and Qwen use it; SentencePiece-style BPE with
 * byte fallback and U+2581 as Gemma uses it), its added/special tokens,
 * and tokenizer_config.json.
 * Immutable after load: one tokenizer may be used from many threads.
 * ---------------------------------------------------------------------- */
typedef struct rlm_tokenizer rlm_tokenizer;

/* path: a folder holding tokenizer.json (and optionally
 * tokenizer_config.json, whose bos_token/eos_token then set bos/eos), or
 * the tokenizer.json file itself (bos/eos from its post-processor), or a
 * GGUF file, whose tokenizer.ggml.* metadata (as llama.cpp writes it:
 * model "gpt2" or "llama") is turned into the same pipeline, with the ids
 * Hugging Face tokenizers gives for that model; bos/eos are its
 * bos_token_id/eos_token_id, and add_special adds what its add_bos_token/
 * add_eos_token say (absent: llama.cpp's defaults).
 * RLM_ERR_FORMAT for malformed JSON or a missing model (or malformed GGUF
 * metadata), RLM_ERR_UNSUPPORTED for a component ringlm does not implement
 * (or a GGUF tokenizer model or pre-tokenizer it does not know), and
 * RLM_ERR_NOT_FOUND for a GGUF file without a tokenizer
 * (tokenizer.ggml.model absent or "none"); the message names the file and
 * the component or key. */
RLM_API rlm_status rlm_tokenizer_load(rlm_tokenizer **out, const char *path,
                                      rlm_error *err);
RLM_API void rlm_tokenizer_free(rlm_tokenizer *t);
/* Largest id + 1, added tokens included. */
RLM_API int32_t rlm_tokenizer_vocab_size(const rlm_tokenizer *t);
/* -1 when the tokenizer defines none. */
RLM_API int32_t rlm_tokenizer_bos(const rlm_tokenizer *t);
RLM_API int32_t rlm_tokenizer_eos(const rlm_tokenizer *t);

/* Encodes UTF-8 text as the tokenizer does by default: with add_special,
 * the special tokens its post-processor adds (e.g. BOS). Writes at most
 * max_ids ids; *n_ids is the number the text needs (RLM_ERR_INVALID when
 * it exceeds max_ids, nothing else changed). Text that is not valid UTF-8
 * is RLM_ERR_INVALID. */
RLM_API rlm_status rlm_tokenize(const rlm_tokenizer *t, const char *text, size_t len,
                                bool add_special, int32_t *ids, size_t max_ids,
                                size_t *n_ids, rlm_error *err);

/* Decodes ids to UTF-8 text (skip_special drops special tokens); bytes
 * that do not form UTF-8 become U+FFFD as in Hugging Face tokenizers.
 * cap is the size of buf, NUL included; *len is the length the text needs
 * (without the NUL): RLM_ERR_INVALID when len + 1 > cap, buf untouched, so
 * cap 0 asks for the size. An id with no token is RLM_ERR_INVALID. */
RLM_API rlm_status rlm_detokenize(const rlm_tokenizer *t, const int32_t *ids, size_t n,
                                  bool skip_special, char *buf, size_t cap,
                                  size_t *len, rlm_error *err);

/* Streaming decode: feed one id at a time, receive only complete UTF-8
 * characters (a character split across tokens is held back until its last
 * byte arrives), so generated text can be printed as it comes. */
typedef struct rlm_detok_stream rlm_detok_stream;
RLM_API rlm_status rlm_detok_stream_create(rlm_detok_stream **out, const rlm_tokenizer *t,
                                           bool skip_special, rlm_error *err);
RLM_API void rlm_detok_stream_free(rlm_detok_stream *s);
/* Writes the text that id completes to buf (NUL-terminated, at most cap
 * bytes including the NUL); *len is its length, possibly 0. When it does
 * not fit: RLM_ERR_INVALID with *len set, and the stream is unchanged (push
 * the same id again). Does not allocate. */
RLM_API rlm_status rlm_detok_stream_push(rlm_detok_stream *s, int32_t id, char *buf,
                                         size_t cap, size_t *len, rlm_error *err);

/* ------------------------------------------------------------------------
 * Chat templates: the Jinja template of tokenizer_config.json, rendered as
 * Hugging Face transformers' apply_chat_template renders it (jinja2's
 * sandbox with trim_blocks, lstrip_blocks, break/continue, raise_exception,
 * and tojson as json.dumps). The Jinja subset covers what real chat
 * templates use; the rest is RLM_ERR_UNSUPPORTED, when the template is
 * compiled for a tag or filter, when it renders for the rest (say, string
 * formatting with %). Immutable after compilation: one template may render
 * on many threads.
 * ---------------------------------------------------------------------- */
typedef struct rlm_chat_template rlm_chat_template;

/* Compiles a template from its source text (UTF-8). A syntax error is
 * RLM_ERR_FORMAT, a jinja2 feature ringlm lacks (an include tag, the
 * wordwrap filter, ...) RLM_ERR_UNSUPPORTED; the message names the line and
 * the problem. */
RLM_API rlm_status rlm_chat_template_parse(rlm_chat_template **out, const char *src, size_t len,
                                           rlm_error *err);
/* dir: a model or tokenizer folder. The template is chat_template.jinja
 * when present, else tokenizer_config.json's "chat_template" (a string,
 * or a list of {"name", "template"} of which "default" is taken); the
 * config's bos_token, eos_token, pad_token and unk_token (a string or
 * {"content": ...}) are passed to every render. dir may instead be a GGUF
 * file: the template is its tokenizer.chat_template, and bos_token and
 * eos_token are the text of its bos/eos token ids (as llama.cpp passes
 * them). RLM_ERR_NOT_FOUND, naming the file (and key), when there is no
 * template. */
RLM_API rlm_status rlm_chat_template_load(rlm_chat_template **out, const char *dir,
                                          rlm_error *err);
RLM_API void rlm_chat_template_free(rlm_chat_template *t);
/* Renders a conversation. messages_json: a JSON array of messages, each
 * an object such as {"role": "user", "content": "..."} (content may be a
 * list of parts; other keys such as tool_calls pass through). extra_json:
 * NULL or a JSON object of further variables (tools, documents,
 * enable_thinking, ...); tools and documents are None unless given.
 * *out is the NUL-terminated text (free with rlm_free), *out_len (may be
 * NULL) its length, which counts any NUL the messages put in the text.
 * Bad JSON is RLM_ERR_INVALID. The template's raise_exception(msg) is
 * RLM_ERR_INVALID with msg as the message; any other error the template
 * runs into (calling an undefined variable, a type error, a limit on
 * output size, loop iterations, memory or recursion) is RLM_ERR_INVALID
 * with jinja2's message after "chat template line N: ". */
RLM_API rlm_status rlm_chat_template_render(const rlm_chat_template *t, const char *messages_json,
                                            const char *extra_json, bool add_generation_prompt,
                                            char **out, size_t *out_len, rlm_error *err);

/* ------------------------------------------------------------------------
 * Models and sessions. A model is the immutable weights (mmap'd) and
 * configuration of a Hugging Face folder; a session holds n_rows
 * independent sequences (rows) over it, each with the KV caches of every
 * layer and a position, plus the scratch and thread pool the rows share.
 * One forward pass (rlm_session_decode) takes a ragged batch: any rows,
 * each feeding its next tokens, prefill chunks beside decode steps, and
 * reads every weight once for all of them. A model may be shared by
 * sessions on different threads; a session has one owner (one thread at a
 * time); sessions share one process-wide set of worker threads. With
 * device RLM_DEVICE_CUDA the model's first session there uploads its
 * weights (under a lock, so sessions may be created on several threads)
 * and every later one shares them; each session has its own stream,
 * caches and graphs. Architectures: llama, qwen3, mistral, gemma3_text, gemma4_text
 * (dense; its MoE variant is refused as unsupported).
 * ---------------------------------------------------------------------- */
typedef struct rlm_model rlm_model;
typedef struct rlm_session rlm_session;

RLM_API rlm_status rlm_model_load(rlm_model **out, const char *dir, rlm_error *err);
RLM_API void rlm_model_free(rlm_model *m);
RLM_API int32_t rlm_model_vocab_size(const rlm_model *m);
/* config.json's model_type, e.g. "llama". */
RLM_API const char *rlm_model_arch(const rlm_model *m);
/* What KV snapshots of this model carry: "model_type:H1:H2", FNV-1a 64 of
 * config.json's bytes and of every weight's name, dtype and shape. */
RLM_API const char *rlm_model_signature(const rlm_model *m);
/* An end-of-sequence id of generation_config.json (else config.json). */
RLM_API bool rlm_model_is_eos(const rlm_model *m, int32_t id);

typedef struct rlm_model_info {
  const char *arch;           /* model_type                               */
  int n_layers, hidden, n_heads, vocab;
  int sliding_window;         /* 0: none                                  */
  int n_kv_shared;            /* layers attending an earlier layer's KV   */
  int64_t n_params;           /* matrices (quantized ones unpacked) + 1-D */
  const char *weight_dtype;   /* "f32", "bf16", "f16" or "mlx-affine"     */
  int weight_bits, weight_group; /* MLX quantization of layer 0, or 0     */
  const char *gguf_types;     /* a GGUF file's tensor types and counts,
                                 "Q4_K x97, Q6_K x14, F32 x45" (converted
                                 at load as weight_* say); else NULL     */
  int32_t bos;                /* -1: none                                 */
  int32_t eos[8];
  int n_eos;
  int64_t max_positions;      /* max_position_embeddings; 0: not given    */
} rlm_model_info;

typedef struct rlm_layer_info {
  bool sliding;
  int window;                 /* sliding layers; 0 for full attention     */
  int head_dim, n_kv_heads;
  int kv_donor;               /* -1, or the layer whose cache it attends  */
} rlm_layer_info;

RLM_API void rlm_model_get_info(const rlm_model *m, rlm_model_info *out);
RLM_API void rlm_model_layer_info(const rlm_model *m, int layer, rlm_layer_info *out);

/* Where a session's passes run. RLM_DEVICE_CUDA needs a build with
 * -DRINGLM_CUDA=ON and an NVIDIA GPU (else rlm_session_create returns
 * RLM_ERR_UNSUPPORTED saying which is missing). */
typedef enum rlm_device { RLM_DEVICE_CPU = 0, RLM_DEVICE_CUDA = 1 } rlm_device;

typedef struct rlm_session_params {
  int n_threads;      /* <= 0: the physical cores (rlm_cpu_info_get)         */
  int prefill_chunk;  /* tokens per prefill step (default 512)               */
  int k_bits, v_bits; /* 0: dense KV in the model's dtype; else 2..8 each    */
  int kv_group_size;  /* default 64                                          */
  int64_t max_kv;     /* > 0: full-attention layers become rings this wide   */
  int act_bits;       /* 0: exact f32 activations (default); 8: decode
                         products over 4-bit weights quantize activations
                         to int8 per block of 32 and use integer dot
                         products (llama.cpp's Q8_0 way: faster, about
                         0.4% activation error); on the CPU so do the
                         attention scores over a 4-bit K cache (queries
                         to int8, V exact)                                */
  int kv_sinks;       /* rings made by max_kv keep their first kv_sinks
                         positions ("attention sinks", as mlx-lm's
                         --max-kv-size keeps 4); < max_kv; sliding layers
                         stay exact (no sinks)                             */
  int n_rows;         /* independent sequences (default 1, at most 4096)   */
  int64_t n_ctx;      /* > 0: a row holds at most n_ctx positions (a feed
                         past it is RLM_KV_FULL, nothing changed), and its
                         growing caches reserve n_ctx slots at first use,
                         as llama.cpp sizes its cache; 0 (default): no
                         limit, the caches grow geometrically (CUDA: the
                         caches are fixed; 0 there means 4096, or the
                         model's max_position_embeddings when smaller)    */
  rlm_device device;  /* RLM_DEVICE_CPU (default) or RLM_DEVICE_CUDA       */
  rlm_dtype kv_dtype; /* element type of dense KV caches (and of quantized
                         ones' scales): RLM_DTYPE_COUNT (default) the
                         model's dtype (config.json's; bf16 for GGUF
                         files), or RLM_DTYPE_F32 / F16 / BF16, as
                         llama.cpp's --cache-type-k/v f32/f16/bf16        */
  bool no_graph;      /* CUDA: run each decode step's kernels one by one
                         instead of replaying the step's captured graph   */
} rlm_session_params;

RLM_API rlm_session_params rlm_session_params_default(void);
RLM_API rlm_status rlm_session_create(rlm_session **out, rlm_model *m,
                                      const rlm_session_params *p, rlm_error *err);
RLM_API void rlm_session_free(rlm_session *s);
/* Feeds n ids at the session's position (prefill in chunks, one decode
 * step when n == 1). logits: [n][vocab] when all_logits, else the last
 * position's [vocab]; NULL for none. All or nothing on bad input. */
RLM_API rlm_status rlm_session_eval(rlm_session *s, const int32_t *ids, int n,
                                    float *logits, bool all_logits, rlm_error *err);
/* Row 0's position. */
RLM_API int64_t rlm_session_position(const rlm_session *s);

/* A ragged batch for one call of rlm_session_decode: token i is ids[i]
 * fed to row rows[i] at that row's next position. A row's tokens are
 * consecutive in the batch and in their order (a row appears in at most
 * one run); rows not in the batch are untouched. */
typedef struct rlm_batch {
  int n_tokens;            /* >= 1                                          */
  const int32_t *ids;      /* [n_tokens]                                    */
  const int32_t *rows;     /* [n_tokens]; NULL: every token to row 0        */
  const bool *logits;      /* [n_tokens] whose logits are wanted; NULL: the
                              last token of each row's run                  */
} rlm_batch;

/* Runs the batch through the model in passes of at most prefill_chunk
 * tokens, each pass sharing every weight product among all its tokens.
 * logits: [wanted][vocab] in batch order (NULL: none). All or nothing:
 * every check and every cache's growth happens before any row changes,
 * so an error (a bad id or row, out of memory, RLM_KV_FULL past n_ctx)
 * leaves the session as it was. Allocates nothing once the caches have
 * room. */
RLM_API rlm_status rlm_session_decode(rlm_session *s, const rlm_batch *b, float *logits,
                                      rlm_error *err);
/* Host memory for the logits s writes (rlm_session_decode, rlm_session_eval):
 * a GPU session copies into it at the bus's full speed (page-locked; 64
 * rows of a 128k vocabulary take a third of the time they take into
 * ordinary memory), a CPU session's is ordinary heap. bytes > 0; NULL: out
 * of memory. Free with rlm_host_free (which may outlive s; NULL is a
 * no-op). Not to be allocated per step: page-locking is slow. */
RLM_API void *rlm_session_host_alloc(const rlm_session *s, size_t bytes);
RLM_API void rlm_host_free(void *p);
RLM_API int rlm_session_rows(const rlm_session *s);
/* Next position of a row (the tokens it holds); -1 for a bad row. */
RLM_API int64_t rlm_session_row_position(const rlm_session *s, int row);
/* Empties a row for a new sequence; its storage is kept for reuse. */
RLM_API rlm_status rlm_session_row_clear(rlm_session *s, int row, rlm_error *err);
/* Empties a row and frees its caches' storage (they grow again when
 * fed): what a server does to a row it will not reuse soon. */
RLM_API rlm_status rlm_session_row_release(rlm_session *s, int row, rlm_error *err);
/* KV bytes a row's caches hold (its storage, used or not). */
RLM_API size_t rlm_session_row_kv_bytes(const rlm_session *s, int row);
/* Forgets the last n tokens of a row in every layer, as if never fed,
 * also after its rings wrapped (no recomputation): what speculative
 * decoding needs after a verification. A ring can forget at most
 * prefill_chunk tokens fed since (its slack); a rollback it cannot cover,
 * or n beyond the row's position, is RLM_ERR_INVALID and changes nothing. */
RLM_API rlm_status rlm_session_rollback(rlm_session *s, int row, int64_t n, rlm_error *err);
/* ------------------------------------------------------------------------
 * KV snapshots (docs/kv-snapshots.md): one row's whole KV state -- every
 * layer's cache, rings with their sinks and slack, quantized triples as
 * stored, positions -- and the token ids it holds, as a safetensors image
 * with a CRC-32C, readable by mlx-lm's load_prompt_cache where mlx-lm has
 * the cache kinds. A sliding layer stores its window (plus the slack that
 * lets a restored row still roll back), not the whole prefix.
 *
 * Saving: tokens may be NULL with n_tokens 0 (none recorded), else
 * n_tokens must equal the row's position. *buf is rlm_free'd by the
 * caller. The file variant writes crash-safely: a temporary file in the
 * same folder, fsync, rename, fsync of the folder; a crash or a failing
 * write leaves the old file whole.
 * Opening checks the framing, format, version and checksum
 * (RLM_ERR_FORMAT naming the file and the problem). Loading into a row
 * checks the model signature, every layer's kind, bits, window, keep,
 * dtype and shapes against the session first, then makes room, and
 * changes the row only when nothing can fail any more: a bad or foreign
 * snapshot leaves the row as it was. Any row of any session of the same
 * model and KV settings will do (prefill_chunk may differ).
 */
typedef struct rlm_snapshot rlm_snapshot;

RLM_API rlm_status rlm_session_row_save(const rlm_session *s, int row, const int32_t *tokens,
                                        int64_t n_tokens, void **buf, size_t *len, rlm_error *err);
RLM_API rlm_status rlm_session_row_save_file(const rlm_session *s, int row, const int32_t *tokens,
                                             int64_t n_tokens, const char *path, rlm_error *err);
RLM_API rlm_status rlm_snapshot_open(rlm_snapshot **out, const char *path, rlm_error *err);
/* buf must outlive the handle. */
RLM_API rlm_status rlm_snapshot_open_memory(rlm_snapshot **out, const void *buf, size_t len,
                                            rlm_error *err);
RLM_API void rlm_snapshot_free(rlm_snapshot *sn);
/* Is the snapshot one this session's rows can load? (nothing changes) */
RLM_API rlm_status rlm_snapshot_check(const rlm_snapshot *sn, const rlm_session *s, rlm_error *err);
RLM_API rlm_status rlm_session_row_load(rlm_session *s, int row, const rlm_snapshot *sn,
                                        rlm_error *err);
/* rlm_snapshot_open_memory + rlm_session_row_load. */
RLM_API rlm_status rlm_session_row_restore(rlm_session *s, int row, const void *buf, size_t len,
                                           rlm_error *err);
/* Tokens the row held (its position), and the ids when recorded. */
RLM_API int64_t rlm_snapshot_position(const rlm_snapshot *sn);
RLM_API const int32_t *rlm_snapshot_tokens(const rlm_snapshot *sn, int64_t *n);
/* "model_type:config hash:weights hash" (rlm_model_signature's). */
RLM_API const char *rlm_snapshot_model(const rlm_snapshot *sn);
RLM_API size_t rlm_snapshot_bytes(const rlm_snapshot *sn);
RLM_API int rlm_snapshot_layers(const rlm_snapshot *sn);
typedef struct rlm_snapshot_layer_info {
  int cache;             /* tensor prefix; -1: KV-shared, no cache          */
  int shares;            /* the donor layer of a KV-shared one, else -1     */
  const char *kind;      /* rlm_kv_signature                                */
  rlm_dtype dtype;
  int window, keep;      /* rings; 0 otherwise                              */
  int64_t offset;        /* tokens seen                                     */
  int64_t first;         /* stored: [0, min(keep, offset)) and [first, offset) */
  int64_t stored;
  size_t bytes;          /* of its tensors                                  */
} rlm_snapshot_layer_info;
RLM_API rlm_status rlm_snapshot_layer(const rlm_snapshot *sn, int i, rlm_snapshot_layer_info *out,
                                      rlm_error *err);
/* KV bytes held by all layers' caches. */
RLM_API size_t rlm_session_kv_bytes(const rlm_session *s);
/* The KV footprint a session with params p would have: bytes per token of
 * the caches that grow with the context, and the fixed bytes of the rings
 * (sliding layers, or every layer under max_kv) once full: window +
 * prefill_chunk - 1 slots each, the slack that lets a chunk attend its
 * whole window. */
RLM_API rlm_status rlm_model_kv_footprint(const rlm_model *m, const rlm_session_params *p,
                                          double *grow_per_token, double *ring_bytes,
                                          rlm_error *err);

/* ------------------------------------------------------------------------
 * Sampling. Applied in this order (llama.cpp's and transformers' order):
 * repetition penalty over the last repeat_last_n accepted tokens (a
 * positive logit is divided by the penalty, a negative one multiplied),
 * then OpenAI's frequency and presence penalties over the same window
 * (logit -= count x frequency_penalty + presence_penalty, for each id
 * that occurs count > 0 times in it, as llama.cpp's penalties sampler),
 * then temp == 0: argmax (greedy); else logits / temp, top-k, softmax,
 * top-p (the smallest set whose probability reaches top_p), min-p (drop
 * tokens below min_p x the top probability), and a draw from what is
 * left with the sampler's own seeded generator. No allocation per call.
 * ---------------------------------------------------------------------- */
typedef struct rlm_sampler rlm_sampler;

typedef struct rlm_sampler_params {
  float temp;            /* 0: greedy                                  */
  int top_k;             /* 0: off                                     */
  float top_p;           /* 1: off                                     */
  float min_p;           /* 0: off                                     */
  float repeat_penalty;  /* 1: off                                     */
  int repeat_last_n;     /* tokens of history the penalties look at    */
  uint64_t seed;
  float presence_penalty;  /* [-2, 2]; 0: off                          */
  float frequency_penalty; /* [-2, 2]; 0: off                          */
} rlm_sampler_params;

RLM_API rlm_sampler_params rlm_sampler_params_default(void);
RLM_API rlm_status rlm_sampler_create(rlm_sampler **out, const rlm_sampler_params *p,
                                      int32_t vocab, rlm_error *err);
RLM_API void rlm_sampler_free(rlm_sampler *s);
/* Picks the next token from logits [vocab] (modified in place). */
RLM_API int32_t rlm_sampler_sample(rlm_sampler *s, float *logits);
/* Records a token in the penalty history (prompt and generated ones). */
RLM_API void rlm_sampler_accept(rlm_sampler *s, int32_t id);

/* Stop strings over streamed text: push each decoded piece; what comes
 * back in *emit (valid until the next call) is safe to print: text that
 * could still begin a stop string is held back, and when one completes,
 * *stopped is set and *emit ends just before it. flush returns the
 * held-back tail once generation ends for another reason. */
typedef struct rlm_stop rlm_stop;
RLM_API rlm_status rlm_stop_create(rlm_stop **out, const char *const *stops, int n,
                                   rlm_error *err);
RLM_API void rlm_stop_free(rlm_stop *s);
RLM_API rlm_status rlm_stop_push(rlm_stop *s, const char *piece, size_t len,
                                 const char **emit, size_t *emit_len, bool *stopped,
                                 rlm_error *err);
RLM_API void rlm_stop_flush(rlm_stop *s, const char **emit, size_t *emit_len);

/* ------------------------------------------------------------------------
 * Generation: one engine that advances many requests at once (continuous
 * batching), each with its own sampler, stop ids and strings, token budget
 * and streamed text, optionally with speculative decoding: a draft model's
 * session (same vocabulary) or n-gram lookup in the request's own history
 * proposes up to draft_max tokens per row, one batched pass of the target
 * verifies every row's proposal, and each row keeps its own number of them
 * (greedy: the longest agreeing prefix plus the target's own next token;
 * temp > 0: the speculative sampling rule, so the output follows the
 * target's distribution exactly); the rest are rolled back in the KV,
 * rings included, without recomputation.
 *
 * Thread contract: an engine, its target session and its draft session
 * are driven by ONE thread at a time: rlm_gen_add, rlm_gen_step and
 * rlm_gen_cancel must not overlap, and nobody else may use the sessions
 * while the engine holds them (between rlm_gen_create and rlm_gen_free).
 * Different engines over different sessions may run on different threads;
 * they share the process's worker threads (one job at a time, never more
 * busy threads than cores). The engine creates no threads.
 * ---------------------------------------------------------------------- */
typedef struct rlm_gen rlm_gen;

typedef struct rlm_gen_params {
  int draft_max;     /* most tokens proposed per row and step, 1..32 (8)  */
  int lookup_n;      /* > 0 and no draft session: n-gram prompt lookup
                        matching the last lookup_n tokens                 */
  bool adaptive;     /* per-row proposal length: +2 (up to draft_max)
                        after a step that kept every proposal, else at
                        most kept + 1 and one less, down to 0, where the
                        row proposes one token every 8th decode step to
                        find where proposals hold again; false: always
                        draft_max                                         */
} rlm_gen_params;

RLM_API rlm_gen_params rlm_gen_params_default(void);
/* Rows are the target session's (the draft session needs at least as
 * many). tok: for streamed text and stop strings (NULL: ids only). A draft
 * with another vocabulary size is RLM_ERR_INVALID naming both sizes. */
RLM_API rlm_status rlm_gen_create(rlm_gen **out, rlm_session *target, rlm_session *draft,
                                  const rlm_tokenizer *tok, const rlm_gen_params *p,
                                  rlm_error *err);
RLM_API void rlm_gen_free(rlm_gen *g);

/* The most alternatives per token a request may ask for (OpenAI's
 * top_logprobs). */
#define RLM_GEN_LOGPROBS_MAX 20

typedef struct rlm_gen_request {
  const int32_t *prompt;      /* n_prompt >= 1 ids                        */
  int64_t n_prompt;
  int row;                    /* -1: any free row; else that (free) row   */
  int64_t n_cached;           /* the row's KV already holds prompt[0, n):
                                 kept, not fed again (0: the row is
                                 cleared)                                 */
  rlm_sampler_params sampler;
  int64_t max_tokens;         /* < 0: until EOS or the context            */
  int64_t max_context;        /* > 0: prompt + output stop at this many
                                 positions (else the session's n_ctx, if
                                 any)                                     */
  bool ignore_eos;            /* else an EOS id ends the request (and is
                                 not part of its text)                    */
  const char *const *stops;   /* stop strings (copied), cut from the text */
  int n_stops;
  bool speculate;             /* use the engine's proposer for this row   */
  int logprobs;               /* -1 (default): none; 0..RLM_GEN_LOGPROBS_MAX:
                                 each generated id's log-probability and
                                 that many most likely ids (rlm_gen_event) */
} rlm_gen_request;

RLM_API rlm_gen_request rlm_gen_request_default(void);
/* Starts a request; *row is where it runs. RLM_KV_FULL when no row is
 * free; RLM_ERR_INVALID for a bad request (ids, sampler, row, a prompt
 * that leaves no room in the context). */
RLM_API rlm_status rlm_gen_add(rlm_gen *g, const rlm_gen_request *r, int *row, rlm_error *err);

typedef enum rlm_finish {
  RLM_FINISH_NONE = 0,        /* still running                            */
  RLM_FINISH_STOP = 1,        /* an EOS id or a stop string               */
  RLM_FINISH_LENGTH = 2,      /* max_tokens or the context                */
} rlm_finish;

/* What one step did to one row; valid until the next call on the engine. */
typedef struct rlm_gen_event {
  int row;
  const int32_t *ids;         /* the tokens this step generated (an EOS
                                 that ended the request is not among them) */
  int n_ids;
  const char *text;           /* their text, safe to show: stop strings
                                 held back until they cannot match (NULL
                                 without a tokenizer)                     */
  size_t text_len;
  rlm_finish finish;          /* != NONE: the request is over and its row
                                 free; the row's KV holds the prompt and
                                 every output id but the last one         */
  /* With the request's logprobs >= 0, log-probabilities under the target's
   * raw distribution: log_softmax of its logits at the position that
   * produced the id, before any sampler transformation (no penalty,
   * temperature or truncation: vLLM's default), whether the id came from
   * plain decoding or a verified proposal. NULL (n_top 0) with -1. */
  const float *logprob;       /* [n_ids]: log p(ids[i])                   */
  const int32_t *top_ids;     /* [n_ids][n_top], most likely first (ties:
                                 the lower id first)                      */
  const float *top_logprobs;  /* [n_ids][n_top]                           */
  int n_top;                  /* the request's logprobs (at most the
                                 vocabulary's size)                       */
} rlm_gen_event;

/* One step: every running request advances (prefill chunks and decode or
 * verification steps share one pass of the target). *events: one per row
 * that generated tokens or finished. Allocates nothing. An error leaves
 * the requests where they were. */
RLM_API rlm_status rlm_gen_step(rlm_gen *g, const rlm_gen_event **events, int *n_events,
                                rlm_error *err);
/* Ends a request now (no event); its row is free. */
RLM_API void rlm_gen_cancel(rlm_gen *g, int row);
/* Requests running. */
RLM_API int rlm_gen_active(const rlm_gen *g);

typedef struct rlm_gen_stats {
  int64_t n_prompt;           /* prompt ids fed (not cached)              */
  int64_t n_gen;              /* ids generated                            */
  int64_t drafted, accepted;  /* proposals verified, and kept             */
  int64_t steps;              /* target passes                            */
} rlm_gen_stats;

/* Totals since rlm_gen_create (row < 0), or of the request on a row. */
RLM_API void rlm_gen_get_stats(const rlm_gen *g, int row, rlm_gen_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* RINGLM_H */
