// Host-side float16 / bfloat16 <-> float conversions for the CPU kernels (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>

namespace jaxsparse_tc {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_float(float x) {
  return x;
}
inline double to_float(double x) {
  return x;
}  // float64 (CPU only) keeps double math
inline float to_float(bfloat16_t x) {
  return bits_to_float(uint32_t(x.bits) << 16);
}
inline float to_float(half_t x) {
  uint32_t sign = uint32_t(x.bits & 0x8000) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1f, man = x.bits & 0x3ff;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // subnormal: value = man * 2^-24
    float f = float(man) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}

// The accumulator of each storage type: float32, except float64 itself.
template <typename T>
struct accum {
  using type = float;
};
template <>
struct accum<double> {
  using type = double;
};
template <typename T>
using accum_t = typename accum<T>::type;

template <typename T>
inline T narrow(accum_t<T> a) {
  return from_float<T>(a);
}
template <>
inline double narrow<double>(double a) {
  return a;
}
template <>
inline bfloat16_t from_float<bfloat16_t>(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
template <>
inline half_t from_float<half_t>(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00)};   // nan
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00)};  // overflow -> inf
  if (a < 0x38800000u) {                                   // subnormal or zero
    float m = bits_to_float(a) * 16777216.0f;              // in units of 2^-24
    uint32_t q = uint32_t(m);
    float rem = m - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return {uint16_t(sign | q)};
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return {uint16_t(sign | (r >> 13))};
}

}  // namespace jaxsparse_tc
