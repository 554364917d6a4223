/* gguf.h -- reading GGUF files (versions 2 and 3), the format llama.cpp
 * writes; written from ggml's docs/gguf.md.
 *
 * File layout (little-endian; every string is a u64 byte length and that
 * many bytes of UTF-8, no terminator):
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x       { string key, u32 value type, value }
 *                value: a scalar of its type, a string, or an array:
 *                { u32 element type, u64 count, count values }
 *   n_tensors x  { string name, u32 n_dims, u64 dims[n_dims] (dims[0]
 *                  varies fastest), u32 ggml type, u64 offset }
 *   zero padding to a multiple of ALIGNMENT (general.alignment, else 32)
 *   the data section: each tensor at its offset from the section's start
 *
 * Rules enforced on open (RLM_ERR_FORMAT unless said otherwise; every
 * message names the file and, where there is one, the key or tensor --
 * "key #3" / "tensor #7" until its name is read):
 *  - the magic; version 2 or 3 (others, and big-endian files, which the
 *    version field gives away, are RLM_ERR_UNSUPPORTED);
 *  - counts that cannot fit in the file (a key takes at least 14 bytes, a
 *    tensor info 33) are refused before anything is allocated, and tables
 *    grow with what is actually read, never with what a count claims;
 *  - every length is checked against the bytes left before it is used;
 *  - keys and tensor names: 1..65535 bytes, UTF-8, no NUL, each unique
 *    (the spec's 64-byte limit on tensor names is ggml's, not ours);
 *  - string values are UTF-8; a bool is 0 or 1; value types are known;
 *    arrays nest at most GGUF_MAX_DEPTH deep;
 *  - general.alignment, when present, is a u32 power of two;
 *  - tensors: 1..4 dims, each > 0, an element count below 2^63, a known
 *    ggml type (an unknown or removed id names the tensor and the id),
 *    dims[0] a multiple of the type's block, an offset that is a multiple
 *    of the alignment, data inside the data section, no two overlapping
 *    (gaps are padding, allowed).
 *
 * Everything stays in the read-only mapping: tensor data and numeric
 * arrays are zero-copy pointers into it (tensor data aligned to
 * ALIGNMENT in a mapped file, up to the page size, to which the mapping
 * itself is aligned; arrays possibly unaligned: read with
 * memcpy or the rlm__gguf_arr_* helpers). Keys, tensor names and string
 * values are copied once, NUL-terminated, into the handle's arena so that
 * callers get C strings; strings keep their length, as a value may hold a
 * NUL. A handle is immutable once open: any number of threads may read it.
 *
 * The model loader reads it through rlm__gguf_tensor_find and the typed
 * getters below, which fail with RLM_ERR_NOT_FOUND (a missing key or
 * tensor) or RLM_ERR_FORMAT (a key of another type), naming the file and
 * the key. The public rlm_gguf_* calls (ringlm.h, `ringlm inspect`) are
 * in gguf_api.c.
 */
#ifndef RLM_GGUF_H
#define RLM_GGUF_H

#include "base/base.h"

#define GGUF_MAX_DIMS 4           /* ggml's limit, which the spec states */
#define GGUF_MAX_DEPTH 8          /* arrays of arrays, this deep at most */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY 65535        /* bytes of a key or tensor name       */

/* Value types of the metadata (persisted: the ids are the format's). */
typedef enum rlm_gguf_type {
  RLM_GGUF_TYPE_UINT8 = 0,
  RLM_GGUF_TYPE_INT8 = 1,
  RLM_GGUF_TYPE_UINT16 = 2,
  RLM_GGUF_TYPE_INT16 = 3,
  RLM_GGUF_TYPE_UINT32 = 4,
  RLM_GGUF_TYPE_INT32 = 5,
  RLM_GGUF_TYPE_FLOAT32 = 6,
  RLM_GGUF_TYPE_BOOL = 7,
  RLM_GGUF_TYPE_STRING = 8,
  RLM_GGUF_TYPE_ARRAY = 9,
  RLM_GGUF_TYPE_UINT64 = 10,
  RLM_GGUF_TYPE_INT64 = 11,
  RLM_GGUF_TYPE_FLOAT64 = 12,
  RLM_GGUF_TYPE_COUNT
} rlm_gguf_type;

/* Tensor types (ggml's ids). The gaps were removed from ggml and from
 * GGUF; a file that uses one is refused. Whether the model can compute
 * with a type is the loader's question, not the reader's. */
