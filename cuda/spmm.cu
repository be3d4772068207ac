// CUDA SpMM: out[h] = A_h @ X_h on the window/bitmap-block format (docs/FORMAT.md).
//
// Tensor-core path (fp16, bf16, fp32 as tf32): FlashSparse's swap-and-transpose, C^T = X^T A^T.
// The 8-row window is the MMA's n=8 operand (B), gathered X rows the m=16 operand (A), so a
// block is 8 rows x 8 condensed columns with no padding rows. One warp owns one schedule item
// and a slab of 16*MT features (MT m16 tiles). Feature remapping: MMA row g of tile i is
// feature 2*MT*g + 2i and row g+8 is 2*MT*g + 2i + 1, so each thread's A operands are 2*MT
// consecutive features of one X row: one 16-byte load per gathered row (MT=4, fp16), 8 lanes
// covering a contiguous 128-byte segment, and the C fragment maps back to the same contiguous
// features, so stores are 16 bytes wide too.
//
// Exact fp32 path (precision attr 1): CUDA cores, one warp per item and 128-feature slab.
//
// Split windows (schedule items with split=1): each piece adds its fp32 partial into a
// per-window workspace slot with atomics; the piece that completes the window's block count
// (a per-slot counter) converts the slot into the output. A prep kernel zeroes the slots first.
// Slot = index of the window's first piece in the schedule (first pieces have the maximal item
// size, so they sit in the schedule's prefix); windows whose slot would exceed the workspace
// cap fall back to their first piece computing the whole window alone (correct, slower).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <cstdint>

#include "cpu/ffi_common.h"
#include "jaxsparse_tc/bitmap.cuh"
#include "jaxsparse_tc/cuda_common.cuh"
#include "jaxsparse_tc/format.h"
#include "jaxsparse_tc/mma.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;                       // warps per CTA
constexpr int64_t kWorkspaceBytes = 128 << 20;  // cap on the split-window fp32 workspace

struct SpmmParams {
  const void* values;
  const void* x;
  void* out;
  const int32_t* wcp;
  const int32_t* wc;
  const int32_t* wbp;
  const uint32_t* bitmap;
  const int32_t* bvp;
  const int4* sched;
  int64_t nnz, n, m, d;
  int64_t v_head_stride, x_head_stride;  // 0 where the operand broadcasts over heads
  int64_t num_items;
  int nslab, heads;
  bool vec;          // rows may be accessed with full-width vector loads/stores
  float* ws;         // [cap, heads, 8, d] fp32 partial sums of split windows
  int* done;         // [cap, heads, nslab] blocks accumulated so far
  int* slot_of;      // [W] workspace slot of each split window (-1: no slot)
  int64_t cap;
};

// Zeroes the workspace slot and counters of each split window and records its slot.
__global__ void split_prep(SpmmParams p) {
  const int4 first = p.sched[0];
  const int maxsz = first.z - first.y;
  const int64_t slot_floats = int64_t(p.heads) * 8 * p.d;
  for (int64_t s = blockIdx.x; s < p.num_items; s += gridDim.x) {
    const int4 it = p.sched[s];
    if (it.z - it.y < maxsz) return;  // sorted by size: no first piece beyond this point
    if (!it.w || it.y != p.wbp[it.x]) continue;
    const int64_t slot = s < p.cap ? s : -1;
    if (threadIdx.x == 0) p.slot_of[it.x] = int(slot);
    if (slot < 0) continue;
    float* ws = p.ws + slot * slot_floats;
    for (int64_t i = threadIdx.x; i < slot_floats; i += blockDim.x) ws[i] = 0.f;
    int* done = p.done + slot * p.heads * p.nslab;
    for (int64_t i = threadIdx.x; i < int64_t(p.heads) * p.nslab; i += blockDim.x) done[i] = 0;
  }
}

