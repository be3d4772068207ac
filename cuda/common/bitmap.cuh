// Bitmap decode (docs/FORMAT.md): bit c*8+r of block b is (row r, condensed column c); its
// value sits at block_value_ptr[b] + popcount of the lower bits.
#pragma once
#include <cstdint>

namespace jaxsparse_tc {

// Offset of bit k's value inside its block, or -1 when the bit is clear.
__device__ __forceinline__ int bit_value_offset(uint64_t bits, int k) {
  if (!((bits >> k) & 1ull)) return -1;
  return __popcll(bits & ((1ull << k) - 1ull));
}

// Both 32-bit halves in one 8-byte load (the array is uint32[B, 2], 8-byte aligned per block).
__device__ __forceinline__ uint64_t load_block_bits(const uint32_t* bitmap, int64_t b) {
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(bitmap) + b);
  return uint64_t(v.x) | (uint64_t(v.y) << 32);
}

}  // namespace jaxsparse_tc
