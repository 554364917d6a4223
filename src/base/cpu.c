/* cpu.c -- which vector instruction sets this CPU (and its OS) can run,
 * for the kernels' run-time dispatch (attn/, quant/, model/ each pick a
 * table once through these).
 *
 * __builtin_cpu_supports also covers the OS side (XSAVE state enabled for
 * the wider registers), so a level is only reported when code using it
 * can run. F16C comes from CPUID leaf 1 (ECX bit 29) because clang's
 * __builtin_cpu_supports does not know the name; it is asked after AVX2,
 * so the OS already saves the YMM state it needs. The library is built
 * for baseline x86-64: everything wider sits behind these answers.
 */
#include "base.h"

#if defined(__x86_64__)
#include <cpuid.h>

static bool has_f16c(void) {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
}

bool rlm__cpu_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

bool rlm__cpu_avx512(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && rlm__cpu_avx2();
}

bool rlm__cpu_avx512_vnni(void) { return rlm__cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }

#else

bool rlm__cpu_avx2(void) { return false; }
bool rlm__cpu_avx512(void) { return false; }
bool rlm__cpu_avx512_vnni(void) { return false; }

#endif
