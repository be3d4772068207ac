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
// On sm_90 the tensor-core default is spmm_async, the same fragments fed from a cp.async gather
// ring in shared memory (rows need 16-byte alignment; spmm_tc otherwise and on older GPUs).
//
// CUDA-core path (spmm_rows, on the pattern's row view): the default where blocks are sparse
// (prefer_rows) and for exact fp32; one FMA per nonzero, many warps per SM.
// spmm_f32_exact (exact fp32 on the window format) serves where the row kernels are forced off.
//
// Split windows (schedule items with split=1): each piece adds its fp32 partial into a
// per-window workspace slot with atomics; the piece that completes the window's block count
// (a per-slot counter) converts the slot into the output. A prep kernel zeroes the slots first.
// Slot = index of the window's first piece in the schedule (split items are the schedule's
// prefix); windows whose slot would exceed the workspace cap fall back to their first piece
// computing the whole window alone (correct, slower).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <cstdint>

#include "cuda/common/ffi_cuda.cuh"
#include "cuda/arch/async_copy.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/cuda_common.cuh"
#include "common/format.h"
#include "cuda/arch/mma.cuh"
#include "cuda/common/row_view.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;                       // warps per CTA
constexpr int64_t kWorkspaceBytes = 128 << 20;  // cap on the split-window fp32 workspace

struct SpmmParams : KernelPattern {
  const void* values;
  const void* x;
  void* out;
  int64_t nnz, n, m, d;
  int64_t v_head_stride, x_head_stride;  // 0 where the operand broadcasts over heads
  int nslab, heads;
  bool vec;          // rows may be accessed with full-width vector loads/stores
  float* ws;         // [cap, heads, 8, d] fp32 partial sums of split windows
  int* done;         // [cap, heads, nslab] blocks accumulated so far
  int* slot_of;      // [W] workspace slot of each split window (-1: no slot)
  int64_t cap;
};

// Zeroes the workspace slot and counters of each split window and records its slot.
__global__ void split_prep(SpmmParams p) {
  const int64_t slot_floats = int64_t(p.heads) * 8 * p.d;
  for (int64_t s = blockIdx.x; s < p.num_items; s += gridDim.x) {
    const int4 it = p.sched[2 * s];
    if (!it.w) return;  // split items are the schedule's prefix
    if (it.y != p.wbp[it.x]) continue;
    const int64_t slot = s < p.cap ? s : -1;
    if (threadIdx.x == 0) p.slot_of[it.x] = int(slot);
    if (slot < 0) continue;
    float* ws = p.ws + slot * slot_floats;
    for (int64_t i = threadIdx.x; i < slot_floats; i += blockDim.x) ws[i] = 0.f;
    int* done = p.done + slot * p.heads * p.nslab;
    for (int64_t i = threadIdx.x; i < int64_t(p.heads) * p.nslab; i += blockDim.x) done[i] = 0;
  }
}

// Split-window election, called by the whole warp after it added its partials to the slot:
// counts the piece's blocks and tells whether this piece completed the window (it then converts
// the slot into the output; the fences order the partials before the count and the reads after).
__device__ __forceinline__ bool last_piece(const SpmmParams& p, int slot, int h, int slab,
                                           int nblocks, int window_blocks) {
  __threadfence();
  __syncwarp();
  int old = 0;
  if ((threadIdx.x & 31) == 0)
    old = atomicAdd(p.done + (int64_t(slot) * p.heads + h) * p.nslab + slab, nblocks);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old + nblocks != window_blocks) return false;
  __threadfence();
  return true;
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
  if (!last_piece(p, slot, h, slab, nblocks, window_blocks)) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = int64_t(w) * kWindowRows + rows[r];
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) s[e] = f + e < p.d ? __ldcg(ws + rows[r] * p.d + f + e) : 0.f;
    if (row < p.m && f < p.d) store_row<T, E>(out + row * p.d, f, p.d, p.vec, s);
  }
}

// A unit of work: schedule item (window w, blocks [b0, b1)) for head h and feature slab; its
// split-window slot (-1: stores directly); the window's blocks [wb, wend) and its condensed
// columns wc[cb .. cb + ncols).
struct Unit {
  int w, b0, b1, h, slab, slot, wb, wend, cb, ncols;
};

// Decodes schedule item `item`. False where the unit has nothing to do: a split piece whose
// window got no workspace slot (the window's first piece then does the whole window).
__device__ __forceinline__ bool decode_unit(const SpmmParams& p, int64_t item, int h, int slab,
                                            Unit& u) {
  const int4 s = p.sched[2 * item];
  u.w = s.x;
  u.b0 = s.y;
  u.b1 = s.z;
  u.h = h;
  u.slab = slab;
  u.slot = -1;
  u.wb = p.wbp[s.x];
  u.wend = p.wbp[s.x + 1];
  if (s.w) {
    u.slot = p.slot_of[s.x];
    if (u.slot < 0) {
      if (s.y != u.wb) return false;
      u.b1 = u.wend;
    }
  }
  u.cb = p.wcp[s.x];
  u.ncols = p.wcp[s.x + 1] - u.cb;
  return true;
}

// The unit of a warp of a one-warp-per-(item, slab) launch (heads loop in the kernel: h = 0).
__device__ __forceinline__ bool warp_item(const SpmmParams& p, int warps_per_cta, Unit& u) {
  const int64_t gw = int64_t(blockIdx.x) * warps_per_cta + (threadIdx.x >> 5);
  if (gw >= p.num_items * p.nslab) return false;
  return decode_unit(p, gw / p.nslab, 0, int(gw % p.nslab), u);
}

// One step of spmm_tc: NB blocks (bits, value base, the thread's two column indices per block,
// -1 = no column) into acc, KB blocks per MMA. Every gather of the step is issued before the
// first MMA, so NB/KB MMAs' loads are in flight per warp.
template <class T, int MT, int KB, int NB>
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

// Tensor-core SpMM with register gathers (v4; the default where spmm_async does not apply).
// T = __half / __nv_bfloat16 (m16n8k16, two blocks per MMA) or float (tf32 m16n8k8, one block
// per MMA). MT = m16 tiles per warp: the slab is 16*MT features. The warp first copies a chunk's
// bitmaps, value offsets and column indices to shared memory with coalesced loads, so each
// step's gathers wait on a shared read instead of a dependent global load of the column index;
// a step issues the gathers of two MMAs before the first one. MINB: 4 for 16-bit types (a
// 128-register cap, 16 warps/SM, no spills: the fastest setting measured, NOTES v3/v4).
template <class T, int MT, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB) spmm_tc(const SpmmParams p) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int E = 2 * MT;                   // consecutive features per thread
  constexpr int KB = kTf32 ? 1 : 2;           // blocks per MMA
  constexpr int NB = KB * 2;                  // blocks per step (two MMAs in flight)
  __shared__ int s_cols[kWarps][kStageBlocks * 8];
  __shared__ uint64_t s_bits[kWarps][kStageBlocks];
  __shared__ int s_vptr[kWarps][kStageBlocks];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wid = threadIdx.x >> 5;
  Unit wi;
  if (!warp_item(p, kWarps, wi)) return;
  const int w = wi.w, b0 = wi.b0, b1 = wi.b1, slab = wi.slab, slot = wi.slot;
  const int wb = wi.wb, cb = wi.cb, ncols_w = wi.ncols;
  const int64_t f = int64_t(slab) * 16 * MT + int64_t(E) * g;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const T* xh = static_cast<const T*>(p.x) + h * p.x_head_stride;
    const T* vh = static_cast<const T*>(p.values) + h * p.v_head_stride;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

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
    finish<T, 2, E>(p, h, w, slab, f, rows, v, slot, b1 - b0, wi.wend - wb);
  }
}

