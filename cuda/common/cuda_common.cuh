// Device-side element helpers shared by the CUDA kernels: float conversion, and vector loads and
// stores of a thread's contiguous features.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace jaxsparse_tc {

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Raw bits of a 16-bit element (tensor-core operands are assembled from bits).
template <class T>
__device__ __forceinline__ uint32_t raw16(T v) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  return uint32_t(*reinterpret_cast<const uint16_t*>(&v));
}

// Words holding E consecutive elements of T.
template <class T, int E>
struct Words {
  static constexpr int N = (E * int(sizeof(T)) + 3) / 4;
};

// Loads E consecutive elements starting at feature f of a row, as 32-bit words. `vec`: the
// caller proved 16-byte (or E*sizeof(T)-byte) alignment and f+E <= d; otherwise elements past
// d read as zero. Read-only path (ld.global.nc): gathered rows are re-read by other windows.
template <class T, int E>
__device__ __forceinline__ void load_row(const T* row, int64_t f, int64_t d, bool vec,
                                         uint32_t (&w)[Words<T, E>::N]) {
  constexpr int BYTES = E * int(sizeof(T));
  if (vec) {
    if constexpr (BYTES >= 16) {
#pragma unroll
      for (int i = 0; i < BYTES / 16; ++i) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + f) + i);
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
      }
    } else if constexpr (BYTES == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + f));
      w[0] = v.x;
      w[1] = v.y;
    } else {
      static_assert(BYTES == 4, "unsupported width");
      w[0] = __ldg(reinterpret_cast<const uint32_t*>(row + f));
    }
    return;
  }
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int e = 0; e < E; ++e)
      w[e] = f + e < d ? __ldg(reinterpret_cast<const uint32_t*>(row + f + e)) : 0u;
  } else {
    const uint16_t* r16 = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int i = 0; i < Words<T, E>::N; ++i) {
      const uint32_t lo = f + 2 * i < d ? uint32_t(__ldg(r16 + f + 2 * i)) : 0u;
      const uint32_t hi = f + 2 * i + 1 < d ? uint32_t(__ldg(r16 + f + 2 * i + 1)) : 0u;
      w[i] = lo | (hi << 16);
    }
  }
}

// Stores E floats as T at row[f..f+E) (masked to d unless `vec`).
template <class T, int E>
__device__ __forceinline__ void store_row(T* row, int64_t f, int64_t d, bool vec,
                                          const float (&v)[E]) {
  constexpr int BYTES = E * int(sizeof(T));
  if (vec && BYTES % 4 == 0) {
    uint32_t w[Words<T, E>::N];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int e = 0; e < E; ++e) w[e] = __float_as_uint(v[e]);
    } else {
#pragma unroll
      for (int i = 0; i < E / 2; ++i)
        w[i] = raw16(from_f32<T>(v[2 * i])) | (raw16(from_f32<T>(v[2 * i + 1])) << 16);
    }
    if constexpr (BYTES >= 16) {
#pragma unroll
      for (int i = 0; i < BYTES / 16; ++i)
        reinterpret_cast<uint4*>(row + f)[i] =
            make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    } else if constexpr (BYTES == 8) {
      *reinterpret_cast<uint2*>(row + f) = make_uint2(w[0], w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(row + f) = w[0];
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (f + e < d) row[f + e] = from_f32<T>(v[e]);
}

// Element e of a word array holding 16-bit or 32-bit elements, as float.
template <class T>
__device__ __forceinline__ float word_elem(const uint32_t* w, int e) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[e]);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bfloat16 is the high half of a float: one shift or one mask per element, where extracting
    // the half and then converting it took two (the row SDDMM's bf16 dot products measured
    // 1.1-1.3x its fp16 ones on an H200)
    return __uint_as_float(e % 2 ? w[e / 2] & 0xffff0000u : w[e / 2] << 16);
  } else {
    const uint16_t b = uint16_t(w[e / 2] >> (16 * (e % 2)));
    return to_f32<T>(*reinterpret_cast<const T*>(&b));
  }
}

}  // namespace jaxsparse_tc
