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
// cpu/kernels/attention.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"
#include "cpu/pattern_check.h"

namespace jaxsparse_tc {
namespace {

cpu::Operand dense(const ffi::AnyBuffer& b) {
  const auto d = b.dimensions();
  return {b.untyped_data(), d[0], d[1], d[2]};
}

// A float32 per-edge operand (checked float32 by attention_operand_error where it is read).
template <typename B>
cpu::Operand per_edge(const B& b) {
  const auto d = b.dimensions();
  return {b.untyped_data(), d[0], 1, d[1]};
}

// An operand's shape and dtype, whatever its buffer type (the bias is a float32 buffer).
struct Shaped {
  ffi::Span<const int64_t> dims;
  ffi::DataType type;
  template <typename B>
  explicit Shaped(const B& b) : dims(b.dimensions()), type(b.element_type()) {}
};

// The operands' shapes and dtypes against each other (q [Hq, m, d], k [Hk, n, d], v [Hv, n, dv],
// bias [Hb, nnz] where has_bias, out [H, m, dv], each head count 1 or H; q, k, v and out one
// dtype, the bias float32); for the JVP also the tangents (dq, dk, dv, dbias shaped as their
// primals, nullptr for the forward) and lse [Hl, m]. Sets what the pattern is checked against.
std::string attention_operand_error(Shaped q, Shaped k, Shaped v, Shaped bias, bool has_bias,
                                    ffi::Span<const int64_t> od, ffi::DataType out_type,
                                    const Shaped* tangents, ffi::Span<const int64_t> lse,
                                    PatternLimits& lim) {
  if (od.size() != 3) return "out has shape " + dims_string(od) + "; expected [H, m, dv]";
  const int64_t H = od[0], m = od[1], dv = od[2];
  const Shaped* ops[] = {&q, &k, &v, &bias};
  const char* names[] = {"q", "k", "v", "bias", "dq", "dk", "dv", "dbias"};
  const int count = tangents ? 8 : 4;
  const int64_t n = k.dims.size() == 3 ? k.dims[1] : -1;
  const int64_t d = q.dims.size() == 3 ? q.dims[2] : -1;
  const int64_t nnz = bias.dims.size() == 2 ? bias.dims[1] : -1;
  const int64_t want[4][2] = {{m, d}, {n, d}, {n, dv}, {-1, nnz}};
  for (int i = 0; i < count; ++i) {
    const bool edge = i % 4 == 3;
    if (edge && !has_bias) continue;  // a placeholder the kernels do not read
    const Shaped& b = i < 4 ? *ops[i] : tangents[i - 4];
    const auto bd = b.dims;
    const bool ok = bd.size() == (edge ? 2u : 3u) && heads_broadcast(bd[0], H) &&
                    (edge ? bd[1] == nnz : bd[1] == want[i % 4][0] && bd[2] == want[i % 4][1]) &&
                    b.type == (edge ? ffi::DataType::F32 : out_type);
    if (!ok)
      return std::string(names[i]) + " has shape " + dims_string(bd) +
             " (or another dtype than expected) in a call of q " + dims_string(q.dims) + ", k " +
             dims_string(k.dims) + ", v " + dims_string(v.dims) + ", out " + dims_string(od) +
             ": expected q [Hq, m, d], k [Hk, n, d], v [Hv, n, dv] in out's dtype, bias [Hb, "
             "nnz] float32, head counts 1 or H";
  }
  if (lse.size() != 2 || !heads_broadcast(lse[0], H) || lse[1] != m || (!tangents && lse[0] != H))
    return "lse has shape " + dims_string(lse) + "; expected [H, m] = [" + std::to_string(H) +
           ", " + std::to_string(m) + "]";
  lim.m = m, lim.n = n, lim.nnz = has_bias ? nnz : -1;
  return {};
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
  constexpr const char* kTarget = op_target(Op::kAttentionFwd);
  PatternLimits lim;
  if (auto err = attention_operand_error(Shaped(q), Shaped(k), Shaped(v), Shaped(bias),
                                         has_bias != 0, o->dimensions(), o->element_type(), nullptr,
                                         lse->dimensions(), lim);
      !err.empty())
    return operand_error(kTarget, err);
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.all(pool); err.failure()) return err;
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
                                    ffi::AnyBuffer dbias, I32 wcp, I32 wc, I32 wbp, U32 bitmap,
                                    I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> dout,
                                    float scale, int32_t has_bias) {
  const int dtype = cpu_dtype(q.element_type(), /*allow_f64=*/false);
  if (dtype < 0) return unsupported_dtype();
  constexpr const char* kTarget = op_target(Op::kAttentionJvp);
  PatternLimits lim;
  const Shaped tangents[] = {Shaped(dq), Shaped(dk), Shaped(dvv), Shaped(dbias)};
  if (auto err = attention_operand_error(Shaped(q), Shaped(k), Shaped(v), Shaped(bias),
                                         has_bias != 0, dout->dimensions(), dout->element_type(),
                                         tangents, lse.dimensions(), lim);
      !err.empty())
    return operand_error(kTarget, err);
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.all(pool); err.failure()) return err;
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
                              JAXSPARSE_TC_BIND_ATTENTION_FWD(JAXSPARSE_TC_CPU_CTX, , , ));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionJvpCpu, attention_jvp_cpu,
                              JAXSPARSE_TC_BIND_ATTENTION_JVP(JAXSPARSE_TC_CPU_CTX, , , ));

}  // namespace jaxsparse_tc