// ---- Pipelined tensor-core SpMM (default where rows are 16-byte aligned) -------------------
// Same MMA scheme as spmm_tc, but gathered X rows never pass through registers: the warp
// copies them with cp.async (16 bytes per lane, zero-filled for missing columns, L1-allocating
// by default so hub rows hit there) into a ring of two shared-memory stages (32 rows = 4 blocks,
// plus the stage's values), so one stage is in flight while it computes on the other; MMA
// operands come from shared memory by ldmatrix.trans (fp16, bf16) or shared loads (tf32).
// Persistent warps (v9): a warp walks a strided sequence of units (item, head, slab) as one
// stream of stages. Unit descriptors are decoded 32 at a time (lane j holds the warp's unit j),
// a chunk's metadata (<= 32 blocks: bitmaps, value offsets, column indices) is loaded into
// registers one chunk ahead and written to the other of two shared buffers just before the
// chunk's first stage is issued, and that first stage is issued during the previous chunk's last
// one, so neither metadata nor the first gathers of an item wait a memory round trip (v8 paid
// two per item). The accumulators leave through a shared tile in the stage slot just consumed
// (finish_tile: row-contiguous stores, or 16-byte atomics for split windows). Needs
// d * sizeof(T) % 16 == 0 and a 16-byte aligned X. Versions and counters: docs/NOTES.md
// (SpMM v5-v9). (One TMA bulk copy per gathered row was 1.8x slower, and 3 stages slower: v6, v5.)
template <class T, int SLAB, int WARPS>
struct AsyncShape {
  static constexpr int kStages = 2;
  static constexpr int kRowBytes = SLAB * int(sizeof(T));  // one gathered slab row, <= 256
  // Padding makes the 8 rows an ldmatrix (or tf32 load) touches hit distinct banks.
  static constexpr int kRowStride = kRowBytes + (sizeof(T) == 4 ? 32 : 16);
  static constexpr int kStageRows = 32;                   // 4 blocks x 8 condensed columns
  static constexpr int kStageBlocks = kStageRows / kBlockCols;
  static constexpr int kValBytes = kStageBlocks * 64 * int(sizeof(T)) + 16;
  static constexpr int kStageBytes = kStageRows * kRowStride + kValBytes;
  static constexpr int kMetaBlocks = 32;  // blocks of one chunk (schedule items have <= 32)
  static constexpr int kColsAt = 0, kBitsAt = kMetaBlocks * 8 * 4, kVptrAt = kBitsAt + kMetaBlocks * 8;
  static constexpr int kMetaBytes = kVptrAt + 144;
  static constexpr int kWarpBytes = 2 * kMetaBytes + kStages * kStageBytes;
  static constexpr int kCtaBytes = WARPS * kWarpBytes;
  static_assert(kRowBytes % 16 == 0 && kRowBytes <= 512, "slab row");
  static_assert(kStageBytes % 16 == 0 && kMetaBytes % 16 == 0, "16-byte stage alignment");
  static_assert(kWindowRows * (SLAB + 4) * 4 <= kStageBytes, "epilogue tile fits a stage");
};

// The B-fragment pair of one block for this lane: values at (row g, condensed columns c, c+1)
// packed as two b16 (fp16/bf16 path, c = 2t: bit positions 16t+g and 16t+8+g). `q` = that
// first position within its 32-bit half, `hi` = it lies in the upper half; both per lane.
__device__ __forceinline__ uint32_t block_pair16(uint64_t bits, const uint16_t* sv, int vb, int q,
                                                 bool hi) {
  const uint32_t lo_w = uint32_t(bits), hi_w = uint32_t(bits >> 32);
  const uint32_t word = hi ? hi_w : lo_w;
  const int o0 = vb + (hi ? __popc(lo_w) : 0) + __popc(word & ((1u << q) - 1u));
  const int o1 = o0 + __popc((word >> q) & 0xffu);
  const uint32_t v0 = (word >> q) & 1u ? sv[o0] : 0u;
  const uint32_t v1 = (word >> (q + 8)) & 1u ? sv[o1] : 0u;
  return v0 | (v1 << 16);
}

// Writes a window's [8][SLAB] fp32 tile (shared memory, row stride SO) for the slab's features.
// Whole windows store it; split pieces add it into the workspace slot with 16-byte atomics, one
// warp instruction covering 512 contiguous bytes (per-float atomics touched a sector per lane
// and were a quarter of all L2 traffic), and the piece that completes the window converts the
// slot. Each lane covers 4 consecutive features; d % 4 == 0 on this path.
template <class T, int SLAB, int SO>
__device__ __forceinline__ void finish_tile(const SpmmParams& p, int h, int w, int slab, int64_t f0,
                                            const float* tile, int slot, int nblocks,
                                            int window_blocks) {
  constexpr int kLanesPerRow = SLAB / 4;
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int lane = threadIdx.x & 31;
  const int c = (lane % kLanesPerRow) * 4;
  const int64_t f = f0 + c;
  const bool in = f < p.d;
  T* out = static_cast<T*>(p.out) + int64_t(h) * p.m * p.d;
  if (slot < 0) {
#pragma unroll
    for (int r = lane / kLanesPerRow; r < kWindowRows; r += kRowsPerPass) {
      const int64_t row = int64_t(w) * kWindowRows + r;
      const float v[4] = {tile[r * SO + c], tile[r * SO + c + 1], tile[r * SO + c + 2],
                          tile[r * SO + c + 3]};
      if (row < p.m && in) store_row<T, 4>(out + row * p.d, f, p.d, true, v);
    }
    return;
  }
  float* ws = p.ws + (int64_t(slot) * p.heads + h) * kWindowRows * p.d;
#pragma unroll
  for (int r = lane / kLanesPerRow; r < kWindowRows; r += kRowsPerPass)
    if (in)
      atomicAdd(reinterpret_cast<float4*>(ws + r * p.d + f),
                make_float4(tile[r * SO + c], tile[r * SO + c + 1], tile[r * SO + c + 2],
                            tile[r * SO + c + 3]));
  if (!last_piece(p, slot, h, slab, nblocks, window_blocks)) return;
#pragma unroll
  for (int r = lane / kLanesPerRow; r < kWindowRows; r += kRowsPerPass) {
    const int64_t row = int64_t(w) * kWindowRows + r;
    if (row < p.m && in) {
      const float4 s = __ldcg(reinterpret_cast<const float4*>(ws + r * p.d + f));
      const float v[4] = {s.x, s.y, s.z, s.w};
      store_row<T, 4>(out + row * p.d, f, p.d, true, v);
    }
  }
}