// Writes a thread's results: R window rows (rows[r] in 0..7) x E consecutive features at f.
// Non-split items store directly; split pieces accumulate into the workspace and the last one
// converts the window's slot.
template <class T, int R, int E>
__device__ __forceinline__ void finish(const SpmmParams& p, int h, int w, int slab, int64_t f,
                                       const int (&rows)[R], float (&v)[R][E], int slot,
                                       int nblocks, int window_blocks) {
  T* out = static_cast<T*>(p.out) + int64_t(h) * p.m * p.d;
  if (slot < 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = int64_t(w) * kWindowRows + rows[r];
      if (row < p.m && f < p.d) store_row<T, E>(out + row * p.d, f, p.d, p.vec, v[r]);
    }
    return;
  }
  float* ws = p.ws + (int64_t(slot) * p.heads + h) * kWindowRows * p.d;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (f + e < p.d) atomicAdd(ws + rows[r] * p.d + f + e, v[r][e]);
  __threadfence();  // partials visible before the counter says so
  __syncwarp();
  int old = 0;
  if ((threadIdx.x & 31) == 0)
    old = atomicAdd(p.done + (int64_t(slot) * p.heads + h) * p.nslab + slab, nblocks);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old + nblocks != window_blocks) return;
  __threadfence();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = int64_t(w) * kWindowRows + rows[r];
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) s[e] = f + e < p.d ? __ldcg(ws + rows[r] * p.d + f + e) : 0.f;
    if (row < p.m && f < p.d) store_row<T, E>(out + row * p.d, f, p.d, p.vec, s);
  }
}

// Resolves an item's split status; returns false when this warp has nothing to do.
__device__ __forceinline__ bool resolve_item(const SpmmParams& p, int4 it, int& b1, int& slot) {
  slot = -1;
  if (!it.w) return true;
  slot = p.slot_of[it.x];
  if (slot >= 0) return true;
  // No workspace slot: the first piece does the whole window, the others nothing.
  if (it.y != p.wbp[it.x]) return false;
  b1 = p.wbp[it.x + 1];
  return true;
}

// One MMA step of the tensor-core SpMM: KB blocks (bits, value base, the thread's two column
// indices per block, -1 = no column) into acc. Shared by both loop drivers below.
// NB = blocks of the call (a multiple of KB, the blocks per MMA): every gather of the call is
// issued before the first MMA, so NB/KB steps of loads are in flight per warp.
template <class T, int MT, int KB, int NB = KB>
__device__ __forceinline__ void spmm_step(const T* xh, const T* vh, const SpmmParams& p,
                                          int64_t f, const uint64_t (&bits)[NB],
                                          const int (&vbase)[NB], const int (&col)[NB][2],
                                          int g, float (&acc)[MT][4]) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int E = 2 * MT;
  constexpr int NW = Words<T, E>::N;
  const int t = threadIdx.x & 3;
  uint32_t xw[NB][2][NW];  // [block][column j][words]
  float bv[NB][2];
#pragma unroll
  for (int kb = 0; kb < NB; ++kb)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // fp16: columns 2t, 2t+1 (k pairs); tf32: columns t, t+4.
      const int c = kTf32 ? t + 4 * j : 2 * t + j;
      const int off = bit_value_offset(bits[kb], c * 8 + g);  // A(row g, column c)
      bv[kb][j] = off >= 0 ? to_f32<T>(vh[vbase[kb] + off]) : 0.f;
      if (col[kb][j] >= 0 && f < p.d) {
        load_row<T, E>(xh + int64_t(col[kb][j]) * p.d, f, p.d, p.vec, xw[kb][j]);
      } else {
#pragma unroll
        for (int i = 0; i < NW; ++i) xw[kb][j][i] = 0u;
      }
    }
#pragma unroll
  for (int s = 0; s < NB; s += KB) {
    if constexpr (kTf32) {
      const uint32_t bw[2] = {to_tf32(bv[s][0]), to_tf32(bv[s][1])};
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint32_t a[4] = {to_tf32(__uint_as_float(xw[s][0][2 * i])),
                               to_tf32(__uint_as_float(xw[s][0][2 * i + 1])),
                               to_tf32(__uint_as_float(xw[s][1][2 * i])),
                               to_tf32(__uint_as_float(xw[s][1][2 * i + 1]))};
        mma_1688_tf32(acc[i], a, bw);
      }
    } else {
      uint32_t bw[2];
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
        bw[kb] = raw16(from_f32<T>(bv[s + kb][0])) | (raw16(from_f32<T>(bv[s + kb][1])) << 16);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint32_t a[4] = {pack_lo(xw[s][0][i], xw[s][1][i]), pack_hi(xw[s][0][i], xw[s][1][i]),
                               pack_lo(xw[s + 1][0][i], xw[s + 1][1][i]),
                               pack_hi(xw[s + 1][0][i], xw[s + 1][1][i])};
        mma_16816(acc[i], a, bw, T{});
      }
    }
  }
}

constexpr int kStageBlocks = 32;  // blocks whose metadata a warp stages in shared memory at once

