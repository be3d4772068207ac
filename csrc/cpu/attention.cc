// CPU sparse attention (the executable specification of the CUDA kernels):
//   forward  O = softmax_row(mask_A(scale * Q K^T + bias)) V, LSE = row log-sum-exp (fp32)
//   jvp      dO for tangents (dQ, dK, dV, dbias), from the saved LSE
// (The backward is composed from the SpMM/SDDMM kernels: jaxsparse_tc/_src/attention.py.)
// Operands carry a head axis [H_i, ...] with H_i in {1, H}; float32 math throughout. The bias
// and its tangent are float32 [Hb, nnz] whatever Q's dtype (a [1, 1] placeholder without bias).
// Rows, by their logits s = scale Q_i.K_j + bias_ij:
//   - any s NaN or +inf: O_i, LSE_i and dO_i are NaN;
//   - no entries, or every s -inf (fully masked): O_i = 0, dO_i = 0, LSE_i = +inf, so that the
//     backward's P_ij = exp(s_ij - LSE_i) is exactly 0 on such a row;
//   - otherwise the max-subtracted softmax; an s of -inf gets weight exactly 0.
// Windows are split across XLA's intra-op threads (cpu/parallel.h); the kernels are in
// cpu/kernels_impl.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"

namespace jaxsparse_tc {
namespace {

cpu::Operand dense(const ffi::AnyBuffer& b) {
  const auto d = b.dimensions();
  return {b.untyped_data(), d[0], d[1], d[2]};
}

cpu::Operand per_edge(const ffi::Buffer<ffi::F32>& b) {
  const auto d = b.dimensions();
  return {b.typed_data(), d[0], 1, d[1]};
}

}  // namespace

static ffi::Error attention_fwd_cpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                    ffi::AnyBuffer v, ffi::Buffer<ffi::F32> bias, I32 wcp, I32 wc,
                                    I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                    ffi::Result<ffi::AnyBuffer> o,
                                    ffi::Result<ffi::Buffer<ffi::F32>> lse, float scale,
                                    int32_t has_bias) {
  const int dtype = cpu_dtype(q.element_type(), /*allow_f64=*/false);
  if (dtype < 0) return unsupported_dtype();
  cpu::AttentionArgs a{};
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.q = dense(q), a.k = dense(k), a.v = dense(v), a.bias = per_edge(bias);
  a.out = o->untyped_data();
  a.lse = lse->typed_data();
  a.heads = o->dimensions()[0], a.m = o->dimensions()[1];
  a.scale = scale;
  a.has_bias = has_bias != 0;
  const auto kernel = cpu::kernels().attention_fwd[dtype];
  cpu::parallel_windows(pool, a.p, a.heads, a.q.cols + a.v.cols + 32, 8 * (a.q.cols + a.v.cols),
                        [&](int64_t w0, int64_t w1) { kernel(a, w0, w1); });
  return ffi::Error::Success();
}

// dO_i = sum_j P_ij dS_ij V_j - (sum_j P_ij dS_ij) O_i + sum_j P_ij dV_j,
// dS_ij = scale (dQ_i . K_j + Q_i . dK_j) + dbias_ij, P_ij = exp(scale Q_i.K_j + bias_ij - LSE_i).
static ffi::Error attention_jvp_cpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                    ffi::AnyBuffer v, ffi::Buffer<ffi::F32> bias,
                                    ffi::AnyBuffer /*o*/, ffi::Buffer<ffi::F32> lse,
                                    ffi::AnyBuffer dq, ffi::AnyBuffer dk, ffi::AnyBuffer dvv,
                                    ffi::Buffer<ffi::F32> dbias, I32 wcp, I32 wc, I32 wbp,
                                    U32 bitmap, I32 bvp, I32 schedule,
                                    ffi::Result<ffi::AnyBuffer> dout, float scale,
                                    int32_t has_bias) {
  const int dtype = cpu_dtype(q.element_type(), /*allow_f64=*/false);
  if (dtype < 0) return unsupported_dtype();
  cpu::AttentionArgs a{};
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.q = dense(q), a.k = dense(k), a.v = dense(v), a.bias = per_edge(bias);
  a.dq = dense(dq), a.dk = dense(dk), a.dv = dense(dvv), a.dbias = per_edge(dbias);
  a.lse_in = lse.typed_data();
  a.lse_heads = lse.dimensions()[0];
  a.out = dout->untyped_data();
  a.heads = dout->dimensions()[0], a.m = dout->dimensions()[1];
  a.scale = scale;
  a.has_bias = has_bias != 0;
  const auto kernel = cpu::kernels().attention_jvp[dtype];
  cpu::parallel_windows(pool, a.p, a.heads, 3 * a.q.cols + 3 * a.v.cols + 32,
                        8 * (a.q.cols + a.v.cols),
                        [&](int64_t w0, int64_t w1) { kernel(a, w0, w1); });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionFwdCpu, attention_fwd_cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // q [Hq, m, d]
                                  .Arg<ffi::AnyBuffer>()         // k [Hk, n, d]
                                  .Arg<ffi::AnyBuffer>()         // v [Hv, n, dv]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // bias [Hb, nnz] (or [1, 1])
                              JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()         // o [H, m, dv]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse [H, m]
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionJvpCpu, attention_jvp_cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // q
                                  .Arg<ffi::AnyBuffer>()         // k
                                  .Arg<ffi::AnyBuffer>()         // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // bias [Hb, nnz] (or [1, 1])
                                  .Arg<ffi::AnyBuffer>()         // o
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lse
                                  .Arg<ffi::AnyBuffer>()         // dq
                                  .Arg<ffi::AnyBuffer>()         // dk
                                  .Arg<ffi::AnyBuffer>()         // dv
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dbias, as bias
                              JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // do [H, m, dv]
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias"));

}  // namespace jaxsparse_tc
