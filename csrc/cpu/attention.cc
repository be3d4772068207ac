// CPU sparse attention (the executable specification of the CUDA kernels):
//   forward  O = softmax_row(mask_A(scale * Q K^T + bias)) V, LSE = row log-sum-exp (fp32)
//   jvp      dO for tangents (dQ, dK, dV, dbias), from the saved LSE
// (The backward is composed from the SpMM/SDDMM kernels: jaxsparse_tc/attention.py.)
// Operands carry a head axis [H_i, ...] with H_i in {1, H}; float32 math throughout.
// Rows without nonzeros: O = 0, LSE = -inf, no gradient.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/ffi_common.h"

namespace jaxsparse_tc {
namespace {

struct Dense {  // a [H_i, rows, cols] operand
  const void* data;
  int64_t heads, rows, cols;
};

Dense dense(const ffi::AnyBuffer& b) {
  const auto d = b.dimensions();
  return {b.untyped_data(), d[0], d[1], d[2]};
}

template <typename T>
const T* row_of(const Dense& x, int64_t h, int64_t i) {
  return static_cast<const T*>(x.data) + ((x.heads == 1 ? 0 : h) * x.rows + i) * x.cols;
}

template <typename T>
float dot(const T* a, const T* b, int64_t d) {
  float s = 0.0f;
  for (int64_t k = 0; k < d; ++k) s += to_float(a[k]) * to_float(b[k]);
  return s;
}

// One nonzero of a window: row in window, column, value index.
struct Entry { int r; int32_t col; int64_t idx; };

std::vector<Entry> window_entries(const PatternView& p, int64_t w) {
  std::vector<Entry> e;
  for_each_in_window(p, w, [&](int r, int32_t col, int64_t idx) { e.push_back({r, col, idx}); });
  return e;
}

template <typename T>
float bias_at(const T* bias, int64_t hb, int64_t nnz, int64_t h, int64_t idx, bool has_bias) {
  return has_bias ? to_float(bias[(hb == 1 ? 0 : h) * nnz + idx]) : 0.0f;
}

}  // namespace

static ffi::Error attention_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                    ffi::AnyBuffer bias, I32 wcp, I32 wc, I32 wbp, U32 bitmap,
                                    I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> o,
                                    ffi::Result<ffi::Buffer<ffi::F32>> lse, float scale,
                                    int32_t has_bias) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const Dense Q = dense(q), K = dense(k), V = dense(v);
  const int64_t heads = o->dimensions()[0], m = o->dimensions()[1], dv = o->dimensions()[2];
  const int64_t d = Q.cols, hb = bias.dimensions()[0], nnz = bias.dimensions()[1];
  return dispatch_float(q.element_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* bs = static_cast<const T*>(bias.untyped_data());
    T* out = static_cast<T*>(o->untyped_data());
    float* l = lse->typed_data();
    std::vector<float> s, acc(kWindowRows * dv);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t w = 0; w < p.num_windows; ++w) {
        const auto ent = window_entries(p, w);
        s.resize(ent.size());
        float mx[kWindowRows], sum[kWindowRows];
        for (int r = 0; r < kWindowRows; ++r) mx[r] = -std::numeric_limits<float>::infinity(), sum[r] = 0;
        for (size_t e = 0; e < ent.size(); ++e) {
          const Entry& x = ent[e];
          s[e] = scale * dot(row_of<T>(Q, h, w * kWindowRows + x.r), row_of<T>(K, h, x.col), d) +
                 bias_at(bs, hb, nnz, h, x.idx, has_bias);
          mx[x.r] = std::max(mx[x.r], s[e]);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (size_t e = 0; e < ent.size(); ++e) {
          const Entry& x = ent[e];
          const float pe = std::exp(s[e] - mx[x.r]);
          sum[x.r] += pe;
          const T* vr = row_of<T>(V, h, x.col);
          for (int64_t f = 0; f < dv; ++f) acc[x.r * dv + f] += pe * to_float(vr[f]);
        }
        const int64_t rows = std::min<int64_t>(kWindowRows, m - w * kWindowRows);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = w * kWindowRows + r;
          const float inv = sum[r] > 0 ? 1.0f / sum[r] : 0.0f;
          for (int64_t f = 0; f < dv; ++f) out[(h * m + i) * dv + f] = from_float<T>(acc[r * dv + f] * inv);
          l[h * m + i] = sum[r] > 0 ? mx[r] + std::log(sum[r]) : -std::numeric_limits<float>::infinity();
        }
      }
    }
  });
}

