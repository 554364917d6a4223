/* cpu.c -- which vector instruction sets this CPU (and its OS) can run,
 * for the kernels' run-time dispatch (attn/, quant/, model/ pick their
 * tables through these).
 *
 * __builtin_cpu_supports also covers the OS side (XSAVE state enabled for
 * the wider registers), so a level is only reported when code using it
 * can run. F16C comes from CPUID leaf 1 (ECX bit 29) because clang's
 * __builtin_cpu_supports does not know the name; it is asked after AVX2,
 * so the OS already saves the YMM state it needs. The answers are worked
 * out once per process: CPUID traps to the hypervisor in a VM (tens of
 * microseconds), and some kernels ask on every call. The library is built
 * for baseline x86-64: everything wider sits behind these answers.
 */
#include "base.h"

#include <stdatomic.h>

enum { CPU_KNOWN = 1, CPU_AVX2 = 2, CPU_AVX512 = 4, CPU_VNNI = 8 };

#if defined(__x86_64__)
#include <cpuid.h>

static int probe(void) {
  unsigned eax, ebx, ecx, edx;
  __builtin_cpu_init();
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  return CPU_KNOWN | (avx2 ? CPU_AVX2 : 0) | (avx512 ? CPU_AVX512 : 0) | (vnni ? CPU_VNNI : 0);
}
#else
static int probe(void) { return CPU_KNOWN; }
#endif

/* Racing first calls all store the same answer. */
static int features(void) {
  static _Atomic int known; /* 0: not probed yet */
  int f = atomic_load_explicit(&known, memory_order_relaxed);
  if (!f) atomic_store_explicit(&known, f = probe(), memory_order_relaxed);
  return f;
}

bool rlm__cpu_avx2(void) { return features() & CPU_AVX2; }
bool rlm__cpu_avx512(void) { return features() & CPU_AVX512; }
bool rlm__cpu_avx512_vnni(void) { return features() & CPU_VNNI; }