// One chunk of a unit: its blocks [c0, c1), at most kMetaBlocks of them.
struct Chunk {
  Unit u;
  int c0, c1;
};

// A chunk's metadata in registers: lane i holds block c0+i's bitmap and value offset (lane 0
// also the end offset of a full chunk) and condensed columns 32k+i (-1 past the chunk's).
struct ChunkMeta {
  uint64_t bits;
  int vptr, vptr_end;
  int cols[8];
};

__device__ __forceinline__ void load_meta(const SpmmParams& p, const Chunk& c, ChunkMeta& m) {
  const int lane = threadIdx.x & 31;
  m.bits = c.c0 + lane < c.c1 ? load_block_bits(p.bitmap, c.c0 + lane) : 0ull;
  m.vptr = c.c0 + lane <= c.c1 ? __ldg(p.bvp + c.c0 + lane) : 0;
  m.vptr_end = c.c0 + 32 <= c.c1 ? __ldg(p.bvp + c.c0 + 32) : 0;
  const int col_lo = 8 * (c.c0 - c.u.wb), col_hi = min(8 * (c.c1 - c.u.wb), c.u.ncols);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int i = k * 32 + lane;
    m.cols[k] = col_lo + i < col_hi ? __ldg(p.wc + c.u.cb + col_lo + i) : -1;
  }
}

__device__ __forceinline__ Unit shfl_unit(const Unit& x, int src) {
  Unit y;
  y.w = __shfl_sync(0xffffffffu, x.w, src);
  y.b0 = __shfl_sync(0xffffffffu, x.b0, src);
  y.b1 = __shfl_sync(0xffffffffu, x.b1, src);
  y.h = __shfl_sync(0xffffffffu, x.h, src);
  y.slab = __shfl_sync(0xffffffffu, x.slab, src);
  y.slot = __shfl_sync(0xffffffffu, x.slot, src);
  y.wb = __shfl_sync(0xffffffffu, x.wb, src);
  y.wend = __shfl_sync(0xffffffffu, x.wend, src);
  y.cb = __shfl_sync(0xffffffffu, x.cb, src);
  y.ncols = __shfl_sync(0xffffffffu, x.ncols, src);
  return y;
}

// Unit number u of the launch (units = heads x items x slabs, slabs fastest): w = -1 where it
// has nothing to do, -2 past the end.
__device__ __forceinline__ Unit unit_at(const SpmmParams& p, int64_t u, int64_t units) {
  Unit x{};
  x.w = -2;
  if (u >= units) return x;
  const int64_t per_head = p.num_items * p.nslab;
  const int h = int(u / per_head);
  const int64_t r = u - int64_t(h) * per_head;
  if (!decode_unit(p, r / p.nslab, h, int(r % p.nslab), x)) x.w = -1;
  return x;
}

