// The contract between Python and the extensions, defined here only: the operators (their FFI
// target names, ABI versions and platforms) and the codes of the attributes Python passes by
// name. The CPU extension exports all of it (cpu/module.cc: OPS, OP_PLATFORMS, KERNEL_CODES,
// PRECISION_CODES, ATTENTION_BACKWARD_CODES) and jaxsparse_tc reads it from there; both
// extensions' registrations() come from the table. Each operator's FFI binding: common/ffi_ops.h.
// docs/DESIGN.md, "How to add an operator or a kernel family".
#pragma once
#include <cstddef>
#include <cstdint>

#include "xla/ffi/api/c_api.h"

namespace jaxsparse_tc {

// X(name, Symbol, version, cpu, cuda), one row per operator:
//   name     its name in Python (`register_ffi_lowering(prim, "spmm", ...)`,
//            `extensions.has_cuda_kernel("spmm")`)
//   Symbol   the stem of its handler symbols (<Symbol>Cpu, <Symbol>Cuda) and of Op::k<Symbol>
//   version  its ABI version: bump it when its operands, results or attributes change on either
//            platform, so that a program lowered against the old binding (serialized, cached)
//            finds no target instead of calling the new handler; the FFI target is
//            jaxsparse_tc_<name>_v<version>
//   cpu, cuda  1 where that platform has a handler (an operator without a CPU handler lowers on
//            through a composed rule there: register_ffi_lowering's composed_rule)
#define JAXSPARSE_TC_OPS(X)                    \
  X(spmm, Spmm, 1, 1, 1)                       \
  X(spmm_extremum, SpmmExtremum, 1, 1, 1)      \
  X(sddmm, Sddmm, 1, 1, 1)                     \
  X(edge_softmax, EdgeSoftmax, 1, 1, 1)        \
  X(edge_softmax_bwd, EdgeSoftmaxBwd, 1, 1, 1) \
  X(attention_fwd, AttentionFwd, 1, 1, 1)      \
  X(attention_jvp, AttentionJvp, 1, 1, 1)      \
  X(attention_bwd, AttentionBwd, 1, 0, 1)      \
  X(attention_grads, AttentionGrads, 1, 0, 1)

enum class Op : int {
#define JAXSPARSE_TC_OP_ENUM(name, Symbol, version, cpu, cuda) k##Symbol,
  JAXSPARSE_TC_OPS(JAXSPARSE_TC_OP_ENUM)
#undef JAXSPARSE_TC_OP_ENUM
};

struct OpInfo {
  const char* name;    // Python's name of the operator
  const char* target;  // the FFI target: jaxsparse_tc_<name>_v<version>
  int version;
  bool cpu, cuda;  // the platforms with a handler
};

inline constexpr OpInfo kOps[] = {
#define JAXSPARSE_TC_OP_INFO(name, Symbol, version, cpu, cuda) \
  {#name, "jaxsparse_tc_" #name "_v" #version, version, cpu != 0, cuda != 0},
    JAXSPARSE_TC_OPS(JAXSPARSE_TC_OP_INFO)
#undef JAXSPARSE_TC_OP_INFO
};

constexpr const OpInfo& op_info(Op op) {
  return kOps[int(op)];
}
// The FFI target of `op` (handlers name it in their error messages).
constexpr const char* op_target(Op op) {
  return kOps[int(op)].target;
}

// One platform's handlers, declared from the table (extern "C", as XLA_FFI_DEFINE_HANDLER_SYMBOL
// defines them) and listed as (op, handler) for its extension's registrations():
//   JAXSPARSE_TC_OPS(JAXSPARSE_TC_DECLARE_CPU)
//   constexpr OpHandler kCpuHandlers[] = {JAXSPARSE_TC_OPS(JAXSPARSE_TC_HANDLER_CPU)};
#define JAXSPARSE_TC_IF_0(...)
#define JAXSPARSE_TC_IF_1(...) __VA_ARGS__
#define JAXSPARSE_TC_IF(flag, ...) JAXSPARSE_TC_IF_##flag(__VA_ARGS__)
#define JAXSPARSE_TC_DECLARE_CPU(name, Symbol, version, cpu, cuda) \
  JAXSPARSE_TC_IF(cpu, extern "C" XLA_FFI_Error* Symbol##Cpu(XLA_FFI_CallFrame*);)
#define JAXSPARSE_TC_DECLARE_CUDA(name, Symbol, version, cpu, cuda) \
  JAXSPARSE_TC_IF(cuda, extern "C" XLA_FFI_Error* Symbol##Cuda(XLA_FFI_CallFrame*);)
#define JAXSPARSE_TC_HANDLER_CPU(name, Symbol, version, cpu, cuda) \
  JAXSPARSE_TC_IF(cpu, {::jaxsparse_tc::Op::k##Symbol, Symbol##Cpu}, )
#define JAXSPARSE_TC_HANDLER_CUDA(name, Symbol, version, cpu, cuda) \
  JAXSPARSE_TC_IF(cuda, {::jaxsparse_tc::Op::k##Symbol, Symbol##Cuda}, )

struct OpHandler {
  Op op;
  XLA_FFI_Handler* handler;
};

// Codes of the attributes and arguments Python passes as integers, with the names Python knows
// them by (KernelOptions' literals, precision names). Each list is in code order from 0.
struct NamedCode {
  const char* name;
  int32_t code;
};

// FFI attribute `kernel` of the CUDA SpMM and SDDMM handlers (KernelOptions.spmm, .sddmm), and
// kernel_choices' spmm_kernel / sddmm_kernel.
enum class KernelChoice : int32_t {
  kAuto = 0,     // the plan's rule
  kRows = 1,     // the row kernels (CUDA cores, the pattern's row view)
  kWindows = 2,  // the window kernels (tensor cores; exact float32 on CUDA cores)
};
inline constexpr NamedCode kKernelChoiceCodes[] = {
    {"auto", int32_t(KernelChoice::kAuto)},
    {"rows", int32_t(KernelChoice::kRows)},
    {"windows", int32_t(KernelChoice::kWindows)},
};

// FFI attribute `precision` of the SpMM and SDDMM handlers (jaxsparse_tc/_src/precision.py).
enum class Precision : int32_t {
  kDefault = 0,  // float32 at least as accurate as tf32 (tf32 tensor cores, or exact CUDA cores)
  kHighest = 1,  // exact float32 on CUDA cores
};
inline constexpr NamedCode kPrecisionCodes[] = {
    {"default", int32_t(Precision::kDefault)},
    {"highest", int32_t(Precision::kHighest)},
};

// kernel_choices' attention_backward (KernelOptions.attention_backward); the backward's choice is
// made in Python (jaxsparse_tc/_src/attention.py), so no handler takes it.
enum class AttentionBackward : int32_t {
  kAuto = 0,      // the selector's rule (plan/select.h)
  kFused = 1,     // the tensor-core backward, wherever its kernels take the operands
  kComposed = 2,  // the per-edge pass and three SpMMs
};
inline constexpr NamedCode kAttentionBackwardCodes[] = {
    {"auto", int32_t(AttentionBackward::kAuto)},
    {"fused", int32_t(AttentionBackward::kFused)},
    {"composed", int32_t(AttentionBackward::kComposed)},
};

// Whether the codes of a list are 0, 1, ... in order (so that a code is valid iff it is below the
// list's length, and the handlers' range checks need no list of their own).
template <size_t N>
constexpr bool codes_in_order(const NamedCode (&codes)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (codes[i].code != int32_t(i)) return false;
  return true;
}
static_assert(codes_in_order(kKernelChoiceCodes) && codes_in_order(kPrecisionCodes) &&
              codes_in_order(kAttentionBackwardCodes));

template <size_t N, class Code>
constexpr const char* code_name(const NamedCode (&codes)[N], Code code) {
  return codes[size_t(code)].name;
}

template <size_t N>
constexpr int32_t code_count(const NamedCode (&)[N]) {
  return int32_t(N);
}

}  // namespace jaxsparse_tc