// Tensor-core SpMM. T = __half / __nv_bfloat16 (m16n8k16, two blocks per MMA) or float
// (tf32 m16n8k8, one block per MMA). MT = m16 tiles per warp: the slab is 16*MT features.
// STAGED: the warp first copies a chunk's bitmaps, value offsets and column indices to shared
// memory with coalesced loads, so each step's gathers wait on a shared read instead of a
// dependent global load of the column index.
template <class T, int MT, int MINB, bool STAGED, int NS = 2>
__global__ void __launch_bounds__(kWarps * 32, MINB) spmm_tc(const SpmmParams p) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int E = 2 * MT;                   // consecutive features per thread
  constexpr int KB = kTf32 ? 1 : 2;           // blocks per MMA
  constexpr int NB = KB * NS;                 // blocks per staged step (NS MMAs in flight)
  __shared__ int s_cols[STAGED ? kWarps : 1][kStageBlocks * 8];
  __shared__ uint64_t s_bits[STAGED ? kWarps : 1][kStageBlocks];
  __shared__ int s_vptr[STAGED ? kWarps : 1][kStageBlocks];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wid = threadIdx.x >> 5;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + wid;
  if (gw >= p.num_items * p.nslab) return;
  const int64_t item = gw / p.nslab;
  const int slab = int(gw % p.nslab);
  const int4 it = p.sched[item];
  const int w = it.x, b0 = it.y;
  int b1 = it.z, slot;
  if (!resolve_item(p, it, b1, slot)) return;
  const int wb = p.wbp[w];
  const int cb = p.wcp[w], ncols_w = p.wcp[w + 1] - cb;
  const int64_t f = int64_t(slab) * 16 * MT + int64_t(E) * g;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const T* xh = static_cast<const T*>(p.x) + h * p.x_head_stride;
    const T* vh = static_cast<const T*>(p.values) + h * p.v_head_stride;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    if constexpr (STAGED) {
      for (int c0 = b0; c0 < b1; c0 += kStageBlocks) {
        const int c1 = min(b1, c0 + kStageBlocks);
        __syncwarp();  // the previous chunk's readers are done
        if (c0 + lane < c1) {
          s_bits[wid][lane] = load_block_bits(p.bitmap, c0 + lane);
          s_vptr[wid][lane] = __ldg(p.bvp + c0 + lane);
        }
        const int col_lo = 8 * (c0 - wb), col_hi = min(8 * (c1 - wb), ncols_w);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int i = k * 32 + lane;
          s_cols[wid][i] = col_lo + i < col_hi ? __ldg(p.wc + cb + col_lo + i) : -1;
        }
        __syncwarp();
        for (int b = c0; b < c1; b += NB) {
          uint64_t bits[NB];
          int vbase[NB], col[NB][2];
#pragma unroll
          for (int kb = 0; kb < NB; ++kb) {
            const int lb = b + kb - c0;
            const bool in = b + kb < c1;
            bits[kb] = in ? s_bits[wid][lb] : 0ull;
            vbase[kb] = in ? s_vptr[wid][lb] : 0;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int c = kTf32 ? t + 4 * j : 2 * t + j;
              col[kb][j] = in ? s_cols[wid][lb * 8 + c] : -1;
            }
          }
          spmm_step<T, MT, KB, NB>(xh, vh, p, f, bits, vbase, col, g, acc);
        }
      }
    } else {
#pragma unroll 2
      for (int b = b0; b < b1; b += KB) {
        uint64_t bits[KB];
        int vbase[KB], col[KB][2];
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
          const int blk = b + kb;
          const bool in = blk < b1;
          bits[kb] = in ? load_block_bits(p.bitmap, blk) : 0ull;
          vbase[kb] = in ? __ldg(p.bvp + blk) : 0;
          const int colbase = 8 * (blk - wb);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int c = kTf32 ? t + 4 * j : 2 * t + j;
            col[kb][j] = in && colbase + c < ncols_w ? __ldg(p.wc + cb + colbase + c) : -1;
          }
        }
        spmm_step<T, MT, KB>(xh, vh, p, f, bits, vbase, col, g, acc);
      }
    }
    // C fragment: c0/c1 = feature f+2i at rows 2t/2t+1, c2/c3 = feature f+2i+1.
    const int rows[2] = {2 * t, 2 * t + 1};
    float v[2][E];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      v[0][2 * i] = acc[i][0];
      v[0][2 * i + 1] = acc[i][2];
      v[1][2 * i] = acc[i][1];
      v[1][2 * i + 1] = acc[i][3];
    }
    finish<T, 2, E>(p, h, w, slab, f, rows, v, slot, b1 - b0, p.wbp[w + 1] - wb);
  }
}