template <class T, int SLAB, int WARPS, bool L1>
__global__ void __launch_bounds__(WARPS * 32, 1) spmm_async(const SpmmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // tuned for and launched on sm_90+ only (shared-memory sizes, NOTES)
#else
  using Sh = AsyncShape<T, SLAB, WARPS>;
  constexpr int S = Sh::kStages;
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int MT = SLAB / 16;                 // m16 tiles (16 features each)
  static_assert(!kTf32 || MT % 2 == 0, "tf32 loads cover m16 tiles in pairs");
  constexpr int kPieces = Sh::kRowBytes / 16;   // 16-byte pieces of a slab row
  constexpr int kRowsPerPass = 32 / kPieces;    // rows one warp-wide cp.async covers
  constexpr int SO = SLAB + 4;   // epilogue tile row stride (floats)
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wid = threadIdx.x >> 5;
  unsigned char* wsm = smem + wid * Sh::kWarpBytes;
  unsigned char* ring = wsm + 2 * Sh::kMetaBytes;
  auto s_cols = [&](int b) { return reinterpret_cast<int*>(wsm + b * Sh::kMetaBytes + Sh::kColsAt); };
  auto s_bits = [&](int b) {
    return reinterpret_cast<uint64_t*>(wsm + b * Sh::kMetaBytes + Sh::kBitsAt);
  };
  auto s_vptr = [&](int b) { return reinterpret_cast<int*>(wsm + b * Sh::kMetaBytes + Sh::kVptrAt); };

  const int row_bytes32 = int(p.d) * int(sizeof(T));  // the launch checks it fits an int
  const uintptr_t v_end = reinterpret_cast<uintptr_t>(p.values) +
                          uintptr_t(p.v_head_stride ? p.heads : 1) * uintptr_t(p.nnz) * sizeof(T);
  // Per-lane bit positions of the B fragment (see block_pair16 / the tf32 layout).
  const int q16 = (16 * t + g) & 31;
  const bool hi16 = t >= 2;
  const int q32 = 8 * t + g;
  const int piece = lane % kPieces, prow = lane / kPieces;

  // The warp's units: first, first + stride, ...; lane j holds unit batch + j.
  const int64_t units = int64_t(p.heads) * p.num_items * p.nslab;
  const int64_t stride = int64_t(gridDim.x) * WARPS;
  const int64_t first = int64_t(blockIdx.x) * WARPS + wid;
  int64_t batch = 0, k = 0;
  Unit lane_unit = unit_at(p, first + lane * stride, units);
  auto next_unit = [&](Unit& u) -> bool {
    for (;;) {
      if (k - batch == 32) {
        batch = k;
        lane_unit = unit_at(p, first + (batch + lane) * stride, units);
      }
      u = shfl_unit(lane_unit, int(k - batch));
      ++k;
      if (u.w == -2) return false;
      if (u.w >= 0) return true;
    }
  };
  auto next_chunk = [&](const Chunk& c, Chunk& n) -> bool {
    if (c.c1 < c.u.b1) {
      n.u = c.u;
      n.c0 = c.c1;
    } else {
      if (!next_unit(n.u)) return false;
      n.c0 = n.u.b0;
    }
    n.c1 = min(n.u.b1, n.c0 + Sh::kMetaBlocks);
    return true;
  };
  auto store_meta = [&](const ChunkMeta& m, int b) {
    s_bits(b)[lane] = m.bits;
    s_vptr(b)[lane] = m.vptr;
    if (lane == 0) s_vptr(b)[32] = m.vptr_end;
#pragma unroll
    for (int i = 0; i < 8; ++i) s_cols(b)[i * 32 + lane] = m.cols[i];
  };

  // Issues stage q of chunk c (metadata in buffer b) into ring slot rs: its gathered rows
  // (missing columns zero-filled) and the 4-byte words covering its values (the last one
  // clipped to the array's end).
  auto issue = [&](const Chunk& c, int b, int q, int rs) {
    unsigned char* st = ring + rs * Sh::kStageBytes;
    const int lb = q * Sh::kStageBlocks;
    const int nb = min(Sh::kStageBlocks, c.c1 - c.c0 - lb);
    const int nrows = (kTf32 ? nb : (nb + 1) & ~1) * kBlockCols;
    const int64_t f0 = int64_t(c.u.slab) * SLAB;
    const int row_copy = int(p.d - f0 < SLAB ? p.d - f0 : SLAB) * int(sizeof(T));
    const int piece_bytes = max(0, min(16, row_copy - 16 * piece));
    const char* xh = static_cast<const char*>(p.x) +
                     (c.u.h * p.x_head_stride + f0) * int64_t(sizeof(T)) + 16 * piece;
    const int* cols = s_cols(b) + lb * kBlockCols + prow;
    const uint32_t rows_at = shared_addr(st) + 16 * piece + prow * Sh::kRowStride;
    // This loop is most of the kernel's instructions: one multiply-add per address (v9 spent
    // ~20 instructions per copy on 64-bit index math); a missing column (-1) reads nothing.
#pragma unroll
    for (int r0 = 0; r0 < Sh::kStageRows; r0 += kRowsPerPass) {
      if (r0 + prow < nrows) {
        const int col = cols[r0];
        cp_async16<L1>(rows_at + r0 * Sh::kRowStride, row_address(xh, max(col, 0), row_bytes32),
                       col >= 0 ? piece_bytes : 0);
      }
    }
    const T* vh = static_cast<const T*>(p.values) + c.u.h * p.v_head_stride;
    const int* vptr = s_vptr(b);
    const uintptr_t a = reinterpret_cast<uintptr_t>(vh + vptr[lb]);
    const uintptr_t lo = a & ~uintptr_t(3);
    const uintptr_t hi = reinterpret_cast<uintptr_t>(vh + vptr[lb + nb]);
    const int words = int((hi - lo + 3) / 4);
    const uint32_t vals_at = shared_addr(st + Sh::kStageRows * Sh::kRowStride);
    for (int i = lane; i < words; i += 32) {
      const uintptr_t src = lo + 4 * uintptr_t(i);
      cp_async4(vals_at + 4 * i, reinterpret_cast<const void*>(src),
                v_end - src < 4 ? int(v_end - src) : 4);
    }
  };

  // Accumulates stage q of chunk c (metadata in buffer b, data in ring slot rs).
  auto compute = [&](const Chunk& c, int b, int q, int rs, float (&acc)[MT][4]) {
    const unsigned char* st = ring + rs * Sh::kStageBytes;
    const int lb = q * Sh::kStageBlocks;
    const int nb = min(Sh::kStageBlocks, c.c1 - c.c0 - lb);
    const uint64_t* bits = s_bits(b);
    const int* vptr = s_vptr(b);
    const T* vh = static_cast<const T*>(p.values) + c.u.h * p.v_head_stride;
    const T* sv = reinterpret_cast<const T*>(st + Sh::kStageRows * Sh::kRowStride);
    const uintptr_t va = reinterpret_cast<uintptr_t>(vh + vptr[lb]);
    const int vshift = int((va & 3) / sizeof(T)) - vptr[lb];  // value index -> slot
    if constexpr (kTf32) {
      for (int kb = 0; kb < nb; ++kb) {
        const uint64_t bb = bits[lb + kb];
        const int vb = vptr[lb + kb] + vshift;
        const uint32_t lo_w = uint32_t(bb), hi_w = uint32_t(bb >> 32);
        const uint32_t m = (1u << q32) - 1u;
        const float v0 = (lo_w >> q32) & 1u ? sv[vb + __popc(lo_w & m)] : 0.f;
        const float v1 = (hi_w >> q32) & 1u ? sv[vb + __popc(lo_w) + __popc(hi_w & m)] : 0.f;
        const uint32_t bw[2] = {to_tf32(v0), to_tf32(v1)};
        // One 16-byte load per row covers two m16 tiles: features 32j + 4g + {0, 1} are tile
        // 2j's rows g, g+8 and + {2, 3} tile 2j+1's (the epilogue undoes this order), so a
        // lane reads 4 consecutive floats of condensed columns t and t+4 (v9 read them singly).
        const float4* x0 = reinterpret_cast<const float4*>(st + (kb * 8 + t) * Sh::kRowStride);
        const float4* x1 = reinterpret_cast<const float4*>(st + (kb * 8 + t + 4) * Sh::kRowStride);
#pragma unroll
        for (int j = 0; j < MT / 2; ++j) {
          const float4 u0 = x0[8 * j + g], u1 = x1[8 * j + g];
          const uint32_t a0[4] = {to_tf32(u0.x), to_tf32(u0.y), to_tf32(u1.x), to_tf32(u1.y)};
          const uint32_t a1[4] = {to_tf32(u0.z), to_tf32(u0.w), to_tf32(u1.z), to_tf32(u1.w)};
          mma_1688_tf32(acc[2 * j], a0, bw);
          mma_1688_tf32(acc[2 * j + 1], a1, bw);
        }
      }
    } else {
      const uint16_t* sv16 = reinterpret_cast<const uint16_t*>(sv);
      for (int kb = 0; kb < nb; kb += 2) {
        const bool two = kb + 1 < nb;
        const uint32_t bw[2] = {
            block_pair16(bits[lb + kb], sv16, vptr[lb + kb] + vshift, q16, hi16),
            two ? block_pair16(bits[lb + kb + 1], sv16, vptr[lb + kb + 1] + vshift, q16, hi16)
                : 0u};
        // Lanes 0-7: rows k0..k0+7, features 16i..; 8-15: features +8; 16-31: rows +8.
        const uint32_t a_at = shared_addr(st) +
                              (kb * 8 + (lane & 7) + ((lane >> 4) & 1) * 8) * Sh::kRowStride +
                              ((lane >> 3) & 1) * 16;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          uint32_t af[4];
          ldmatrix_x4_trans(af, a_at + 32 * i);
          mma_16816(acc[i], af, bw, T{});
        }
      }
    }
  };

  Chunk cur, nxt;
  if (!next_unit(cur.u)) return;
  cur.c0 = cur.u.b0;
  cur.c1 = min(cur.u.b1, cur.c0 + Sh::kMetaBlocks);
  ChunkMeta meta;  // the metadata of the chunk whose first stage is issued next
  load_meta(p, cur, meta);
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  int buf = 0, rs = 0;     // cur's metadata buffer; the ring slot of cur's next stage
  bool issued = false;     // cur's first stage is already in flight
  for (;;) {
    const int nstage = (cur.c1 - cur.c0 + Sh::kStageBlocks - 1) / Sh::kStageBlocks;
    if (!issued && nstage > 0) {
      store_meta(meta, buf);
      __syncwarp();
      issue(cur, buf, 0, rs);
      cp_async_commit();
    }
    const bool more = next_chunk(cur, nxt);
    if (more) load_meta(p, nxt, meta);  // in registers until nxt's first stage is issued
    issued = false;
    for (int q = 0; q < nstage; ++q) {
      if (q + 1 < nstage) {
        issue(cur, buf, q + 1, rs ^ 1);
      } else if (more && nxt.c1 > nxt.c0) {
        store_meta(meta, buf ^ 1);  // that buffer's chunk is done
        __syncwarp();
        issue(nxt, buf ^ 1, 0, rs ^ 1);
        issued = true;
      }
      cp_async_commit();
      cp_async_wait<S - 1>();
      __syncwarp();  // every lane's copies of this stage have landed
      compute(cur, buf, q, rs, acc);
      __syncwarp();  // every lane is done with this stage before it is refilled
      rs ^= 1;
    }
    if (cur.c1 == cur.u.b1) {
      // Epilogue: C fragment (feature 16i+g (+8), rows 2t, 2t+1) -> [8][SLAB] fp32 tile in the
      // slot consumed last (the other may hold nxt's first stage) -> stores or atomics.
      float* tile = reinterpret_cast<float*>(ring + (rs ^ 1) * Sh::kStageBytes);
      if constexpr (kTf32) {
        // Tile pair j holds features 32j + 4g + {0: 2j row g, 1: 2j row g+8, 2, 3: 2j+1's}.
#pragma unroll
        for (int j = 0; j < MT / 2; ++j) {
          const float* a = acc[2 * j];
          const float* b = acc[2 * j + 1];
          *reinterpret_cast<float4*>(tile + (2 * t) * SO + 32 * j + 4 * g) =
              make_float4(a[0], a[2], b[0], b[2]);
          *reinterpret_cast<float4*>(tile + (2 * t + 1) * SO + 32 * j + 4 * g) =
              make_float4(a[1], a[3], b[1], b[3]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          tile[(2 * t) * SO + 16 * i + g] = acc[i][0];
          tile[(2 * t + 1) * SO + 16 * i + g] = acc[i][1];
          tile[(2 * t) * SO + 16 * i + g + 8] = acc[i][2];
          tile[(2 * t + 1) * SO + 16 * i + g + 8] = acc[i][3];
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      __syncwarp();
      const Unit& u = cur.u;
      finish_tile<T, SLAB, SO>(p, u.h, u.w, u.slab, int64_t(u.slab) * SLAB, tile, u.slot,
                               u.b1 - u.b0, u.wend - u.wb);
      __syncwarp();  // the tile is read before the slot is refilled
    }
    if (!more) break;
    cur = nxt;
    buf ^= 1;
  }
#endif
}

// Exact fp32 SpMM on CUDA cores: a warp owns an item and 128 features (4 per lane).
__global__ void __launch_bounds__(kWarps * 32) spmm_f32_exact(const SpmmParams p) {
  const int lane = threadIdx.x & 31;
  Unit wi;
  if (!warp_item(p, kWarps, wi)) return;
  const int w = wi.w, b0 = wi.b0, b1 = wi.b1, slab = wi.slab, slot = wi.slot;
  const int wb = wi.wb, cb = wi.cb, ncols_w = wi.ncols;
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
    finish<float, 8, 4>(p, h, w, slab, f, rows, acc, slot, b1 - b0, wi.wend - wb);
  }
}

// ---- CUDA-core SpMM on the row view (row_view.cuh), the default for sparse blocks ------------
// A group of L lanes owns a slab of L*E features (E = 16 bytes of T per lane) of a work item;
// every lane of the group reads a batch's U entries itself (load_entries), then issues U gathers
// before their U FMAs, so each lane keeps U 16-byte loads in flight with <= 64 registers
// (U = 4): 32 warps per SM, which is what the gather-bound case needs (NOTES: the
// tensor-core kernel's 8 warps/SM drew half the L2 rate XLA's segment_sum draws). fp32 is
// computed exactly (no tf32). A row longer than a piece is a CTA item: the CTA's groups split its
// entries and their sums meet in shared memory, so a graph without very long rows takes one
// launch and no workspace. Only a row cut into several CTA items (slot >= 0) adds the CTAs'
// sums into a workspace slot, where a countdown (set by row_split_prep) elects the CTA that
// writes the row.

struct RowSplit {
  float* ws;   // [slots, heads, d] fp32 partial sums of rows cut into several CTA items
  int* count;  // [slots, heads, nslab] CTA items still to add
};

// Counts each slotted row's items into its countdowns (zeroed before; slotted items are a prefix).
__global__ void row_split_prep(const RowView rv, const RowSplit rs, int per_slot) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < rv.num_items;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int slot = rv.sched[s].w;
    if (slot < 0) return;
    for (int j = 0; j < per_slot; ++j) atomicAdd(rs.count + int64_t(slot) * per_slot + j, 1);
  }
}

