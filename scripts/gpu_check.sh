#!/usr/bin/env bash
# One call on a GPU machine with no network: build in place, run the tests (GPU ones included),
# run the benchmarks, print a short table last. Usage:
#   scripts/gpu_check.sh [--tests-only | --bench-only] [--quick] [--sanitize]
#                        [--tests=PYTEST_ARGS] [--only=BENCH_NAME]
#   --tests="tests/test_gpu_spmm_sddmm.py --maxfail=20" runs those tests instead of all (-x);
#   --only=spmm_sddmm runs only the benchmark modules whose names contain it.
#   --profile="VARIANT ..." profiles one rmat17 fp16 d=128 SpMM per kernel variant with ncu
#   ("default" = no variant set), or "attn:GRAPH:D" one fused attention forward ("attnbwd:GRAPH:D"
#   its gradients' window kernel), and prints the key counters.
# Results: $OUT (default ./out) holds test logs and benchmark JSON.
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
tests=1; bench=1; quick=""; sanitize=0; pytest_args="-x tests"; only=""; profile=""

for a in "$@"; do
  case $a in
    --tests-only) bench=0 ;;
    --bench-only) tests=0 ;;
    --quick) quick="--quick" ;;
    --sanitize) sanitize=1 ;;
    --tests=*) pytest_args="${a#--tests=}" ;;
    --only=*) only="--only ${a#--only=}" ;;
    --profile=*) profile="${a#--profile=}" ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"

# Build for the machine's GPU only (fast); CI compiles every architecture.
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${arch:-90} -DJAXSPARSE_TC_CUDA=ON ${CMAKE_ARGS:-}"
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
python3 -c "import jaxsparse_tc as j; assert j.has_cuda(), 'CUDA extension missing'; print('cuda extension ok')"

status=0
if [ $tests = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider $pytest_args 2>&1 | tee "$OUT/tests.log" | tail -30
  status=${PIPESTATUS[0]}
fi
if [ $sanitize = 1 ]; then
  timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize_case.py \
    2>&1 | tee "$OUT/sanitizer.log" | tail -15
fi
stall=smsp__average_warps_issue_stalled
NCU_METRICS="smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,\
lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,dram__bytes_read.sum,lts__t_sectors.sum,\
${stall}_long_scoreboard_per_issue_active.ratio,${stall}_short_scoreboard_per_issue_active.ratio,\
${stall}_mio_throttle_per_issue_active.ratio,${stall}_lg_throttle_per_issue_active.ratio,\
${stall}_wait_per_issue_active.ratio,${stall}_math_pipe_throttle_per_issue_active.ratio,\
${stall}_barrier_per_issue_active.ratio,${stall}_not_selected_per_issue_active.ratio,\
${stall}_no_instruction_per_issue_active.ratio,${stall}_dispatch_stall_per_issue_active.ratio,\
${stall}_membar_per_issue_active.ratio,${stall}_branch_resolving_per_issue_active.ratio"
# --profile entries: "default", "fp16|bf16|fp32" (default kernel, that dtype), "tc"
# (JAXSPARSE_TC_SPMM_VARIANT), "K=V:K=V" (JAXSPARSE_TC_SPMM_K),
# "cusparse-fp32" / "cusparse-fp16" (torch.sparse.mm on the same matrix),
# "attn:GRAPH:D" (the fused attention forward, fp16, H=4: scripts/profile_attention.py),
# "attnbwd:GRAPH:D" (the tensor-core gradients' window kernel of the same).
for v in $profile; do
  echo "== ncu: $v"
  envs=(); args=(fp16 128); kre="regex:spmm_"; script=scripts/profile_spmm.py
  case $v in
    attn:*) IFS=: read -r _ g dd <<< "$v"; args=($g $dd); kre="regex:attn_fwd"
            script=scripts/profile_attention.py ;;
    attnbwd:*) IFS=: read -r _ g dd <<< "$v"; args=($g $dd 4 bwd); kre="regex:grads_windows"
            script=scripts/profile_attention.py ;;
    default) ;;
    fp16|bf16|fp32) args=($v 128) ;;
    cusparse-*) args=(${v#cusparse-} 128 torch); kre="regex:csrmm|spmm|SpMM|cusparse" ;;
    *=*) for kv in ${v//:/ }; do  # K=V: JAXSPARSE_TC_SPMM_K (JAXSPARSE_TC_K for ROWS_*)
           case $kv in ROWS_*) envs+=("JAXSPARSE_TC_$kv") ;; *) envs+=("JAXSPARSE_TC_SPMM_$kv") ;; esac
         done ;;
    *) envs+=("JAXSPARSE_TC_SPMM_VARIANT=$v") ;;
  esac
  env "${envs[@]}" timeout 120 ncu --clock-control none -k "$kre" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --metrics "$NCU_METRICS" \
    python3 $script "${args[@]}" > "$OUT/ncu_${v//[=:]/_}.log" 2>&1
  grep -E "  void|Duration|Throughput|Hit Rate|Achieved Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Block Limit Shared|sectors|requests|inst_executed|dram__bytes|stalled" \
    "$OUT/ncu_${v//[=:]/_}.log" | grep -v "^ *[a-z_]*stalled.* 0$" | cut -c1-150
done
if [ $bench = 1 ]; then
  python3 benchmarks/run.py $quick $only 2>&1 | tee "$OUT/bench.log"
fi
exit $status