// dO_i = sum_j P_ij dS_ij V_j - (sum_j P_ij dS_ij) O_i + sum_j P_ij dV_j,
// dS_ij = scale (dQ_i . K_j + Q_i . dK_j) + dbias_ij, P_ij = exp(scale Q_i.K_j + bias_ij - LSE_i).
static ffi::Error attention_jvp_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                    ffi::AnyBuffer bias, ffi::AnyBuffer /*o*/,
                                    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dq,
                                    ffi::AnyBuffer dk, ffi::AnyBuffer dvv, ffi::AnyBuffer dbias,
                                    I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                    ffi::Result<ffi::AnyBuffer> dout, float scale,
                                    int32_t has_bias) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const Dense Q = dense(q), K = dense(k), V = dense(v), dQ = dense(dq), dK = dense(dk),
              dV = dense(dvv);
  const int64_t heads = dout->dimensions()[0], m = dout->dimensions()[1];
  const int64_t dv = dout->dimensions()[2], d = Q.cols;
  const int64_t hb = bias.dimensions()[0], nnz = bias.dimensions()[1];
  const int64_t hdb = dbias.dimensions()[0], hl = lse.dimensions()[0];
  return dispatch_float(q.element_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* bs = static_cast<const T*>(bias.untyped_data());
    const T* dbs = static_cast<const T*>(dbias.untyped_data());
    const float* l = lse.typed_data();
    T* out = static_cast<T*>(dout->untyped_data());
    std::vector<float> a1(dv), a2(dv), of(dv);
    std::vector<std::vector<Entry>> by_row(kWindowRows);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t w = 0; w < p.num_windows; ++w) {
        for (auto& r : by_row) r.clear();
        for_each_in_window(p, w, [&](int r, int32_t col, int64_t idx) {
          by_row[r].push_back({r, col, idx});
        });
        const int64_t rows = std::min<int64_t>(kWindowRows, m - w * kWindowRows);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = w * kWindowRows + r;
          std::fill(a1.begin(), a1.end(), 0.f), std::fill(a2.begin(), a2.end(), 0.f);
          std::fill(of.begin(), of.end(), 0.f);
          float c = 0.0f;
          const float li = l[(hl == 1 ? 0 : h) * m + i];
          for (const Entry& x : by_row[r]) {
            const float s = scale * dot(row_of<T>(Q, h, i), row_of<T>(K, h, x.col), d) +
                            bias_at(bs, hb, nnz, h, x.idx, has_bias);
            const float pe = std::exp(s - li);
            const float ds = scale * (dot(row_of<T>(dQ, h, i), row_of<T>(K, h, x.col), d) +
                                      dot(row_of<T>(Q, h, i), row_of<T>(dK, h, x.col), d)) +
                             bias_at(dbs, hdb, nnz, h, x.idx, has_bias);
            c += pe * ds;
            const T* vr = row_of<T>(V, h, x.col);
            const T* dvr = row_of<T>(dV, h, x.col);
            for (int64_t f = 0; f < dv; ++f) {
              a1[f] += pe * ds * to_float(vr[f]);
              of[f] += pe * to_float(vr[f]);
              a2[f] += pe * to_float(dvr[f]);
            }
          }
          for (int64_t f = 0; f < dv; ++f)
            out[(h * m + i) * dv + f] = from_float<T>(a1[f] - c * of[f] + a2[f]);
        }
      }
    }
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionFwdCpu, attention_fwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q [Hq, m, d]
                                  .Arg<ffi::AnyBuffer>()  // k [Hk, n, d]
                                  .Arg<ffi::AnyBuffer>()  // v [Hv, n, dv]
                                  .Arg<ffi::AnyBuffer>()  // bias [Hb, nnz] (or a dummy)
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // o [H, m, dv]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse [H, m]
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionJvpCpu, attention_jvp_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Arg<ffi::AnyBuffer>()  // o
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dq
                                  .Arg<ffi::AnyBuffer>()  // dk
                                  .Arg<ffi::AnyBuffer>()  // dv
                                  .Arg<ffi::AnyBuffer>()  // dbias
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // do [H, m, dv]
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias"));


}  // namespace jaxsparse_tc