// Exact fp32 SpMM on CUDA cores: a warp owns an item and 128 features (4 per lane).
__global__ void __launch_bounds__(kWarps * 32) spmm_f32_exact(const SpmmParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (gw >= p.num_items * p.nslab) return;
  const int64_t item = gw / p.nslab;
  const int slab = int(gw % p.nslab);
  const int4 it = p.sched[item];
  const int w = it.x, b0 = it.y;
  int b1 = it.z, slot;
  if (!resolve_item(p, it, b1, slot)) return;
  const int wb = p.wbp[w];
  const int cb = p.wcp[w], ncols_w = p.wcp[w + 1] - cb;
  const int64_t f = int64_t(slab) * 128 + 4 * lane;
  const bool active = f < p.d;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const float* xh = static_cast<const float*>(p.x) + h * p.x_head_stride;
    const float* vh = static_cast<const float*>(p.values) + h * p.v_head_stride;
    float acc[8][4] = {};
    for (int b = b0; b < b1; ++b) {
      const uint64_t bits = load_block_bits(p.bitmap, b);
      const int vbase = __ldg(p.bvp + b);
      const int cnt = __popcll(bits);
      // The block's values and column indices, one per lane, shared by shuffles.
      const float v_lo = lane < cnt ? vh[vbase + lane] : 0.f;
      const float v_hi = lane + 32 < cnt ? vh[vbase + lane + 32] : 0.f;
      const int colbase = 8 * (b - wb);
      const int ncols = min(8, ncols_w - colbase);
      const int mycol = lane < ncols ? __ldg(p.wc + cb + colbase + lane) : 0;
      for (int c = 0; c < ncols; ++c) {
        const int col = __shfl_sync(0xffffffffu, mycol, c);
        uint32_t xw[4] = {0u, 0u, 0u, 0u};
        if (active) load_row<float, 4>(xh + int64_t(col) * p.d, f, p.d, p.vec, xw);
        const uint32_t byte = uint32_t(bits >> (8 * c)) & 0xffu;
        int idx = __popcll(bits & ((1ull << (8 * c)) - 1ull));
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          if ((byte >> r) & 1u) {  // uniform across the warp
            const float lo = __shfl_sync(0xffffffffu, v_lo, idx & 31);
            const float hi = __shfl_sync(0xffffffffu, v_hi, idx & 31);
            const float a = idx < 32 ? lo : hi;
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(a, __uint_as_float(xw[e]), acc[r][e]);
            ++idx;
          }
        }
      }
    }
    const int rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    finish<float, 8, 4>(p, h, w, slab, f, rows, acc, slot, b1 - b0, p.wbp[w + 1] - wb);
  }
}

template <class T, int MT>
void launch_tc(const SpmmParams& p, dim3 grid, cudaStream_t stream) {
  // Default: staged metadata, two MMA steps of gathers in flight per warp; for 16-bit types
  // with a 128-register cap (16 warps/SM, no spills), the fastest variant measured on H100
  // (docs/NOTES.md, v3/v4). Experiment switches (benchmarks and tests), read per launch:
  // JAXSPARSE_TC_SPMM_VARIANT=unstaged (metadata loaded per step, v1), staged1 (one step in
  // flight, v2), ns2 (v3: two steps, no register cap), minb4 (two steps, register cap).
  const char* v = std::getenv("JAXSPARSE_TC_SPMM_VARIANT");
  const std::string variant = v ? v : "";
  constexpr bool k16 = sizeof(T) == 2;
  if (variant == "unstaged") spmm_tc<T, MT, 1, false><<<grid, kWarps * 32, 0, stream>>>(p);
  else if (variant == "staged1") spmm_tc<T, MT, 1, true, 1><<<grid, kWarps * 32, 0, stream>>>(p);
  else if (variant == "ns2") spmm_tc<T, MT, 1, true><<<grid, kWarps * 32, 0, stream>>>(p);
  else if (variant == "minb4") spmm_tc<T, MT, 4, true><<<grid, kWarps * 32, 0, stream>>>(p);
  else spmm_tc<T, MT, k16 ? 4 : 1, true><<<grid, kWarps * 32, 0, stream>>>(p);
}

template <class T>
void launch_tc_mt(SpmmParams& p, int mt, int64_t items, int heads, cudaStream_t stream) {
  p.nslab = int((p.d + 16 * mt - 1) / (16 * mt));
  p.vec = p.d % (2 * mt) == 0;
  const int64_t warps = items * p.nslab;
  const dim3 grid(unsigned((warps + kWarps - 1) / kWarps), unsigned(std::min(heads, 65535)));
  if (mt == 1) launch_tc<T, 1>(p, grid, stream);
  else if (mt == 2) launch_tc<T, 2>(p, grid, stream);
  else launch_tc<T, 4>(p, grid, stream);
}