// Issues the gathers of the first n entries: the lane's E features of each entry's X row and the
// entry's raw value. Invalid entries read zeros.
template <class T, int E, bool VEC, int U>
__device__ __forceinline__ void gather_entries(const LaneRows<T, E, VEC>& x, const T* vh,
                                               const int2 (&en)[U], int n,
                                               uint32_t (&xw)[U][Words<T, E>::N],
                                               uint32_t (&vr)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = u < n;
    vr[u] = load_raw_if<T>(ok, reinterpret_cast<const T*>(reinterpret_cast<const char*>(vh) +
                                                          row_offset(en[u].y, sizeof(T))));
    x.gather(ok, en[u].x, xw[u]);
  }
}

// acc += value * row for each gathered entry (exact float32 math; zeros add nothing).
template <class T, int E, int U>
__device__ __forceinline__ void add_products(const uint32_t (&xw)[U][Words<T, E>::N],
                                             const uint32_t (&vr)[U], float (&acc)[E]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float a = raw_to_f32<T>(vr[u]);
    float x[E];
    unpack_words<T, E>(xw[u], x);
#pragma unroll
    for (int k = 0; k < E; ++k) acc[k] = fmaf(a, x[k], acc[k]);
  }
}

// UNROLL: gathers in flight per lane (8: ~105 registers, 16 warps/SM; 4 with a 64-register
// cap: 32 warps/SM). VEC: rows are 16-byte aligned (SpmmParams::vec).
template <class T, int L, int UNROLL, bool VEC>
__global__ void __launch_bounds__(kRowThreads, UNROLL <= 4 ? 4 : 1)
    spmm_rows(const SpmmParams p, const RowView rv, const RowSplit rs) {
  constexpr int E = kRowVec<T>, NG = kRowThreads / L, F = L * E, NW = Words<T, E>::N;
  constexpr int U = UNROLL;
  constexpr int U1 = U < 2 ? U : 2;  // CTA items: fewer gathers per lane, no spills (64 registers)
  __shared__ float part[NG * F];  // CTA items: each group's sums over the slab's F features
  __shared__ int last;
  const int li = threadIdx.x % L, g = threadIdx.x / L;  // lane in group, group in CTA
  const int slab = blockIdx.y, h = blockIdx.z;
  const int64_t f0 = int64_t(slab) * F, f = f0 + int64_t(li) * E;
  const LaneRows<T, E, VEC> x(static_cast<const T*>(p.x) + h * p.x_head_stride, f, p.d);
  const bool active = x.active;
  const T* vh = opaque(static_cast<const T*>(p.values) + h * p.v_head_stride);

  // CTA items (the schedule's prefix), CTA-strided: group g takes the g-th of NG equal shares of
  // the entries; thread t then sums feature f0 + t over the groups.
  for (int64_t c = blockIdx.x; c < rv.num_items; c += gridDim.x) {
    const int4 it = rv.sched[c];
    if (it.w == kWholeRow) break;
    const int2 share = cta_share(it.y, it.z, NG, g, 1);
    float acc[E];
#pragma unroll
    for (int k = 0; k < E; ++k) acc[k] = 0.f;
    int2 en[U1];
    int n = load_entries<U1>(rv.entries, share.x, share.y, en);
    for (int k = share.x; k < share.y; k += U1) {
      uint32_t xw[U1][NW], vr[U1];
      gather_entries<T, E, VEC, U1>(x, vh, en, active ? n : 0, xw, vr);
      n = load_entries<U1>(rv.entries, k + U1, share.y, en);
      add_products<T, E, U1>(xw, vr, acc);
    }
#pragma unroll
    for (int k = 0; k < E; ++k) part[g * F + li * E + k] = acc[k];
    __syncthreads();
    T* out = static_cast<T*>(p.out) + (int64_t(h) * p.m + it.x) * p.d;
    float* ws = it.w >= 0 ? rs.ws + (int64_t(it.w) * p.heads + h) * p.d : nullptr;
    for (int t = threadIdx.x; t < F && f0 + t < p.d; t += kRowThreads) {
      float s = 0.f;
      for (int q = 0; q < NG; ++q) s += part[q * F + t];
      if (ws) atomicAdd(ws + f0 + t, s);
      else out[f0 + t] = from_f32<T>(s);
    }
    if (ws) {  // the fences order this CTA's sums before its count, the last CTA's reads after
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0)
        last = atomicSub(rs.count + (int64_t(it.w) * p.heads + h) * p.nslab + slab, 1) == 1;
      __syncthreads();
      if (last) {
        __threadfence();
        for (int t = threadIdx.x; t < F && f0 + t < p.d; t += kRowThreads)
          out[f0 + t] = from_f32<T>(__ldcg(ws + f0 + t));
      }
    }
    __syncthreads();  // part and last are reused
  }

  // Whole rows: groups stride over the items after the prefix (persistent where the grid is
  // capped). A group walks its items as one stream of batches of U entries: while a batch's
  // gathers are in flight it loads the next batch's entries, from the same row or the first of
  // its next item (whose schedule entry was loaded when the current item began), so no batch
  // waits on a metadata round trip, not even an item's first.
  // Item indices fit in int: a row's entries are addressed by int (format.h).
  const int items = int(rv.num_items), stride = int(gridDim.x) * NG;
  int item = int(blockIdx.x) * NG + g;
  int4 it = item < items ? rv.sched[item] : make_int4(0, 0, 0, kWholeRow);
  while (item < items && it.w != kWholeRow) {
    item += stride;
    if (item < items) it = rv.sched[item];
  }
  if (item >= items) return;
  int row = it.x, end = it.z;  // the current item
  int3 next = make_int3(0, 0, 0);  // the next item's row, begin, end (empty past the last)
  if (item + stride < items) {
    const int4 n = rv.sched[item + stride];
    next = make_int3(n.x, n.y, n.z);
  }
  float acc[E];
