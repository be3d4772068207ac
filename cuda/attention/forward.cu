// CUDA sparse attention forward and jvp: O = softmax_row(mask_A(scale * Q K^T + bias)) V
// (docs/FORMAT.md). The handlers and their launches; the kernels: forward_tc.cuh (the fused
// tensor-core forward), scalar.cuh (CUDA cores: float32, other head sizes, the jvp). Which one
// runs, and the workspace: plan/attention.h. The backward is not here: tensor-core windows
// (backward_fused.cu), or a per-edge kernel (backward_composed.cu) and the SpMMs
// (jaxsparse_tc/_src/attention.py `_backward` says which).
#include <algorithm>
#include <cstdint>

#include "cuda/arch/dependent_launch.cuh"
#include "cuda/attention/forward_tc.cuh"
#include "cuda/attention/params.cuh"
#include "plan/attention.h"
#include "cuda/attention/scalar.cuh"
#include "cuda/attention/tile.cuh"
#include "cuda/common/ffi_cuda.cuh"
#include "plan/common.h"

namespace jaxsparse_tc {
namespace attention {
namespace {

unsigned grid_for(int64_t units) {
  return unsigned((units + kAttnWarps - 1) / kAttnWarps);
}

// The scalar kernels hold a row of d (and dv) features in registers, kMaxPerLane per lane.
ffi::Error check_shape(const AttnShape& s) {
  if (s.d > 32 * kMaxPerLane || s.dv > 32 * kMaxPerLane)
    return ffi::Error::InvalidArgument("sparse_attention (CUDA): d and dv must be <= 256");
  return ffi::Error::Success();
}

// A dependent launch (its launch hides behind the previous kernel's tail) unless the counters'
// memset comes between.
template <class T, int D>
void launch_fwd_tc(cudaStream_t st, const AttnFwdParams<T>& p, bool pf) {
  auto kernel = pf ? attn_fwd_tc<T, D, D, true> : attn_fwd_tc<T, D, D, false>;
  const unsigned grid = grid_for(items_per_head(p.a.num_items, p.grouped) * p.heads);
  launch_kernel(p.split.cap == 0, kernel, grid, 32 * kAttnWarps, p.grouped ? kGroupSmemBytes<D> : 0,
                st, p.q, p.k, p.v, p.bias, p.out, p.lse, p.a.wc, p.a.wbp, p.a.bitmap, p.a.bvp,
                reinterpret_cast<const int32_t*>(p.a.sched), p.a.num_items,
                static_cast<const PatternBounds&>(p.a), p.heads, p.hc, p.m, p.n, p.nnz, p.scale,
                p.has_bias, p.split.ws, p.split.ws_ml, p.split.done, p.split.cap, p.grouped);
}

// A's kernel arrays with their bounds: condensed columns gather K's (and V's) rows, value
// positions read the bias.
KernelPattern attn_pattern(I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                           const ffi::AnyBuffer& k, const ffi::Buffer<ffi::F32>& bias) {
  return kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule, k.dimensions()[1],
                        bias.dimensions()[1]);
}

ffi::Error attention_fwd_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::Buffer<ffi::F32> bias, I32 wcp, I32 wc, I32 wbp, U32 bitmap,
                              I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> o,
                              ffi::Result<ffi::Buffer<ffi::F32>> lse,
                              ffi::Result<ffi::AnyBuffer> workspace, float scale, int32_t has_bias,
                              int32_t grouped, int32_t merge_split_windows) {
  if (auto err = first_failure(
          {check_pattern_aligned("sparse_attention", wcp, wc, wbp, bitmap, bvp, schedule),
           check_aligned(
               "sparse_attention",
               {operand("q", q), operand("k", k), operand("v", v), operand("bias", bias),
                operand("out", *o), operand("lse", *lse), operand("workspace", *workspace)})});
      err.failure())
    return err;
  const AttnShape s = attn_shape(attn_pattern(wcp, wc, wbp, bitmap, bvp, schedule, k, bias), q, k,
                                 v, bias, o->dimensions(), scale, has_bias);
  if (auto err = check_shape(s); err.failure() || s.heads == 0 || s.m == 0) return err;
  const int esize = q.element_type() == ffi::DataType::F32 ? 4 : 2;
  const AttentionFwdPlan plan = plan_attention_fwd(esize, s.d, s.dv, s.heads, s.a.num_items,
                                                   grouped != 0, merge_split_windows != 0);
  if (workspace->size_bytes() < plan.total_bytes)
    return workspace_mismatch("sparse_attention", workspace->size_bytes(), plan.total_bytes);
  SplitWorkspace sw{nullptr, nullptr, nullptr, plan.cap};
  if (sw.cap > 0) {
    char* const mem = static_cast<char*>(workspace->untyped_data());
    sw.ws = reinterpret_cast<float*>(mem);
    sw.ws_ml = reinterpret_cast<float2*>(mem + plan.o_bytes);
    sw.done = reinterpret_cast<int*>(mem + plan.done_offset);
    if (cudaMemsetAsync(sw.done, 0, plan.total_bytes - plan.done_offset, st) != cudaSuccess)
      return ffi::Error::Internal("sparse_attention: workspace memset failed");
  }
  const bool pf = attention_prefetch(wc.element_count());
  ffi::Error e = dispatch_device_float(q.element_type(), "sparse_attention", [&](auto tag) {
    using T = decltype(tag);
    AttnFwdParams<T> p{};
    p.set(s, q, k, v, bias);
    p.out = static_cast<T*>(o->untyped_data());
    p.lse = lse->typed_data();
    p.split = sw;
    p.grouped = int(plan.grouped);
    if constexpr (sizeof(T) == 2) {
      if (plan.tc) {
        if (s.d == 32) launch_fwd_tc<T, 32>(st, p, pf);
        if (s.d == 64) launch_fwd_tc<T, 64>(st, p, pf);
        if (s.d == 128) launch_fwd_tc<T, 128>(st, p, pf);
        return;
      }
    }
    attn_fwd_scalar<T><<<grid_for(s.m * s.heads), 32 * kAttnWarps, 0, st>>>(p);
  });
  if (e.failure()) return e;
  return launch_status("sparse_attention forward");
}

ffi::Error attention_jvp_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::Buffer<ffi::F32> bias, ffi::AnyBuffer o,
                              ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dq, ffi::AnyBuffer dk,
                              ffi::AnyBuffer dvv, ffi::AnyBuffer dbias, I32 wcp, I32 wc, I32 wbp,
                              U32 bitmap, I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> dout,
                              float scale, int32_t has_bias) {
  if (auto err = first_failure(
          {check_pattern_aligned("sparse_attention jvp", wcp, wc, wbp, bitmap, bvp, schedule),
           check_aligned(
               "sparse_attention jvp",
               {operand("q", q), operand("k", k), operand("v", v), operand("bias", bias),
                operand("o", o), operand("lse", lse), operand("dq", dq), operand("dk", dk),
                operand("dv", dvv), operand("dbias", dbias), operand("dout", *dout)})});
      err.failure())
    return err;
  const AttnShape s = attn_shape(attn_pattern(wcp, wc, wbp, bitmap, bvp, schedule, k, bias), q, k,
                                 v, bias, dout->dimensions(), scale, has_bias);
  if (auto err = check_shape(s); err.failure() || s.heads == 0 || s.m == 0) return err;
  // The bias's tangent: float32 like the bias, or Q's dtype; as many positions as the bias.
  const bool dbias_f32 = dbias.element_type() == ffi::DataType::F32;
  if (s.has_bias && ((!dbias_f32 && dbias.element_type() != q.element_type()) ||
                     dbias.dimensions().size() != 2 || dbias.dimensions()[1] != s.nnz))
    return ffi::Error::InvalidArgument(
        "sparse_attention jvp: the bias's tangent must be [H, nnz] float32 (or Q's dtype), with "
        "the bias's nnz");
  ffi::Error e = dispatch_device_float(q.element_type(), "sparse_attention", [&](auto tag) {
    using T = decltype(tag);
    AttnJvpParams<T> p{};
    p.set(s, q, k, v, bias);
    p.lse = lse.typed_data();
    p.dq = static_cast<const T*>(dq.untyped_data());
    p.dk = static_cast<const T*>(dk.untyped_data());
    p.dvv = static_cast<const T*>(dvv.untyped_data());
    p.dbias = dbias.untyped_data();
    p.dbias_f32 = int(dbias_f32);
    p.dout = static_cast<T*>(dout->untyped_data());
    p.hd =
        Heads{dq.dimensions()[0], dk.dimensions()[0], dvv.dimensions()[0], dbias.dimensions()[0]};
    p.hl = lse.dimensions()[0];
    attn_jvp_scalar<T><<<grid_for(s.m * s.heads), 32 * kAttnWarps, 0, st>>>(p);
  });
  if (e.failure()) return e;
  return launch_status("sparse_attention jvp");
}

}  // namespace
}  // namespace attention

int64_t attention_workspace_bytes(int esize, int64_t d, int64_t dv, int64_t heads,
                                  int64_t num_items, bool grouped, bool merge_split_windows) {
  return int64_t(
      plan_attention_fwd(esize, d, dv, heads, num_items, grouped, merge_split_windows).total_bytes);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    AttentionFwdCuda, attention::attention_fwd_cuda,
    JAXSPARSE_TC_BIND_ATTENTION_FWD(JAXSPARSE_TC_CUDA_CTX, ,
                                    .Ret<ffi::AnyBuffer>(),  // workspace [bytes] (plan/attention.h)
                                    .Attr<int32_t>("grouped")  // the schedule is grouped
                                        .Attr<int32_t>("merge_split_windows")),  // plan/attention.h
    JAXSPARSE_TC_CAPTURABLE);

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionJvpCuda, attention::attention_jvp_cuda,
                              JAXSPARSE_TC_BIND_ATTENTION_JVP(JAXSPARSE_TC_CUDA_CTX, , , ),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