typedef enum rlm_ggml_type {
  RLM_GGML_TYPE_F32 = 0,
  RLM_GGML_TYPE_F16 = 1,
  RLM_GGML_TYPE_Q4_0 = 2,
  RLM_GGML_TYPE_Q4_1 = 3,
  /* 4 Q4_2, 5 Q4_3: removed */
  RLM_GGML_TYPE_Q5_0 = 6,
  RLM_GGML_TYPE_Q5_1 = 7,
  RLM_GGML_TYPE_Q8_0 = 8,
  RLM_GGML_TYPE_Q8_1 = 9,
  RLM_GGML_TYPE_Q2_K = 10,
  RLM_GGML_TYPE_Q3_K = 11,
  RLM_GGML_TYPE_Q4_K = 12,
  RLM_GGML_TYPE_Q5_K = 13,
  RLM_GGML_TYPE_Q6_K = 14,
  RLM_GGML_TYPE_Q8_K = 15,
  RLM_GGML_TYPE_IQ2_XXS = 16,
  RLM_GGML_TYPE_IQ2_XS = 17,
  RLM_GGML_TYPE_IQ3_XXS = 18,
  RLM_GGML_TYPE_IQ1_S = 19,
  RLM_GGML_TYPE_IQ4_NL = 20,
  RLM_GGML_TYPE_IQ3_S = 21,
  RLM_GGML_TYPE_IQ2_S = 22,
  RLM_GGML_TYPE_IQ4_XS = 23,
  RLM_GGML_TYPE_I8 = 24,
  RLM_GGML_TYPE_I16 = 25,
  RLM_GGML_TYPE_I32 = 26,
  RLM_GGML_TYPE_I64 = 27,
  RLM_GGML_TYPE_F64 = 28,
  RLM_GGML_TYPE_IQ1_M = 29,
  RLM_GGML_TYPE_BF16 = 30,
  /* 31..33 Q4_0_4_4, Q4_0_4_8, Q4_0_8_8: removed from GGUF */
  RLM_GGML_TYPE_TQ1_0 = 34,
  RLM_GGML_TYPE_TQ2_0 = 35,
  /* 36..38 IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8: removed from GGUF */
  RLM_GGML_TYPE_MXFP4 = 39,
  RLM_GGML_TYPE_COUNT
} rlm_ggml_type;

/* "Q4_K", or NULL for an id that is not a type (a removed one included). */
const char *rlm__ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; false for an unknown id. */
bool rlm__ggml_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);
/* "uint32", "string", "array", ...; "?" for an unknown id. */
const char *rlm__gguf_type_name(uint32_t type);

/* A string of the file: a NUL-terminated copy (the handle's arena). */
typedef struct rlm_gguf_str {
  const char *s;
  size_t n;      /* bytes, the terminator not counted */
} rlm_gguf_str;

/* An array value. Exactly one of data, strs, arrs is used, by `type`. */
typedef struct rlm_gguf_array {
  rlm_gguf_type type;                 /* of the elements                 */
  uint64_t n;                         /* elements                        */
  const uint8_t *data;                /* numbers and bools: n elements,
                                         little-endian, in the mapping,
                                         possibly unaligned             */
  const rlm_gguf_str *strs;           /* strings: [n], in the arena      */
  const struct rlm_gguf_array *arrs;  /* arrays: [n], in the arena       */
} rlm_gguf_array;

typedef struct rlm_gguf_kv {
  const char *key;          /* arena copy                                 */
  rlm_gguf_type type;
  union {
    uint64_t u;             /* UINT8..UINT64, widened                     */
    int64_t i;              /* INT8..INT64, widened                       */
    double f;               /* FLOAT32 (exactly), FLOAT64                 */
    bool b;
    rlm_gguf_str s;
    rlm_gguf_array a;
  } v;
} rlm_gguf_kv;

/* kv's type as text, written to buf: "uint32", "array[string]". */
const char *rlm__gguf_kv_type_str(const rlm_gguf_kv *kv, char *buf, size_t n);

typedef struct rlm_gguf_tensor {
  const char *name;                /* arena copy                          */
  rlm_ggml_type type;
  int n_dims;                      /* 1..GGUF_MAX_DIMS                    */
  int64_t dims[GGUF_MAX_DIMS];     /* dims[0] varies fastest; unused = 1  */
  int64_t n_elements;
  const void *data;                /* in the mapping                      */
  size_t nbytes;
  uint64_t offset;                 /* from the start of the file          */
} rlm_gguf_tensor;

