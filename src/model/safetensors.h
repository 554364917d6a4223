/* safetensors.h -- reading and writing the safetensors format.
 *
 * File layout (little-endian):
 *   [0, 8)          u64 N: byte length of the JSON header
 *   [8, 8+N)        JSON object, UTF-8, may be padded with trailing spaces:
 *                   { "<name>": {"dtype": "F32", "shape": [2, 3],
 *                                "data_offsets": [begin, end]}, ...,
 *                     "__metadata__": {"<key>": "<string>", ...} }
 *   [8+N, size)     the data buffer; offsets are relative to its start
 * Rules enforced on read (RLM_ERR_FORMAT otherwise, message names the file
 * and the tensor): N fits in the file; the JSON parses and is an object;
 * every dtype is known; end - begin == product(shape) * dtype size;
 * offsets lie inside the buffer; tensors do not overlap and leave no hole
 * (the buffer is exactly covered, as the reference implementation demands);
 * names are unique; __metadata__ values are strings.
 *
 * A model folder holds either model.safetensors or shards listed in
 * model.safetensors.index.json ({"weight_map": {"<name>": "<shard file>"}});
 * rlm__st_open accepts a file, a folder, or an index file, and presents one
 * name-sorted table. Tensor data stay in the read-only mappings (zero-copy,
 * possibly unaligned: read with memcpy or unaligned loads).
 *
 * A folder is opened through its index if it has one, else through
 * model.safetensors; with neither it is RLM_ERR_NOT_FOUND. For an index,
 * shard paths are relative to the index's folder, each shard is mapped once,
 * and shards are numbered (file_index) in strcmp order of their names, so
 * shard 0 is model-00001-of-N. Every weight_map entry must be in the shard
 * it names, and a name in two shards is RLM_ERR_FORMAT; tensors a shard
 * holds that weight_map omits are kept (lenient). The index's own
 * "metadata" object is ignored: rlm__st_metadata reads shard 0's
 * __metadata__. A file with no tensors (only "{}" or only __metadata__) and
 * an empty weight_map are valid.
 */
#ifndef RLM_SAFETENSORS_H
#define RLM_SAFETENSORS_H

#include "tensor/tensor.h"

typedef struct rlm_st_tensor {
  const char *name;
  rlm_dtype dtype;
  int ndim;
  int64_t shape[RLM_MAX_DIMS];
  const void *data;   /* inside the mapping of file `file_index` */
  size_t nbytes;
  int file_index;     /* which shard */
} rlm_st_tensor;

typedef struct rlm_safetensors rlm_safetensors;

rlm_status rlm__st_open(rlm_safetensors **out, const char *path, rlm_error *err);
/* One safetensors image in memory (`len` bytes at `data`, which must
 * outlive the handle); `name` stands for the file in messages. */
rlm_status rlm__st_open_memory(rlm_safetensors **out, const char *name, const void *data,
                               size_t len, rlm_error *err);
void rlm__st_free(rlm_safetensors *st);
size_t rlm__st_count(const rlm_safetensors *st);
/* i in [0, count), tensors sorted by name (strcmp). */
const rlm_st_tensor *rlm__st_at(const rlm_safetensors *st, size_t i);
/* NULL if absent (binary search). */
const rlm_st_tensor *rlm__st_find(const rlm_safetensors *st, const char *name);
const char *rlm__st_file_path(const rlm_safetensors *st, int file_index);
int rlm__st_file_count(const rlm_safetensors *st);
/* A __metadata__ value of the first shard, or NULL. */
const char *rlm__st_metadata(const rlm_safetensors *st, const char *key);

/* Writer: collect tensors, then save atomically (temp file + rename).
 * Header JSON is padded with spaces to a multiple of 8 bytes so the data
 * buffer starts 8-aligned; tensors are laid out in name order. */
typedef struct rlm_st_writer rlm_st_writer;

rlm_status rlm__st_writer_create(rlm_st_writer **out, rlm_error *err);
void rlm__st_writer_free(rlm_st_writer *w);
/* `data` must stay valid until save; it is not copied. */
rlm_status rlm__st_writer_add(rlm_st_writer *w, const char *name, rlm_dtype dtype,
                              int ndim, const int64_t *shape, const void *data,
                              size_t nbytes, rlm_error *err);
/* Like add, but the writer takes ownership of `data` (an rlm__malloc'd
 * buffer) and frees it with the writer, also when the call fails. */
rlm_status rlm__st_writer_add_owned(rlm_st_writer *w, const char *name,
                                    rlm_dtype dtype, int ndim,
                                    const int64_t *shape, void *data,
                                    size_t nbytes, rlm_error *err);
rlm_status rlm__st_writer_set_metadata(rlm_st_writer *w, const char *key,
                                       const char *value, rlm_error *err);
rlm_status rlm__st_writer_save(rlm_st_writer *w, const char *path, rlm_error *err);
/* The file save would write, as one rlm__malloc'd buffer. */
rlm_status rlm__st_writer_image(rlm_st_writer *w, void **buf, size_t *len, rlm_error *err);

/* dtype from its safetensors name; false if unknown. */
bool rlm__dtype_from_name(const char *name, rlm_dtype *out);

#endif /* RLM_SAFETENSORS_H */
