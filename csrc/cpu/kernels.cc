// The window kernels, compiled twice from kernels_impl.inc: portable code (what the compiler
// vectorises for the build's baseline, SSE2 on x86-64) and, on x86-64, a copy for AVX2 + FMA +
// F16C chosen at load time where the CPU has them. A wheel is built for the baseline, so the
// wider instructions come from a target pragma, not from -march.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/scalar.h"
#include "cpu/kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define JAXSPARSE_TC_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define JAXSPARSE_TC_X86 0
#endif

namespace jaxsparse_tc {
namespace cpu {

namespace portable {
#define JAXSPARSE_TC_AVX2 0
#include "cpu/kernels_impl.inc"
#undef JAXSPARSE_TC_AVX2
}  // namespace portable

#if JAXSPARSE_TC_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,popcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt")
#endif
namespace avx2 {
#define JAXSPARSE_TC_AVX2 1
#include "cpu/kernels_impl.inc"
#undef JAXSPARSE_TC_AVX2
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

static bool cpu_has_avx2() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  // avx2 also checks that the OS saves the YMM registers.
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("popcnt");
}
#endif

const KernelTable& kernels() {
#if JAXSPARSE_TC_X86
  static const KernelTable table = cpu_has_avx2() ? avx2::make_table() : portable::make_table();
#else
  static const KernelTable table = portable::make_table();
#endif
  return table;
}

}  // namespace cpu
}  // namespace jaxsparse_tc