/* Whether path is a regular file that starts with the GGUF magic (nothing
 * is checked past it; used to tell a GGUF file from a model folder). */
bool rlm__gguf_sniff(const char *path);

/* rlm_gguf (ringlm.h) is this reader's handle. */
rlm_status rlm__gguf_open(rlm_gguf **out, const char *path, rlm_error *err);
/* One GGUF image in memory (`len` bytes at `data`, which must outlive the
 * handle); `name` stands for the file in messages. */
rlm_status rlm__gguf_open_memory(rlm_gguf **out, const char *name, const void *data, size_t len,
                                 rlm_error *err);
void rlm__gguf_free(rlm_gguf *g);

const char *rlm__gguf_path(const rlm_gguf *g);
uint32_t rlm__gguf_version(const rlm_gguf *g);
uint32_t rlm__gguf_alignment(const rlm_gguf *g);

/* Keys and tensors in file order, i in [0, count); find: NULL if absent
 * (binary search over names). */
size_t rlm__gguf_kv_count(const rlm_gguf *g);
const rlm_gguf_kv *rlm__gguf_kv_at(const rlm_gguf *g, size_t i);
const rlm_gguf_kv *rlm__gguf_kv_find(const rlm_gguf *g, const char *key);
size_t rlm__gguf_tensor_count(const rlm_gguf *g);
const rlm_gguf_tensor *rlm__gguf_tensor_at(const rlm_gguf *g, size_t i);
const rlm_gguf_tensor *rlm__gguf_tensor_find(const rlm_gguf *g, const char *name);
/* find, or RLM_ERR_NOT_FOUND naming the file and the tensor. */
rlm_status rlm__gguf_tensor_get(const rlm_gguf *g, const char *name, const rlm_gguf_tensor **out,
                                rlm_error *err);

/* Drops the resident pages that only t's data covers (whole pages inside
 * it) from a mapped file, after a caller has copied what it needs (the
 * model's converted weights): its RSS then holds the copy alone. The data
 * stays readable (the pages come back from the file on access); nothing
 * for an image in memory. */
void rlm__gguf_drop_pages(const rlm_gguf *g, const rlm_gguf_tensor *t);

/* Typed getters: RLM_ERR_NOT_FOUND if the key is absent, RLM_ERR_FORMAT
 * if it holds another type ("<file>: key 'k' is int32, expected uint32");
 * *out is untouched on failure. */
rlm_status rlm__gguf_get_u32(const rlm_gguf *g, const char *key, uint32_t *out, rlm_error *err);
rlm_status rlm__gguf_get_i32(const rlm_gguf *g, const char *key, int32_t *out, rlm_error *err);
rlm_status rlm__gguf_get_u64(const rlm_gguf *g, const char *key, uint64_t *out, rlm_error *err);
rlm_status rlm__gguf_get_f32(const rlm_gguf *g, const char *key, float *out, rlm_error *err);
rlm_status rlm__gguf_get_bool(const rlm_gguf *g, const char *key, bool *out, rlm_error *err);
/* The NUL-terminated string; *len (may be NULL) its bytes. */
rlm_status rlm__gguf_get_str(const rlm_gguf *g, const char *key, const char **out, size_t *len,
                             rlm_error *err);
/* An array whose elements are of type `elem` (RLM_GGUF_TYPE_COUNT: any). */
rlm_status rlm__gguf_get_array(const rlm_gguf *g, const char *key, rlm_gguf_type elem,
                               const rlm_gguf_array **out, rlm_error *err);
/* Any integer type (counts are u32 in some writers, u64 in others), the
 * value in [0, max]; a value out of range is RLM_ERR_FORMAT. */
rlm_status rlm__gguf_get_uint(const rlm_gguf *g, const char *key, uint64_t max, uint64_t *out,
                              rlm_error *err);

/* Element i (< a->n) of an array of numbers or bools, decoded into
 * out->type and out->v as a scalar value of that type would be; false if
 * i is out of range or the elements are strings or arrays. */
bool rlm__gguf_arr_elem(const rlm_gguf_array *a, uint64_t i, rlm_gguf_kv *out);
/* Element i (< a->n) of a numeric array: any integer type or bool as
 * int64 (false for a uint64 above INT64_MAX, or for an array of another
 * type); any float type as double (false for other arrays). */
bool rlm__gguf_arr_int(const rlm_gguf_array *a, uint64_t i, int64_t *out);
bool rlm__gguf_arr_float(const rlm_gguf_array *a, uint64_t i, double *out);

#endif /* RLM_GGUF_H */
