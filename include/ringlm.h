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
 * Model quantization (`ringlm quantize`): every 2-D `*.weight` tensor that
 * is not a norm (and not an embedding unless asked) becomes the MLX triple
 * name.weight (u32), name.scales, name.biases; everything else is copied.
 * `in` is a .safetensors file or a Hugging Face model folder; for a folder,
 * `out` is a folder that receives model.safetensors, config.json with
 * "quantization": {"group_size", "bits"}, and copies of the other files.
 * ---------------------------------------------------------------------- */
typedef struct rlm_quantize_params {
  int bits;                  /* 2, 3, 4, 5, 6, 8 (default 4)          */
  int group_size;            /* 32, 64, 128 (default 64)              */
  bool quantize_embeddings;  /* also embed_tokens etc. (default false) */
  int n_threads;             /* <= 0: all cores                        */
} rlm_quantize_params;

RLM_API rlm_quantize_params rlm_quantize_params_default(void);

typedef struct rlm_quantize_stats {
  int64_t n_tensors;          /* tensors written                 */
  int64_t n_quantized;        /* of which quantized              */
  int64_t bytes_in;           /* tensor bytes read               */
  int64_t bytes_out;          /* tensor bytes written            */
} rlm_quantize_stats;

RLM_API rlm_status rlm_quantize_model(const char *in, const char *out,
                                      const rlm_quantize_params *params,
                                      rlm_quantize_stats *stats,
                                      rlm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* RINGLM_H */
