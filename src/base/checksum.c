/* checksum.c -- FNV-1a 64 (signatures, in-memory images) and CRC-32C
 * (Castagnoli, reflected polynomial 0x82F63B78), the checksum of ringlm's
 * snapshot files: a bit-at-a-time reference and the
 * slicing-by-8 version files go through (8 table lookups per 8 bytes,
 * about 1.5 GB/s here, so an 8k-token prefix file checks in tens of ms).
 * The check value of "123456789" is 0xE3069283 (the CRC catalogue's). */
#include "base.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u

uint64_t rlm__fnv1a64(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint32_t rlm__crc32c_ref(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int b = 0; b < 8; b++) crc = (crc >> 1) ^ (CRC32C_POLY & (0u - (crc & 1u)));
  }
  return ~crc;
}

/* t[k][b]: the CRC of byte b followed by k zero bytes. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
    crc_table[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; b++)
    for (int k = 1; k < 8; k++)
      crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xffu];
}

uint32_t rlm__crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc_once, crc_table_init);
  const uint8_t *p = data;
  crc = ~crc;
  for (; n && ((uintptr_t)p & 7u); n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xffu];
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8); /* little-endian: the first byte is the lowest */
    w ^= crc;
    crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
          crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^
          crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
  }
  for (; n; n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xffu];
  return ~crc;
}
