// The CPU window kernels: what the FFI handlers hand them, and the table of instantiations for
// this CPU (kernels.cc compiles kernels_impl.inc once per instruction set and picks one at load).
// A kernel computes windows [w_begin, w_end) of every head; windows are independent (each output
// row and each value is written by the window that owns it), so the handlers can split them
// across threads and the results do not depend on the split.
#pragma once
#include <cstdint>

#include "common/format.h"

namespace jaxsparse_tc {
namespace cpu {

enum Dtype : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3, kNumDtypes = 4 };

// A dense operand [heads, rows, cols] (heads 1 broadcasts), or per-edge values [heads, nnz]
// (rows 1, cols nnz).
struct Operand {
  const void* data;
  int64_t heads, rows, cols;
};

struct SpmmArgs {  // out[h] = A_h X_h
  PatternView p;
  Operand values, x;  // [Hv, nnz], [Hx, n, d]
  void* out;          // [H, m, d]
  int64_t heads, m;
};

struct SpmmExtremumArgs {  // out[h] = max (or min) over A_h's entries of A_h[i, j] X_h[j]
  PatternView p;
  Operand values, x;  // [Hv, nnz], [Hx, n, d]
  void* out;          // [H, m, d]
  int32_t* arg;       // [H, m, d]: the format position each out entry came from, or -1
  int64_t heads, m;
  bool is_min;
};

struct SddmmArgs {  // out[h, idx(i, j)] = <X_h[i], Y_h[j]>
  PatternView p;
  Operand x, y;  // [Hx, m, d], [Hy, n, d]
  void* out;     // [H, nnz]: x's dtype, or float32 when f32_out
  int64_t heads, nnz;
  bool f32_out;
};

struct SoftmaxArgs {  // forward: out = softmax(y); backward: out = y * (t - rowsum(y * t))
  PatternView p;
  Operand y, t;  // [Hy, nnz], [Ht, nnz] (t unused by the forward)
  void* out;     // [H, nnz]
  int64_t heads, nnz;
};

struct AttentionArgs {
  PatternView p;
  Operand q, k, v, bias;      // [Hq, m, d], [Hk, n, d], [Hv, n, dv], [Hb, nnz] float32
  Operand dq, dk, dv, dbias;  // the JVP's tangents (same shapes and dtypes)
  const float* lse_in;        // JVP: [Hl, m]
  int64_t lse_heads;
  void* out;   // forward o / JVP do: [H, m, dv]
  float* lse;  // forward: [H, m]; +inf for rows with no entries or only -inf logits
  int64_t heads, m;
  float scale;
  bool has_bias;
};

template <typename Args>
using WindowKernel = void (*)(const Args&, int64_t w_begin, int64_t w_end);

struct KernelTable {
  WindowKernel<SpmmArgs> spmm[kNumDtypes];
  WindowKernel<SpmmExtremumArgs> spmm_extremum[kNumDtypes];
  WindowKernel<SddmmArgs> sddmm[kNumDtypes];
  // The softmax and attention kernels have no float64 version (nullptr).
  WindowKernel<SoftmaxArgs> edge_softmax[kNumDtypes];
  WindowKernel<SoftmaxArgs> edge_softmax_bwd[kNumDtypes];
  WindowKernel<AttentionArgs> attention_fwd[kNumDtypes];
  WindowKernel<AttentionArgs> attention_jvp[kNumDtypes];
};

// The kernels for this CPU: AVX2 + FMA + F16C where the CPU has them, else portable code.
const KernelTable& kernels();

}  // namespace cpu
}  // namespace jaxsparse_tc