#pragma unroll
  for (int k = 0; k < E; ++k) acc[k] = 0.f;
  int k = it.y;
  int2 en[U];
  int n = load_entries<U>(rv.entries, k, end, en);
  while (true) {
    uint32_t xw[U][NW], vr[U];
    gather_entries<T, E, VEC, U>(x, vh, en, active ? n : 0, xw, vr);
    const bool row_done = k + U >= end;
    k = row_done ? next.y : k + U;
    n = load_entries<U>(rv.entries, k, row_done ? next.z : end, en);
    add_products<T, E, U>(xw, vr, acc);
    if (row_done) {
      if (active)
        store_row<T, E>(static_cast<T*>(p.out) + (int64_t(h) * p.m + row) * p.d, f, p.d, VEC, acc);
#pragma unroll
      for (int q = 0; q < E; ++q) acc[q] = 0.f;
      item += stride;
      if (item >= items) break;
      row = next.x;
      end = next.z;
      next = make_int3(0, 0, 0);
      if (item + stride < items) {
        const int4 n = rv.sched[item + stride];
        next = make_int3(n.x, n.y, n.z);
      }
    }
  }
}

template <class T, int MT>
void launch_tc(const SpmmParams& p, dim3 grid, cudaStream_t stream) {
  spmm_tc<T, MT, sizeof(T) == 2 ? 4 : 1><<<grid, kWarps * 32, 0, stream>>>(p);
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

// Pipelined kernel configuration, with switches read per launch (benchmarks and tests): slab
// width by d (64 features for 16-bit d > 64 with JAXSPARSE_TC_SPMM_SLAB=64), L1-allocating
// gathers (JAXSPARSE_TC_SPMM_L1=0|1), persistent warps (JAXSPARSE_TC_SPMM_PERSIST=0: one unit
// per warp, as v8). Defaults: docs/NOTES.md.
struct AsyncConfig {
  int slab;
  bool l1, persist;
};
template <class T>
AsyncConfig async_config(int64_t d) {
  int slab = d <= 32 ? 32 : d <= 64 || sizeof(T) == 4 ? 64 : 128;
  if (env_int("JAXSPARSE_TC_SPMM_SLAB", 128) == 64 && slab > 64) slab = 64;
  return {slab, env_int("JAXSPARSE_TC_SPMM_L1", 1) != 0,
          env_int("JAXSPARSE_TC_SPMM_PERSIST", 1) != 0};
}

constexpr int kAsyncWarps = 2;  // warps per CTA (each warp owns its shared-memory ring)

template <class T, int SLAB, bool L1>
void launch_async_shape(const SpmmParams& p, bool persist, cudaStream_t stream) {
  using Sh = AsyncShape<T, SLAB, kAsyncWarps>;
  auto kernel = spmm_async<T, SLAB, kAsyncWarps, L1>;
  const int ctas = resident_ctas<spmm_async<T, SLAB, kAsyncWarps, L1>>(kAsyncWarps * 32,
                                                                       Sh::kCtaBytes);
  if (ctas == 0) persist = false;
  const int64_t units = int64_t(p.heads) * p.num_items * p.nslab;
  int64_t grid = (units + kAsyncWarps - 1) / kAsyncWarps;
  grid = std::min<int64_t>(grid, persist ? ctas : 0x7fffffff);
  kernel<<<unsigned(grid), kAsyncWarps * 32, Sh::kCtaBytes, stream>>>(p);
}

template <class T, int SLAB>
void launch_async_l1(const SpmmParams& p, const AsyncConfig& c, cudaStream_t stream) {
  if (c.l1) launch_async_shape<T, SLAB, true>(p, c.persist, stream);
  else launch_async_shape<T, SLAB, false>(p, c.persist, stream);
}

template <class T>
void launch_async(const SpmmParams& p, const AsyncConfig& c, cudaStream_t stream) {
  if (c.slab == 32) launch_async_l1<T, 32>(p, c, stream);
  else if (c.slab == 64) launch_async_l1<T, 64>(p, c, stream);
  else if constexpr (sizeof(T) == 2) launch_async_l1<T, 128>(p, c, stream);
}

// Row-kernel grid: groups stride over the items, at most as many CTAs as the device holds at
// once (per kernel and device, asked once; JAXSPARSE_TC_ROWS_PERSIST=0: one item per group).
template <class T, int L, int U, bool VEC>
void launch_rows_l(const SpmmParams& p, const RowView& rv, const RowSplit& rs,
                   cudaStream_t stream) {
  auto kernel = spmm_rows<T, L, U, VEC>;
  const int ctas = resident_ctas<spmm_rows<T, L, U, VEC>>(kRowThreads, 0);
  int64_t grid = row_ctas(rv.num_items, kRowThreads / L, ctas, int64_t(p.nslab) * p.heads);
  if (ctas > 0 && env_int("JAXSPARSE_TC_ROWS_PERSIST", 1) != 0) grid = std::min<int64_t>(grid, ctas);
  kernel<<<dim3(unsigned(grid), unsigned(p.nslab), unsigned(p.heads)), kRowThreads, 0, stream>>>(
      p, rv, rs);
}

template <class T, int U>
void launch_rows_u(const SpmmParams& p, const RowView& rv, const RowSplit& rs, int lanes,
                   cudaStream_t stream) {
  with_lanes(lanes, [&](auto l) {
    if (p.vec) launch_rows_l<T, l.value, U, true>(p, rv, rs, stream);
    else launch_rows_l<T, l.value, U, false>(p, rv, rs, stream);
  });
}

// JAXSPARSE_TC_ROWS_UNROLL=4|8: gathers in flight per lane (default: docs/NOTES.md).
template <class T>
void launch_rows(const SpmmParams& p, const RowView& rv, const RowSplit& rs, int lanes,
                 cudaStream_t stream) {
  if (env_int("JAXSPARSE_TC_ROWS_UNROLL", 4) == 8) launch_rows_u<T, 8>(p, rv, rs, lanes, stream);
  else launch_rows_u<T, 4>(p, rv, rs, lanes, stream);
}

// Kernel family for a launch. The CUDA-core row kernels gather the same dense rows as the
// tensor-core ones (one per condensed column) but pay only for the nonzeros, with many more
// warps per SM; the tensor-core kernels pay for all 64 entries of a block. So the row kernels
// serve where blocks are sparse (sparse_blocks), and exact fp32 (CUDA-core FMAs either way).
constexpr int64_t kRowWorkspaceBytes = 256 << 20;  // row kernels: cap on the slotted rows' workspace

bool prefer_rows(bool exact_f32, int64_t nnz, int64_t num_blocks) {
  return exact_f32 || sparse_blocks(nnz, num_blocks);
}

// A SpMM launch's shapes (what plan_spmm reads) and its plan.
struct SpmmShape {
  int esize;   // bytes per element of X
  bool exact;  // float32 with precision="highest"
  int64_t nnz, num_blocks, num_items, num_windows, row_items, m, d, heads;
};

struct SpmmPlan {
  std::string variant;  // JAXSPARSE_TC_SPMM_VARIANT ("" for auto)
  bool rows;            // the CUDA-core row kernels (else the window kernels)
  int lanes, row_nslab;
  int64_t row_slots;
  size_t row_ws_bytes;     // row kernels: the slots' fp32 sums, then their countdowns
  size_t workspace_bytes;  // the workspace result's size
};

// Window kernels' workspace for `nslab` feature slabs: split windows' fp32 sums (cap slots),
// their block counters, and each window's slot.
struct WindowWorkspace {
  int64_t cap;
  size_t ws_bytes, done_bytes, slot_bytes;
  size_t total() const { return ws_bytes + done_bytes + slot_bytes; }
};

WindowWorkspace window_workspace(const SpmmShape& s, int nslab) {
  const int64_t per_slot = s.heads * kWindowRows * s.d * 4 + s.heads * nslab * 4;
  WindowWorkspace w{};
  w.cap = std::min<int64_t>(s.num_items, std::max<int64_t>(1, kWorkspaceBytes / per_slot));
  w.ws_bytes = size_t(w.cap * s.heads * kWindowRows * s.d) * 4;
  w.done_bytes = size_t(w.cap * s.heads * nslab) * 4;
  w.slot_bytes = size_t(std::max<int64_t>(s.num_windows, 1)) * 4;
  return w;
}

// Slabs of the window kernels: exact fp32 128 features, the pipelined kernel its slab, the
// register-gather kernel 16 * mt.
int tc_mt(int64_t d) { return d <= 16 ? 1 : d <= 32 ? 2 : 4; }
int window_nslab(const SpmmShape& s, bool use_async, int async_slab) {
  const int64_t slab = s.exact ? 128 : use_async ? async_slab : 16 * tc_mt(s.d);
  return int((s.d + slab - 1) / slab);
}

// The launch a SpMM makes, from its shapes and the switches alone. Kernel family
// (JAXSPARSE_TC_SPMM_VARIANT, for tests and benchmarks): unset or auto, prefer_rows picks;
// cuda_core forces the row kernels; async forces the pipelined tensor-core kernel (where it
// applies; exact fp32: spmm_f32_exact); tc forces the register-gather tensor-core kernel
// (spmm_tc; exact fp32: spmm_f32_exact). The row kernels need a workspace only for rows cut into
// several CTA items (slots <= items - rows: every such row adds at least one item); the window
// kernels size theirs for either of their slab widths, since which one runs depends on the
// operands' alignment, known only at run time.
ffi::Error plan_spmm(const SpmmShape& s, SpmmPlan& plan) {
  std::string variant;
  if (auto err = kernel_variant("spmm", "JAXSPARSE_TC_SPMM_VARIANT", {"cuda_core", "async", "tc"},
                                variant);
      err.failure())
    return err;
  plan = SpmmPlan{};
  plan.variant = variant;
  plan.lanes = s.esize == 4 ? row_lanes<float>(s.d) : row_lanes<__half>(s.d);
  const int64_t row_slab = int64_t(plan.lanes) * (16 / s.esize);
  plan.row_nslab = int((s.d + row_slab - 1) / row_slab);
  plan.row_slots = std::max<int64_t>(s.row_items - s.m, 0);
  plan.row_ws_bytes = size_t(plan.row_slots * s.heads * s.d) * 4;
  const size_t row_bytes =
      plan.row_ws_bytes + size_t(plan.row_slots * s.heads * plan.row_nslab) * 4;
  const bool rows_fit =
      row_bytes <= size_t(kRowWorkspaceBytes) && s.d * int64_t(s.esize) <= INT32_MAX;
  if (variant == "cuda_core" && !rows_fit)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "spmm: the row kernels' workspace for very long rows would exceed its cap");
  plan.rows = rows_fit && (variant == "cuda_core" ||
                           (variant.empty() && prefer_rows(s.exact, s.nnz, s.num_blocks)));
  if (plan.rows) {
    plan.workspace_bytes = row_bytes;
  } else {
    const int slab = s.esize == 4 ? async_config<float>(s.d).slab : async_config<__half>(s.d).slab;
    plan.workspace_bytes = std::max(window_workspace(s, window_nslab(s, false, slab)).total(),
                                    window_workspace(s, window_nslab(s, true, slab)).total());
  }
  return ffi::Error::Success();
}

