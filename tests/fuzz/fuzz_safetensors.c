/* fuzz_safetensors.c -- the safetensors reader: one image in memory
 * (first byte even), or a folder with model.safetensors.index.json and one
 * shard (first byte odd: index JSON, NUL, shard bytes). Every tensor an
 * accepted file lists must lie inside it: its first and last bytes are
 * read, so ASan sees any pointer past the buffer. */
#include "fuzz.h"
#include "model/safetensors.h"

static volatile uint8_t g_sink;

static void touch(const rlm_safetensors *st) {
  for (size_t i = 0; i < rlm__st_count(st); i++) {
    const rlm_st_tensor *t = rlm__st_at(st, i);
    if (t->nbytes) g_sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    if (rlm__st_find(st, t->name) != t) abort(); /* the table is sorted and unique */
  }
  (void)rlm__st_metadata(st, "format");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  rlm_safetensors *st = NULL;
  if (data[0] % 2 == 0) {
    if (!rlm__st_open_memory(&st, "fuzz", data + 1, size - 1, NULL)) touch(st);
    rlm__st_free(st);
    return 0;
  }
  const uint8_t *shard;
  size_t n_shard;
  char *index = fuzz_split(data + 1, size - 1, &shard, &n_shard);
  const char *dir = fuzz_dir();
  if (index && fuzz_write(dir, "model.safetensors.index.json", index, strlen(index)) &&
      fuzz_write(dir, "model-00001-of-00001.safetensors", shard, n_shard) &&
      !rlm__st_open(&st, dir, NULL))
    touch(st);
  rlm__st_free(st);
  free(index);
  return 0;
}
