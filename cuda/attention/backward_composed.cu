// CUDA sparse attention backward, edge pass (jaxsparse_tc/_src/attention.py `_backward`). For
// row i of A, head h and each nonzero j of the row, from the forward's saved row log-sum-exp:
//   p_ij = exp(scale q_i.k_j + bias_ij - lse_i)     dp_ij = do_i.v_j     D_i = do_i.o_i
//   ds_ij = p_ij (dp_ij - D_i)
// written in A's format order (dbias, and once permuted to A^T's order the values of the SpMMs
// that give dV = P^T dO and dK = scale dS^T Q; dQ = scale dS K is an SpMM over A). One pass
// gathers k_j and v_j once per nonzero and keeps the per-edge math in registers, where two
// SDDMMs and XLA's fusions passed float32 logits, P, dP and dS through memory.
// (Fusing dQ in as well, which keeps each gathered k_j until ds_ij is known, took 128 registers
// and ran slower than the composed pass.)
//
// Row view and lane layout as the CUDA-core SDDMM (row_view.cuh, plan/row_layout.h): a group of L
// lanes owns a work item, lane li the 16 bytes of features at li * E of q_i, do_i and every
// gathered k_j, v_j (so d, dv <= 32 E). Per batch of U entries each lane issues 2U gathers;
// reduce_many sums the 2U partial dot products over the group and the lane holding entry j fetches
// its two totals and writes p_ij and ds_ij. Entries are independent, so a CTA item's groups just
// take equal shares of its entries.
#include <algorithm>
#include <cstdint>

#include "plan/attention.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"
#include "cuda/common/row_view.cuh"

namespace jaxsparse_tc {
namespace attention {
namespace {

struct BwdParams {
  const void *q, *k, *v, *o, *dout;
  const float* bias;  // [Hb, nnz] float32, or null without one
  const float* lse;
  void *pv, *ds;  // [H, nnz], A's format order
  int64_t m, n, d, dv, nnz;
  int64_t q_hs, k_hs, v_hs, b_hs, o_hs, do_hs, lse_hs;  // head strides, 0 where broadcast
  float scale;
  int heads;
  int min_share;  // fewest entries of a CTA item one group takes (cta_min_share)
  bool vec;       // 16-byte rows: d and dv whole multiples of E, aligned operands
};

// Lane li's slice (E features at f) of a row of d features, as raw words (zeros past d).
template <class T, int E>
__device__ __forceinline__ void row_words(const T* row, int64_t f, int64_t d, bool vec,
                                          uint32_t (&w)[Words<T, E>::N]) {
#pragma unroll
  for (int i = 0; i < Words<T, E>::N; ++i) w[i] = 0u;
  if (f < d) load_row<T, E>(row, f, d, vec, w);
}

// p and ds of entries [b, e) of row `row` (bounds uniform over the group). Every lane of the
// warp calls it together, empty ranges included, and its loops run to the warp's longest range,
// so shuffles take the full mask (with a group's mask each one cost five more instructions of
// convergence checks). Gathers are predicated loads.
template <class T, int L, int U, bool VEC>
__device__ __forceinline__ void row_edges(const BwdParams& p, const RowView& rv, int h, int row,
                                          int b, int e, int li) {
  constexpr int E = kRowVec<T>, NW = Words<T, E>::N;
  const int64_t f = int64_t(li) * E;
  const bool any = b < e;
  // Everything the first batch waits on is requested before any of it is used (an empty range
  // reads nothing: its row width is passed as 0).
  uint32_t qw[NW], dow[NW], ow[NW];
  row_words<T, E>(static_cast<const T*>(p.q) + h * p.q_hs + row * p.d, f, any ? p.d : 0, VEC, qw);
  row_words<T, E>(static_cast<const T*>(p.dout) + h * p.do_hs + row * p.dv, f, any ? p.dv : 0, VEC,
                  dow);
  row_words<T, E>(static_cast<const T*>(p.o) + h * p.o_hs + row * p.dv, f, any ? p.dv : 0, VEC, ow);
  const float lse = any ? p.lse[h * p.lse_hs + row] : 0.f;
  const int n = e - b, nmax = __reduce_max_sync(kFullWarp, n);
  int2 en = clamp_entry(rv, ldg8_if(li < n, rv.entries + b + li));
  float delta = 0.f;
#pragma unroll
  for (int k = 0; k < E; ++k) delta = fmaf(word_elem<T>(dow, k), word_elem<T>(ow, k), delta);
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) delta += __shfl_xor_sync(kFullWarp, delta, o, L);
  const LaneRows<T, E, VEC> kr(static_cast<const T*>(p.k) + h * p.k_hs, f, p.d);
  const LaneRows<T, E, VEC> vr(static_cast<const T*>(p.v) + h * p.v_hs, f, p.dv);
  const float* bh = p.bias + h * p.b_hs;
  T* ph = static_cast<T*>(p.pv) + int64_t(h) * p.nnz;
  T* dsh = static_cast<T*>(p.ds) + int64_t(h) * p.nnz;