ffi::Error spmm_cuda(cudaStream_t stream, ffi::AnyBuffer values, ffi::AnyBuffer x, I32 wcp,
                     I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 row_entries,
                     I32 row_schedule, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> workspace, int32_t precision) {
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
  static_cast<KernelPattern&>(p) = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule);
  const RowView rv = row_view(row_entries, row_schedule);
  p.nnz = vd[1];
  p.n = xd[1];
  p.d = xd[2];
  p.m = od[1];
  const int64_t heads = od[0];
  p.heads = int(heads);
  p.v_head_stride = vd[0] == 1 ? 0 : p.nnz;
  p.x_head_stride = xd[0] == 1 ? 0 : p.n * p.d;
  if (heads == 0 || p.m == 0 || p.d == 0 || p.num_items == 0) return ffi::Error::Success();
  if (heads > 65535) return ffi::Error::InvalidArgument("spmm: at most 65535 heads");

  const bool exact = dtype == ffi::DataType::F32 && precision == 1;
  const int esize = dtype == ffi::DataType::F32 ? 4 : 2;
  const SpmmShape shape{esize, exact, p.nnz, int64_t(bitmap.element_count()) / 2, p.num_items,
                        int64_t(wcp.element_count()) - 1, rv.num_items, p.m, p.d, heads};
  SpmmPlan plan;
  if (auto err = plan_spmm(shape, plan); err.failure()) return err;
  char* const ws = static_cast<char*>(workspace->untyped_data());
  if (workspace->size_bytes() < plan.workspace_bytes)
    return ffi::Error::InvalidArgument(
        "spmm: workspace smaller than the launch needs (a JAXSPARSE_TC_* switch changed after "
        "the program was compiled?)");
  const bool aligned16 = (p.d * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(p.out) % 16 == 0;

  if (plan.rows) {
    p.nslab = plan.row_nslab;
    p.vec = aligned16;
    RowSplit rs{};
    if (plan.row_slots > 0) {
      rs.ws = reinterpret_cast<float*>(ws);
      rs.count = reinterpret_cast<int*>(ws + plan.row_ws_bytes);
      if (cudaMemsetAsync(ws, 0, plan.workspace_bytes, stream) != cudaSuccess)
        return ffi::Error::Internal("spmm: workspace memset failed");
      const int64_t blocks = std::min<int64_t>((rv.num_items + 255) / 256, 1024);
      row_split_prep<<<unsigned(blocks), 256, 0, stream>>>(rv, rs, int(heads) * plan.row_nslab);
    }
    if (dtype == ffi::DataType::F32) launch_rows<float>(p, rv, rs, plan.lanes, stream);
    else if (dtype == ffi::DataType::F16) launch_rows<__half>(p, rv, rs, plan.lanes, stream);
    else launch_rows<__nv_bfloat16>(p, rv, rs, plan.lanes, stream);
    return launch_status("spmm");
  }

  const int mt = tc_mt(p.d);
  // The pipelined kernel is the default tensor-core path where its 16-byte copies apply.
  const bool use_async = !exact && plan.variant != "tc" && device_is_sm90_or_later() &&
                         (p.d * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                         p.d * int64_t(esize) <= INT32_MAX;
  AsyncConfig ac{};
  if (use_async)
    ac = dtype == ffi::DataType::F32 ? async_config<float>(p.d) : async_config<__half>(p.d);
  p.nslab = window_nslab(shape, use_async, ac.slab);
  // Split-window workspace: slot = schedule index of a window's first piece, capped.
  const WindowWorkspace w = window_workspace(shape, p.nslab);
  p.cap = w.cap;
  p.ws = reinterpret_cast<float*>(ws);
  p.done = reinterpret_cast<int*>(ws + w.ws_bytes);
  p.slot_of = reinterpret_cast<int*>(ws + w.ws_bytes + w.done_bytes);
  split_prep<<<unsigned(std::min<int64_t>(p.num_items, 264)), 256, 0, stream>>>(p);

  if (use_async) {
    p.vec = p.d % (ac.slab / 8) == 0;
    if (dtype == ffi::DataType::F32) launch_async<float>(p, ac, stream);
    else if (dtype == ffi::DataType::F16) launch_async<__half>(p, ac, stream);
    else launch_async<__nv_bfloat16>(p, ac, stream);
  } else if (exact) {
    p.vec = p.d % 4 == 0;
    const int64_t warps = p.num_items * p.nslab;
    const dim3 grid(unsigned((warps + kWarps - 1) / kWarps), unsigned(std::min<int64_t>(heads, 65535)));
    spmm_f32_exact<<<grid, kWarps * 32, 0, stream>>>(p);
  } else if (dtype == ffi::DataType::F32) {
    launch_tc_mt<float>(p, mt, p.num_items, p.heads, stream);
  } else if (dtype == ffi::DataType::F16) {
    launch_tc_mt<__half>(p, mt, p.num_items, p.heads, stream);
  } else {
    launch_tc_mt<__nv_bfloat16>(p, mt, p.num_items, p.heads, stream);
  }
  return launch_status("spmm");
}

}  // namespace

int64_t spmm_workspace_bytes(int esize, bool exact, int64_t nnz, int64_t num_blocks,
                             int64_t num_items, int64_t num_windows, int64_t row_items, int64_t m,
                             int64_t d, int64_t heads, std::string* error) {
  SpmmPlan plan;
  const ffi::Error err = plan_spmm(
      {esize, exact, nnz, num_blocks, num_items, num_windows, row_items, m, d, heads}, plan);
  if (err.failure()) {
    *error = err.message();
    return -1;
  }
  return int64_t(plan.workspace_bytes);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCuda, spmm_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // values [Hv, nnz]
                                  .Arg<ffi::AnyBuffer>()  // x [Hx, n, d]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  JAXSPARSE_TC_ROW_VIEW_ARGS
                                  .Ret<ffi::AnyBuffer>()  // out [H, m, d]
                                  .Ret<ffi::AnyBuffer>()  // workspace [bytes] (plan_spmm)
                                  .Attr<int32_t>("precision"),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
