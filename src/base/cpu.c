/* cpu.c -- which vector instruction sets this CPU (and its OS) can run,
 * for the kernels' run-time dispatch (attn/, quant/, model/ pick their
 * tables through these), and how many cores the process may use.
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

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

enum { CPU_KNOWN = 1, CPU_AVX2 = 2, CPU_AVX512 = 4, CPU_VNNI = 8, CPU_AMX = 16, CPU_PANEL = 32 };

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* AMX tiles with int8 products (CPUID leaf 7: EDX bits 24, 25), usable
 * only once Linux grants the process the tile data state (the request is
 * process-wide and idempotent; kernels without it refuse, and so the
 * answer is false there; RINGLM_NO_AMX=1 turns it off, to compare). */
static bool amx_int8(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) || !(edx & (1u << 25)))
    return false;
  /* the OS must enable the tile state in XCR0 (bits 17, 18; OSXSAVE first) */
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

static int probe(void) {
  unsigned eax, ebx, ecx, edx;
  __builtin_cpu_init();
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  /* switches that turn a kernel off, to compare with the one it replaces
   * (RINGLM_NO_AVX512: the AVX2 kernels, as a CPU without AVX-512 runs) */
  const char *no_amx = getenv("RINGLM_NO_AMX"), *no_panel = getenv("RINGLM_NO_PANEL");
  const char *no_avx512 = getenv("RINGLM_NO_AVX512");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      !(no_avx512 && no_avx512[0] == '1');
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  const bool amx = vnni && !(no_amx && no_amx[0] == '1') && amx_int8();
  const bool panel = vnni && !(no_panel && no_panel[0] == '1');
  return CPU_KNOWN | (avx2 ? CPU_AVX2 : 0) | (avx512 ? CPU_AVX512 : 0) | (vnni ? CPU_VNNI : 0) | (amx ? CPU_AMX : 0) |
         (panel ? CPU_PANEL : 0);
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
bool rlm__cpu_amx_int8(void) { return features() & CPU_AMX; }
bool rlm__cpu_vnni_panels(void) { return features() & CPU_PANEL; }

/* ------------------------------------------------------------------------
 * Cores. The default thread count is the physical cores this process may
 * run on: decode is bound by memory bandwidth and the products by the
 * vector units, which SMT siblings share, so a second thread per core
 * only adds synchronisation (llama.cpp defaults the same way). Cores are
 * told apart by sysfs (package, core id) of each CPU in the affinity
 * mask; without sysfs every logical CPU counts as a core.
 * ---------------------------------------------------------------------- */
#if defined(__linux__)
#include <sched.h>
#include <stdio.h>

static int read_topology(int cpu, const char *field) {
  char path[128];
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, field);
  FILE *f = fopen(path, "r");
  int v = -1;
  if (f && fscanf(f, "%d", &v) != 1) v = -1;
  if (f) fclose(f);
  return v;
}

/* Distinct (package, core) pairs among the CPUs of `set`; 0 if unknown. */
static int physical_cores(const cpu_set_t *set) {
  enum { MAX_CORES = 1024 };
  static long seen[MAX_CORES]; /* only called under the once-guard below */
  int n = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, set)) continue;
    int pkg = read_topology(cpu, "physical_package_id");
    int core = read_topology(cpu, "core_id");
    if (pkg < 0 || core < 0) return 0;
    long key = (long)pkg << 32 | (unsigned)core;
    int i = 0;
    while (i < n && seen[i] != key) i++;
    if (i == n && n < MAX_CORES) seen[n++] = key;
  }
  return n;
}

static void count_cores(int *n_physical, int *n_available) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    *n_available = *n_physical = rlm__cpu_count();
    return;
  }
  *n_available = CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  int p = physical_cores(&set);
  *n_physical = p > 0 && p <= *n_available ? p : *n_available;
}
#else
static void count_cores(int *n_physical, int *n_available) {
  *n_available = *n_physical = rlm__cpu_count();
}
#endif

static const char *feature_names(void) {
  if (rlm__cpu_avx512_vnni()) return "AVX2 AVX-512 VNNI";
  if (rlm__cpu_avx512()) return "AVX2 AVX-512";
  if (rlm__cpu_avx2()) return "AVX2";
  return "scalar";
}

static pthread_once_t cores_once = PTHREAD_ONCE_INIT;
static int g_physical, g_available;

static void cores_init(void) { count_cores(&g_physical, &g_available); }

rlm_cpu_info rlm_cpu_info_get(void) {
  pthread_once(&cores_once, cores_init);
  return (rlm_cpu_info){.n_physical = g_physical, .n_available = g_available,
                        .features = feature_names()};
}

int rlm__cpu_physical(void) { return rlm_cpu_info_get().n_physical; }