  for (int kc = 0; kc < nmax; kc += L) {
    const int cnt = min(L, n - kc);  // this group's entries in the chunk (may be <= 0)
    if (kc != 0) en = clamp_entry(rv, ldg8_if(li < cnt, rv.entries + b + kc + li));
    const float bias = __uint_as_float(load_raw_if<float>(p.bias && li < cnt, bh + en.y));
    for (int j = 0; j < min(L, nmax - kc); j += U) {
      uint32_t kw[U][NW], vw[U][NW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = __shfl_sync(kFullWarp, en.x, j + u, L);
        const bool ok = j + u < cnt;
        kr.gather(ok && kr.active, c, kw[u]);
        vr.gather(ok && vr.active, c, vw[u]);
      }
      // Partial dots: [u] q.k of entry j + u, [U + u] do.v.
      float dots[2 * U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // q and do stay packed (16-bit: half the registers)
        dots[u] = dots[U + u] = 0.f;
#pragma unroll
        for (int k = 0; k < E; ++k) {
          dots[u] = fmaf(word_elem<T>(qw, k), word_elem<T>(kw[u], k), dots[u]);
          dots[U + u] = fmaf(word_elem<T>(dow, k), word_elem<T>(vw[u], k), dots[U + u]);
        }
      }
      // Lane x now holds the total of dots[x / (L / 2U)]; lane j + u (entry j + u's) fetches
      // both of its entry's totals.
      const float tot = reduce_many<L, 2 * U>(dots, kFullWarp, li);
      const int mine = li - j, own = mine >= 0 && mine < U ? mine : 0;
      const float s = __shfl_sync(kFullWarp, tot, own * (L / (2 * U)), L);
      const float dp = __shfl_sync(kFullWarp, tot, (U + own) * (L / (2 * U)), L);
      if (mine >= 0 && mine < U && li < cnt) {
        const float pv = expf(fmaf(p.scale, s, bias) - lse);
        ph[en.y] = from_f32<T>(pv);
        dsh[en.y] = from_f32<T>(pv * (dp - delta));
      }
    }
  }
}

// UNROLL 4: 8 gathers in flight per lane, up to 128 registers (16 warps/SM); UNROLL 2: 4 at 64
// registers (32 warps/SM). VEC: 16-byte rows (BwdParams::vec).
template <class T, int L, int UNROLL, bool VEC>
__global__ void __launch_bounds__(kRowThreads, UNROLL >= 4 ? 2 : 4)
    attention_bwd_edges(const BwdParams p, const RowView rv) {
  constexpr int NG = kRowThreads / L;
  constexpr int U = UNROLL < L / 2 ? UNROLL : L / 2;  // reduce_many: 2U values over L lanes
  const int li = threadIdx.x % L, g = threadIdx.x / L;
  const int h = blockIdx.y;
  // CTA items (the schedule's prefix), CTA-strided: group g takes the g-th share.
  for (int64_t c = blockIdx.x; c < rv.num_items; c += gridDim.x) {
    const int4 it = row_item(rv, c);
    if (it.w == kWholeRowSlot) break;
    const int2 share = cta_share(it.y, it.z, NG, g, p.min_share);
    row_edges<T, L, U, VEC>(p, rv, h, it.x, share.x, share.y, li);
  }
  const int3 it = whole_row_or_empty(rv, int64_t(blockIdx.x) * NG + g);
  row_edges<T, L, U, VEC>(p, rv, h, it.x, it.y, it.z, li);
}

template <class T, int L, int UNROLL, bool VEC>
void launch_k(const BwdParams& p, const RowView& rv, cudaStream_t st) {
  constexpr auto kernel = attention_bwd_edges<T, L, UNROLL, VEC>;
  const int64_t grid =
      row_ctas(rv.num_items, kRowThreads / L, resident_ctas<kernel>(kRowThreads, 0), p.heads);
  kernel<<<dim3(unsigned(grid), unsigned(p.heads)), kRowThreads, 0, st>>>(p, rv);
}

template <class T, int L>
void launch_l(const BwdParams& p, const RowView& rv, cudaStream_t st) {
  const bool u2 = attention_bwd_unroll(p.nnz) == 2;  // entries per batch (plan/attention.h)
  if (u2 && p.vec)
    launch_k<T, L, 2, true>(p, rv, st);
  else if (u2)
    launch_k<T, L, 2, false>(p, rv, st);
  else if (p.vec)
    launch_k<T, L, 4, true>(p, rv, st);
  else
    launch_k<T, L, 4, false>(p, rv, st);
}

template <class T>
void launch(const BwdParams& p, const RowView& rv, cudaStream_t st) {
  with_lanes(row_lanes<T>(std::max(p.d, p.dv)), [&](auto l) { launch_l<T, l.value>(p, rv, st); });
}

int64_t head_stride(int64_t count, int64_t size) {
  return count == 1 ? 0 : size;
}

ffi::Error attention_bwd_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::Buffer<ffi::F32> bias, ffi::AnyBuffer o,
                              ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, I32 row_entries,
                              I32 row_schedule, ffi::Result<ffi::AnyBuffer> pv,
                              ffi::Result<ffi::AnyBuffer> ds, float scale, int32_t has_bias) {
  if (auto err =
          check_aligned("attention backward",
                        {operand("q", q), operand("k", k), operand("v", v), operand("bias", bias),
                         operand("o", o), operand("lse", lse), operand("dout", dout),
                         operand("row_entries", row_entries), operand("row_schedule", row_schedule),
                         operand("pv", *pv), operand("ds", *ds)});
      err.failure())
    return err;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  const auto pd = pv->dimensions();
  const auto dtype = q.element_type();
  for (ffi::DataType t : {k.element_type(), v.element_type(), o.element_type(), dout.element_type(),
                          pv->element_type(), ds->element_type()})
    if (t != dtype) return ffi::Error::InvalidArgument("attention backward: mixed dtypes");
  BwdParams p{};
  p.heads = int(pd[0]);
  p.m = qd[1];
  p.d = qd[2];
  p.n = kd[1];
  p.dv = vd[2];
  p.nnz = pd[1];
  const int64_t esize = dtype == ffi::DataType::F32 ? 4 : 2;
  // This kernel is the composed backward's edge pass where the plan makes it so.
  AttentionBwdPlan plan;
  if (auto err = plan_attention_backward({int(esize), p.d, p.dv, {}},
                                         int64_t(AttentionBackward::kComposed), plan);
      err.failure())
    return err;
  if (!plan.edge_kernel)
    return ffi::Error::InvalidArgument("attention backward: d, dv past 512 bytes of a row");
  if (pd[0] > 65535) return ffi::Error::InvalidArgument("attention backward: at most 65535 heads");
  if (pd[0] == 0 || p.nnz == 0) return ffi::Error::Success();
  // The bias has the pattern's positions (the entries' positions fold into them).
  if (has_bias && bias.dimensions()[1] != p.nnz)
    return ffi::Error::InvalidArgument("attention backward: bias must have the pattern's nnz");
  // Entries gather K's and V's rows and address p, ds and the bias by position; rows read Q's.
  const RowView rv = row_view(row_entries, row_schedule, p.m, p.n, p.nnz);
  if (rv.num_items == 0) {  // no row (or no K row) for the entries to come from: zeros
    const size_t bytes = size_t(pd[0] * p.nnz) * esize;
    if (cudaMemsetAsync(pv->untyped_data(), 0, bytes, st) != cudaSuccess ||
        cudaMemsetAsync(ds->untyped_data(), 0, bytes, st) != cudaSuccess)
      return ffi::Error::Internal("attention backward: memset failed");
    return ffi::Error::Success();
  }
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.bias = has_bias ? bias.typed_data() : nullptr;
  p.o = o.untyped_data();
  p.dout = dout.untyped_data();
  p.lse = lse.typed_data();
  p.pv = pv->untyped_data();
  p.ds = ds->untyped_data();
  p.q_hs = head_stride(qd[0], p.m * p.d);
  p.k_hs = head_stride(kd[0], p.n * p.d);
  p.v_hs = head_stride(vd[0], p.n * p.dv);
  p.b_hs = head_stride(bias.dimensions()[0], p.nnz);
  p.o_hs = head_stride(o.dimensions()[0], p.m * p.dv);
  p.do_hs = head_stride(dout.dimensions()[0], p.m * p.dv);
  p.lse_hs = head_stride(lse.dimensions()[0], p.m);
  p.scale = scale;
  p.min_share = cta_min_share(p.nnz);
  bool aligned = true;
  for (const void* ptr : {p.q, p.k, p.v, p.o, p.dout})
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  const int64_t e = 16 / esize;
  p.vec = aligned && p.d % e == 0 && p.dv % e == 0;
  ffi::Error err = dispatch_device_float(dtype, "attention backward",
                                         [&](auto tag) { launch<decltype(tag)>(p, rv, st); });
  if (err.failure()) return err;
  return launch_status("attention backward");
}

}  // namespace
}  // namespace attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionBwdCuda, attention::attention_bwd_cuda,
                              JAXSPARSE_TC_BIND_ATTENTION_BWD(JAXSPARSE_TC_CUDA_CTX,
                                                              JAXSPARSE_TC_ROW_VIEW_ARGS, , ),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
