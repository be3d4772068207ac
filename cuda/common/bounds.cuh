// Bounds folded into the indices kernels read from a pattern's integer arrays. Inside a traced
// function those arrays cannot be checked by value, and user code can change them (a tree map
// over a params tree that holds a matrix); so every index a kernel reads from them is folded into
// the size of what it addresses right where it is loaded, and every range into its array: any
// content stays in bounds (the results of a corrupt pattern are undefined, and no loop runs
// longer than the arrays are long). Each fold is the identity on a valid pattern.
#pragma once
#include <cstdint>

namespace jaxsparse_tc {

// i folded into [0, last] (last >= 0): one unsigned min, so a negative i lands on last.
__device__ __forceinline__ int clamp_last(int i, int last) {
  return int(min(unsigned(i), unsigned(last)));
}

// base + off (a block's value offset plus a bit's rank) folded into [0, last], in unsigned
// arithmetic so that a corrupt base cannot overflow.
__device__ __forceinline__ int clamp_sum(int base, int off, int last) {
  return int(min(unsigned(base) + unsigned(off), unsigned(last)));
}

// x folded into [lo, hi] (lo <= hi): a range's begin into its array, its end into [begin, size].
__device__ __forceinline__ int clamp_to(int x, int lo, int hi) {
  return min(max(x, lo), hi);
}

}  // namespace jaxsparse_tc
