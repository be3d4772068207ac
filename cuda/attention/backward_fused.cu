// CUDA sparse attention backward on tensor cores (the fused backward; jaxsparse_tc/_src/
// attention.py `_backward` chooses it): the handler and its launches. The kernels and how they
// split the work: backward_tc.cuh; the workspace: plan/attention.h.
#include <algorithm>
#include <cstdint>

#include "cuda/arch/dependent_launch.cuh"
#include "cuda/attention/backward_tc.cuh"
#include "plan/attention.h"
#include "cuda/attention/tile.cuh"
#include "cuda/common/ffi_cuda.cuh"
#include "plan/common.h"

namespace jaxsparse_tc {
namespace attention {
namespace {

int64_t ctas_for(int64_t items, int64_t heads, bool grouped) {
  return (items_per_head(items, grouped) * heads + kAttnWarps - 1) / kAttnWarps;
}

// Both kernels are dependent launches (dependent_launch.cuh): the row stats after the kernel
// before (unless a counter memset sits between: `after_kernel`), the windows after the stats,
// whose launch and prologue then overlap them. Errors show in launch_status.
template <class T, int D, bool PF>
void launch(cudaStream_t st, const GradOperands<T>& p, const KernelPattern& a,
            const KernelPattern& at, const GradSplit& sa, const GradSplit& s_t, bool after_kernel) {
  const int64_t rows = p.heads * p.m;
  if (rows > 0)
    launch_kernel(after_kernel, grads_row_stats<T, D>, unsigned((rows * 8 + 255) / 256), 256, 0, st,
                  p);
  const int64_t ctas_a = ctas_for(a.num_items, p.heads, sa.grouped);
  const int64_t ctas_t = ctas_for(at.num_items, p.heads, s_t.grouped), ctas = ctas_a + ctas_t;
  if (ctas > 0)
    launch_kernel(rows > 0, grads_windows<T, D, PF>, unsigned(ctas), 32 * kAttnWarps,
                  kAttnWarps * kGradSlotBytes<D, 2>, st, p, a, at, sa, s_t, ctas_t);
}

template <class T, int D>
void launch_d(cudaStream_t st, const GradOperands<T>& p, const KernelPattern& a,
              const KernelPattern& at, const GradSplit& sa, const GradSplit& s_t, bool pf,
              bool after_kernel) {
  if (pf)
    launch<T, D, true>(st, p, a, at, sa, s_t, after_kernel);
  else
    launch<T, D, false>(st, p, a, at, sa, s_t, after_kernel);
}

int64_t head_stride(int64_t count, int64_t size) {
  return count == 1 ? 0 : size;
}

ffi::Error attention_grads_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer v, ffi::Buffer<ffi::F32> bias, ffi::AnyBuffer o,
                                ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, I32 wcp, I32 wc,
                                I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 wcp_t, I32 wc_t,
                                I32 wbp_t, U32 bitmap_t, I32 bvp_t, I32 schedule_t, I32 perm_t,
                                ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dbias,
                                ffi::Result<ffi::AnyBuffer> workspace, float scale,
                                int32_t has_bias, int32_t grouped, int32_t grouped_t,
                                int32_t merge_split_windows) {
  constexpr const char* kOp = "attention gradients";
  if (auto err = first_failure(
          {check_pattern_aligned(kOp, wcp, wc, wbp, bitmap, bvp, schedule),
           check_pattern_aligned(kOp, wcp_t, wc_t, wbp_t, bitmap_t, bvp_t, schedule_t),
           check_aligned(kOp, {operand("q", q), operand("k", k), operand("v", v),
                               operand("bias", bias), operand("o", o), operand("lse", lse),
                               operand("dout", dout), operand("perm_t", perm_t), operand("dq", *dq),
                               operand("dk", *dk), operand("dv", *dv), operand("dbias", *dbias),
                               operand("workspace", *workspace)})});
      err.failure())
    return err;
  const auto dtype = q.element_type();
  // The bias is float32 whatever Q's dtype; dbias has Q's.
  for (ffi::DataType x :
       {k.element_type(), v.element_type(), o.element_type(), dout.element_type(),
        dq->element_type(), dk->element_type(), dv->element_type(), dbias->element_type()})
    if (x != dtype) return ffi::Error::InvalidArgument("attention gradients: mixed dtypes");
  const int64_t heads = dq->dimensions()[0], m = dq->dimensions()[1], d = dq->dimensions()[2];
  const int64_t n = k.dimensions()[1];
  // With a bias, its positions, dbias's and perm_t's must agree: they are A's nonzeros, which
  // the kernels' value positions fold into. (A bias without positions reads nothing.)
  const int64_t nnz = bias.dimensions()[1];
  const bool with_bias = has_bias && nnz > 0;
  if (with_bias && (dbias->dimensions()[0] != heads || dbias->dimensions()[1] != nnz ||
                    int64_t(perm_t.element_count()) != nnz))
    return ffi::Error::InvalidArgument(
        "attention gradients: bias, dbias and perm_t must have the pattern's nnz positions");
  // These kernels run wherever the plan, forced to the fused backward, takes it.
  AttentionBwdPlan bwd_plan;
  if (auto err =
          plan_attention_backward({dtype == ffi::DataType::F32 ? 4 : 2, d, v.dimensions()[2], {}},
                                  int64_t(AttentionBackward::kFused), bwd_plan);
      err.failure())
    return err;
  if (!bwd_plan.fused)
    return ffi::Error::InvalidArgument(
        "attention gradients (tensor cores): 16-bit operands with d = dv in {32, 64, 128}");
  if (heads == 0) return ffi::Error::Success();
  // A's columns gather K's and V's rows, A^T's Q's and dO's (and the row stats); both orders'
  // value positions index nnz values (A^T's through perm_t).
  const KernelPattern a = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule, n, nnz);
  const KernelPattern at = kernel_pattern(wcp_t, wc_t, wbp_t, bitmap_t, bvp_t, schedule_t, m, nnz);
  const AttentionGradsPlan l =
      plan_attention_grads(d, heads, m, a.num_items, at.num_items, grouped != 0, grouped_t != 0,
                           merge_split_windows != 0);
  if (workspace->size_bytes() < l.total)
    return workspace_mismatch("attention gradients", workspace->size_bytes(), l.total);
  char* const mem = static_cast<char*>(workspace->untyped_data());
  const GradSplit sa{reinterpret_cast<float*>(mem + l.ws_a), reinterpret_cast<int*>(mem + l.done_a),
                     l.cap_a, int(l.grouped_a)};
  const GradSplit s_t{reinterpret_cast<float*>(mem + l.ws_t),
                      reinterpret_cast<int*>(mem + l.done_t), l.cap_t, int(l.grouped_t)};
  const bool memset = l.total > l.done_a;
  if (memset && cudaMemsetAsync(mem + l.done_a, 0, l.total - l.done_a, st) != cudaSuccess)
    return ffi::Error::Internal("attention gradients: workspace memset failed");
  const bool pf = attention_prefetch(wc.element_count());
  ffi::Error e = dispatch_device_float(dtype, "attention gradients", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      GradOperands<T> p{};
      p.q = static_cast<const T*>(q.untyped_data());
      p.k = static_cast<const T*>(k.untyped_data());
      p.v = static_cast<const T*>(v.untyped_data());
      p.bias = bias.typed_data();
      p.o = static_cast<const T*>(o.untyped_data());
      p.dout = static_cast<const T*>(dout.untyped_data());
      p.lse = lse.typed_data();
      p.perm_t = perm_t.typed_data();
      p.dq = static_cast<T*>(dq->untyped_data());
      p.dk = static_cast<T*>(dk->untyped_data());
      p.dv = static_cast<T*>(dv->untyped_data());
      p.dbias = static_cast<T*>(dbias->untyped_data());
      p.row_stats = reinterpret_cast<float2*>(mem);
      p.m = m;
      p.n = n;
      p.nnz = nnz;
      p.last_value = last_index(nnz);
      p.heads = heads;
      p.q_hs = head_stride(q.dimensions()[0], m * d);
      p.k_hs = head_stride(k.dimensions()[0], n * d);
      p.v_hs = head_stride(v.dimensions()[0], n * d);
      p.b_hs = head_stride(bias.dimensions()[0], p.nnz);
      p.o_hs = head_stride(o.dimensions()[0], m * d);
      p.do_hs = head_stride(dout.dimensions()[0], m * d);
      p.lse_hs = head_stride(lse.dimensions()[0], m);
      p.scale = scale;
      p.has_bias = int(with_bias);
      if (d == 32) launch_d<T, 32>(st, p, a, at, sa, s_t, pf, !memset);
      if (d == 64) launch_d<T, 64>(st, p, a, at, sa, s_t, pf, !memset);
      if (d == 128) launch_d<T, 128>(st, p, a, at, sa, s_t, pf, !memset);
    }
  });
  if (e.failure()) return e;
  return launch_status("attention gradients");
}

}  // namespace
}  // namespace attention

int64_t attention_grads_workspace_bytes(int64_t d, int64_t heads, int64_t m, int64_t items_a,
                                        int64_t items_t, bool grouped_a, bool grouped_t,
                                        bool merge_split_windows) {
  return int64_t(
      plan_attention_grads(d, heads, m, items_a, items_t, grouped_a, grouped_t, merge_split_windows)
          .total);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    AttentionGradsCuda, attention::attention_grads_cuda,
    JAXSPARSE_TC_BIND_ATTENTION_GRADS(JAXSPARSE_TC_CUDA_CTX, ,
                                      .Ret<ffi::AnyBuffer>(),          // workspace [bytes] (plan)
                                      .Attr<int32_t>("grouped")        // A's schedule is grouped
                                          .Attr<int32_t>("grouped_t")  // A^T's
                                          .Attr<int32_t>("merge_split_windows")),  // plan
    JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