ffi::Error spmm_cuda(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer values,
                     ffi::AnyBuffer x, I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp,
                     I32 schedule, ffi::Result<ffi::AnyBuffer> out, int32_t precision) {
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out->dimensions();
  if (vd.size() != 2 || xd.size() != 3 || od.size() != 3)
    return ffi::Error::InvalidArgument("spmm: expected values [Hv,nnz], x [Hx,n,d], out [H,m,d]");
  const auto dtype = x.element_type();
  if (values.element_type() != dtype || out->element_type() != dtype)
    return ffi::Error::InvalidArgument("spmm: values, x and out must share a dtype");
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::F16 && dtype != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("spmm: unsupported dtype (float32, float16, bfloat16)");
  SpmmParams p{};
  p.values = values.untyped_data();
  p.x = x.untyped_data();
  p.out = out->untyped_data();
  p.wcp = wcp.typed_data();
  p.wc = wc.typed_data();
  p.wbp = wbp.typed_data();
  p.bitmap = bitmap.typed_data();
  p.bvp = bvp.typed_data();
  p.sched = reinterpret_cast<const int4*>(schedule.typed_data());
  p.nnz = vd[1];
  p.n = xd[1];
  p.d = xd[2];
  p.m = od[1];
  const int64_t heads = od[0];
  p.heads = int(heads);
  p.v_head_stride = vd[0] == 1 ? 0 : p.nnz;
  p.x_head_stride = xd[0] == 1 ? 0 : p.n * p.d;
  p.num_items = int64_t(schedule.element_count()) / 4;
  const int64_t num_windows = int64_t(wcp.element_count()) - 1;
  if (heads == 0 || p.m == 0 || p.d == 0 || p.num_items == 0) return ffi::Error::Success();

  const bool exact = dtype == ffi::DataType::F32 && precision == 1;
  const int mt = p.d <= 16 ? 1 : p.d <= 32 ? 2 : 4;
  const int nslab = exact ? int((p.d + 127) / 128) : int((p.d + 16 * mt - 1) / (16 * mt));

  // Split-window workspace: slot = schedule index of a window's first piece, capped.
  const int64_t slot_bytes = heads * kWindowRows * p.d * 4 + heads * nslab * 4;
  p.cap = std::min<int64_t>(p.num_items, std::max<int64_t>(1, kWorkspaceBytes / slot_bytes));
  p.nslab = nslab;
  // One scratch allocation (XLA's FFI allocator takes alignments up to 16 bytes).
  const size_t ws_bytes = size_t(p.cap * heads * kWindowRows * p.d) * 4;
  const size_t done_bytes = size_t(p.cap * heads * nslab) * 4;
  const size_t slot_bytes_all = size_t(std::max<int64_t>(num_windows, 1)) * 4;
  auto mem = scratch.Allocate(ws_bytes + done_bytes + slot_bytes_all, 16);
  if (!mem)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "spmm: workspace allocation failed");
  p.ws = static_cast<float*>(*mem);
  p.done = reinterpret_cast<int*>(static_cast<char*>(*mem) + ws_bytes);
  p.slot_of = reinterpret_cast<int*>(static_cast<char*>(*mem) + ws_bytes + done_bytes);
  split_prep<<<unsigned(std::min<int64_t>(p.num_items, 264)), 256, 0, stream>>>(p);

  if (exact) {
    p.vec = p.d % 4 == 0;
    const int64_t warps = p.num_items * nslab;
    const dim3 grid(unsigned((warps + kWarps - 1) / kWarps), unsigned(std::min<int64_t>(heads, 65535)));
    spmm_f32_exact<<<grid, kWarps * 32, 0, stream>>>(p);
  } else if (dtype == ffi::DataType::F32) {
    launch_tc_mt<float>(p, mt, p.num_items, p.heads, stream);
  } else if (dtype == ffi::DataType::F16) {
    launch_tc_mt<__half>(p, mt, p.num_items, p.heads, stream);
  } else {
    launch_tc_mt<__nv_bfloat16>(p, mt, p.num_items, p.heads, stream);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("spmm: kernel launch failed: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCuda, spmm_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()  // values [Hv, nnz]
                                  .Arg<ffi::AnyBuffer>()  // x [Hx, n, d]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // out [H, m, d]
                                  .Attr<int32_t>("precision"));

}  // namespace jaxsparse_tc
