// Pipelined tensor-core SpMM (spmm_async, sm_90): the window kernel where X rows are 16-byte
// aligned.
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/async_copy.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/spmm/params.cuh"

namespace jaxsparse_tc {
namespace spmm {

// Same MMA scheme as spmm_tc, but gathered X rows never pass through registers: the warp
// copies them with cp.async (16 bytes per lane, zero-filled for missing columns, L1-allocating so
// hub rows hit there) into a ring of two shared-memory stages (16 or 32 rows = 2 or 4 blocks, plus
// the stage's values), so one stage is in flight while it computes on the other; MMA operands come
// from shared memory by ldmatrix.trans (fp16, bf16) or shared loads (tf32).
// Persistent warps: a warp walks a strided sequence of units (item, head, slab) as one stream of
// stages. Unit descriptors are decoded 32 at a time (lane j holds the warp's unit j), a chunk's
// metadata (<= 32 blocks: bitmaps, value offsets, column indices) is loaded into registers one
// chunk ahead and written to the other of two shared buffers just before the chunk's first stage
// is issued, and that first stage is issued during the previous chunk's last one, so neither
// metadata nor the first gathers of an item wait a memory round trip (one unit per warp paid two
// per item; measured on H100, rmat17 fp16 d=128: 145.7 us against 152.3). The accumulators leave
// through a shared tile in the stage slot just consumed (finish_tile: row-contiguous stores, or
// 16-byte atomics for split windows). Needs d * sizeof(T) % 16 == 0 and a 16-byte aligned X.
// Tried and slower on H100 (rmat17 fp16 d=128): one TMA bulk copy per gathered row (384 us
// against 214), three stages (260 against 214: fewer warps per SM).
template <class T, int SLAB, int WARPS>
struct AsyncShape {
  static constexpr int kStages = 2;
  static constexpr int kRowBytes = SLAB * int(sizeof(T));  // one gathered slab row, <= 256
  // Padding makes the 8 rows an ldmatrix (or tf32 load) touches hit distinct banks.
  static constexpr int kRowStride = kRowBytes + (sizeof(T) == 4 ? 32 : 16);
  // 256-byte rows (fp16 d >= 128, fp32 slabs of 64) stage 2 blocks at a time: with 4 the
  // shared memory held 10 warps per SM, with 2 the registers hold 14 (H100, comm18-c64-d16 fp16
  // d = 128: 134 us against 161; DD 82 / 94). Narrower rows keep 4: 16-row stages made fp16
  // d = 64 up to 11% slower, their warps being bound by registers already.
  static constexpr int kStageRows = kRowBytes >= 256 ? 16 : 32;  // 8 condensed columns a block
  static constexpr int kStageBlocks = kStageRows / kBlockCols;
  static constexpr int kValBytes = kStageBlocks * 64 * int(sizeof(T)) + 16;
  static constexpr int kStageBytes = kStageRows * kRowStride + kValBytes;
  static constexpr int kMetaBlocks = 32;  // blocks of one chunk (schedule items have <= 32)
  static constexpr int kColsAt = 0, kBitsAt = kMetaBlocks * 8 * 4,
                       kVptrAt = kBitsAt + kMetaBlocks * 8;
  static constexpr int kMetaBytes = kVptrAt + 144;
  static constexpr int kWarpBytes = 2 * kMetaBytes + kStages * kStageBytes;
  static constexpr int kCtaBytes = WARPS * kWarpBytes;
  static_assert(kRowBytes % 16 == 0 && kRowBytes <= 512, "slab row");
  static_assert(kMetaBlocks % kStageBlocks == 0, "a chunk's stages read only its columns");
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

// Loads a chunk's metadata, columns folded into X's rows. A stage copies its values from
// [vptr of its first block, vptr past its last) and the MMAs read each block's at vptr + a bit's
// rank, so the offsets must lie in [0, nnz], each block's popcount apart: a chunk whose offsets
// do not (a corrupt pattern's) is taken as empty, which keeps both the copies and the shared
// reads inside the stage. One check per chunk of up to 32 blocks.
__device__ __forceinline__ void load_meta(const SpmmParams& p, const Chunk& c, ChunkMeta& m) {
  const int lane = threadIdx.x & 31;
  const int nb = c.c1 - c.c0;  // 0 .. kMetaBlocks
  m.bits = lane < nb ? load_block_bits(p.bitmap, c.c0 + lane) : 0ull;
  m.vptr = lane <= nb ? __ldg(p.bvp + c.c0 + lane) : 0;
  m.vptr_end = nb == 32 ? __ldg(p.bvp + c.c0 + 32) : 0;
  const int col_lo = 8 * (c.c0 - c.u.wb), col_hi = min(8 * (c.c1 - c.u.wb), c.u.ncols);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int i = k * 32 + lane;
    m.cols[k] =
        col_lo + i < col_hi ? clamp_last(__ldg(p.wc + c.u.cb + col_lo + i), p.last_col) : -1;
  }
  const int up = __shfl_down_sync(0xffffffffu, m.vptr, 1);
  const unsigned next = unsigned(lane == 31 ? m.vptr_end : up), nnz = unsigned(p.last_value) + 1u;
  const bool bad = lane < nb && (unsigned(m.vptr) > nnz || next > nnz ||
                                 next - unsigned(m.vptr) != unsigned(__popcll(m.bits)));
  if (__any_sync(0xffffffffu, bad)) {
    m.bits = 0ull;
    m.vptr = m.vptr_end = 0;
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

template <class T, int SLAB, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 1) spmm_async(const SpmmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // tuned for and launched on sm_90+ only (its shared-memory sizes)
#else
  using Sh = AsyncShape<T, SLAB, WARPS>;
  constexpr int S = Sh::kStages;
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int MT = SLAB / 16;  // m16 tiles (16 features each)
  static_assert(!kTf32 || MT % 2 == 0, "tf32 loads cover m16 tiles in pairs");
  constexpr int kPieces = Sh::kRowBytes / 16;               // 16-byte pieces of a slab row
  constexpr int kRowsPerPass = 32 / kPieces;                // rows one warp-wide cp.async covers
  constexpr int kLaneRows = Sh::kStageRows / kRowsPerPass;  // consecutive rows a lane copies
  static_assert(kLaneRows % 4 == 0, "a lane's column indices load as int4");
  constexpr int SO = SLAB + 4;  // epilogue tile row stride (floats)
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wid = threadIdx.x >> 5;
  unsigned char* wsm = smem + wid * Sh::kWarpBytes;
  unsigned char* ring = wsm + 2 * Sh::kMetaBytes;
  auto s_cols = [&](int b) {
    return reinterpret_cast<int*>(wsm + b * Sh::kMetaBytes + Sh::kColsAt);
  };
  auto s_bits = [&](int b) {
    return reinterpret_cast<uint64_t*>(wsm + b * Sh::kMetaBytes + Sh::kBitsAt);
  };
  auto s_vptr = [&](int b) {
    return reinterpret_cast<int*>(wsm + b * Sh::kMetaBytes + Sh::kVptrAt);
  };

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

  // Issues stage q of chunk c (metadata in buffer b) into ring slot rs: all its gathered rows
  // (missing columns, -1 past the chunk's, zero-filled: a partial stage's rows past its blocks
  // are zeros for the MMA's idle half) and the 4-byte words covering its values (the last one
  // clipped to the array's end).
  auto issue = [&](const Chunk& c, int b, int q, int rs) {
    unsigned char* st = ring + rs * Sh::kStageBytes;
    const int lb = q * Sh::kStageBlocks;
    const int nb = min(Sh::kStageBlocks, c.c1 - c.c0 - lb);
    const int64_t f0 = int64_t(c.u.slab) * SLAB;
    const int row_copy = int(p.d - f0 < SLAB ? p.d - f0 : SLAB) * int(sizeof(T));
    const int piece_bytes = max(0, min(16, row_copy - 16 * piece));
    const char* xh = static_cast<const char*>(p.x) +
                     (c.u.h * p.x_head_stride + f0) * int64_t(sizeof(T)) + 16 * piece;
    const int* cols = s_cols(b) + lb * kBlockCols + prow * kLaneRows;
    const uint32_t rows_at = shared_addr(st) + 16 * piece + prow * kLaneRows * Sh::kRowStride;
    // This loop is most of the kernel's instructions: a lane copies kLaneRows consecutive rows,
    // so their column indices come in int4 loads, and each copy is one multiply-add for its
    // address (64-bit index math spent ~20 instructions per copy) and a zero source size for a
    // missing column (-1), which reads nothing.
#pragma unroll
    for (int k0 = 0; k0 < kLaneRows; k0 += 4) {
      const int4 c4 = *reinterpret_cast<const int4*>(cols + k0);
      const int cs[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        cp_async16(rows_at + (k0 + j) * Sh::kRowStride, row_address(xh, max(cs[j], 0), row_bytes32),
                   cs[j] >= 0 ? piece_bytes : 0);
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
        // lane reads 4 consecutive floats of condensed columns t and t+4 (not one at a time).
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
  int buf = 0, rs = 0;  // cur's metadata buffer; the ring slot of cur's next stage
  bool issued = false;  // cur's first stage is already in flight
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

}  // namespace spmm
}  // namespace jaxsparse_tc
