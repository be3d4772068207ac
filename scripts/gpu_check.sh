#!/usr/bin/env bash
# One call on a GPU machine with no network: build in place, run the tests (GPU ones included),
# optionally the memory checker, then the benchmark suite; a short table last. Usage:
#   bash scripts/gpu_check.sh [--tests-only | --bench-only] [--quick] [--sanitize[=K]]
#                             [--tests="PYTEST_ARGS"] [--bench="BENCH_CHAINED_ARGS"]
#                             [--profile="spmm:DTYPE:D[:KERNEL:GRAPH:ORDER] attn:GRAPH:D attnbwd:GRAPH:D"]
#   --tests="tests/test_gpu_spmm_sddmm.py --maxfail=20" runs those tests instead of all (-x);
#   --bench="--graphs cora,rmat17-d16 --ops spmm" passes arguments to benchmarks/bench_chained.py;
#   --profile runs ncu on one kernel per entry and prints its key counters;
#   --sanitize runs scripts/sanitize_case's parts under compute-sanitizer; --sanitize=K runs the
#   non-corrupt parts in one process and the corrupt cases in K processes side by side.
#   --wheel=PATH installs that wheel into a fresh venv (system site packages: the machine's jax)
#   instead of building, takes nvcc off PATH and runs everything from a copy of tests/, scripts/
#   and benchmarks/ outside the source tree, so the installed wheel is what is tested.
# Results: $OUT (default ./out) holds the build and test logs, the suite's JSON and its plot.
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
tests=1; bench=1; quick=""; sanitize=0; pytest_args="-x tests"; bench_args=""; profile=""; wheel=""

for a in "$@"; do
  case $a in
    --tests-only) bench=0 ;;
    --bench-only) tests=0 ;;
    --quick) quick="--quick" ;;
    --sanitize) sanitize=1 ;;
    --sanitize=*) sanitize="${a#--sanitize=}" ;;
    --tests=*) pytest_args="${a#--tests=}" ;;
    --bench=*) bench_args="${a#--bench=}" ;;
    --profile=*) profile="${a#--profile=}" ;;
    --wheel=*) wheel=$(realpath "${a#--wheel=}") ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"

sanitizer_bin=$(command -v compute-sanitizer || true)
if [ -n "$wheel" ]; then
  venv=$(mktemp -d)/venv
  python3 -m venv --system-site-packages "$venv"
  # When the machine's python3 is itself a venv, --system-site-packages does not reach its
  # packages: a .pth file adds them (after the new venv's own).
  python3 -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$venv/bin/python3" -c 'import site; print(site.getsitepackages()[0])')/machine.pth"
  "$venv/bin/pip" install --no-deps --no-index "$wheel" > "$OUT/build.log" 2>&1 \
    || { tail -20 "$OUT/build.log"; exit 1; }
  PATH="$venv/bin:$(tr : '\n' <<< "$PATH" | grep -v -i cuda | paste -sd:)"
  work=$(mktemp -d)
  cp -r tests scripts benchmarks "$work"/
  [ -d shared ] && ln -s "$PWD/shared" "$work/shared"
  cd "$work"
  echo "wheel $(basename "$wheel") in $venv; nvcc on PATH: $(command -v nvcc || echo no)"
  python3 -c "import jaxsparse_tc as j, sys; f = j.__file__; print('imported', f); \
assert f.startswith(sys.prefix), 'not the wheel'"
else
  # Build for the machine's GPU only (fast); CI compiles every architecture.
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${arch:-90} -DJAXSPARSE_TC_CUDA=ON ${CMAKE_ARGS:-}"
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
    || { tail -50 "$OUT/build.log"; exit 1; }
fi
python3 -c "import jaxsparse_tc as j; assert j.has_cuda(), 'CUDA extension missing'; print('cuda extension ok')"

status=0
# XLA's command buffers (CUDA graphs) are off under the memory checker: it does not follow
# kernels launched from a graph.
sanitizer=(env XLA_FLAGS="--xla_gpu_enable_command_buffer= ${XLA_FLAGS:-}"
           "$sanitizer_bin" --tool memcheck --error-exitcode 3)
if [ "$sanitize" = 1 ]; then
  timeout ${SANITIZE_TIMEOUT:-300} "${sanitizer[@]}" \
    python3 -m scripts.sanitize_case 2>&1 | tee "$OUT/sanitizer.log" | tail -15
elif [ "$sanitize" -gt 1 ] 2>/dev/null; then
  # Compiling under the memory checker is slow (XLA's autotuner runs kernels there): the
  # programs are compiled once without it into a persistent cache that the checked runs load.
  cache=(--compilation-cache "$OUT/jax_cache")
  XLA_FLAGS="--xla_gpu_enable_command_buffer= ${XLA_FLAGS:-}" timeout 200 \
    python3 -m scripts.sanitize_case main streams grads "${cache[@]}" 2>&1 | tail -1 &
  XLA_FLAGS="--xla_gpu_enable_command_buffer= ${XLA_FLAGS:-}" timeout 200 \
    python3 -m scripts.sanitize_case corrupt --compile-only "${cache[@]}" 2>&1 | tail -1
  wait
  timeout ${SANITIZE_TIMEOUT:-300} "${sanitizer[@]}" python3 -m scripts.sanitize_case \
    main streams grads "${cache[@]}" > "$OUT/sanitizer_main.log" 2>&1 &
  for i in $(seq 0 $((sanitize - 1))); do
    timeout ${SANITIZE_TIMEOUT:-300} "${sanitizer[@]}" python3 -m scripts.sanitize_case \
      corrupt --shard "$i/$sanitize" "${cache[@]}" > "$OUT/sanitizer_corrupt_$i.log" 2>&1 &
  done
  wait_sanitizer=1
fi
if [ $tests = 1 ]; then
  timeout ${TESTS_TIMEOUT:-3000} python3 -m pytest -q --tb=short -p no:cacheprovider $pytest_args \
    2>&1 | tee "$OUT/tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "${wait_sanitizer:-0}" = 1 ]; then
  wait
  for f in "$OUT"/sanitizer_main.log "$OUT"/sanitizer_corrupt_*.log; do
    echo "$(basename "$f"): $(grep -c '^corrupt:' "$f") graph/dtype slices done;" \
      "$(grep -E 'ERROR SUMMARY|sanitize_case:|sanitize case ok' "$f" | tr '\n' ' ')"
  done
fi
stall=smsp__average_warps_issue_stalled
NCU_METRICS="smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,\
${stall}_long_scoreboard_per_issue_active.ratio,${stall}_short_scoreboard_per_issue_active.ratio,\
${stall}_mio_throttle_per_issue_active.ratio,${stall}_lg_throttle_per_issue_active.ratio,\
${stall}_barrier_per_issue_active.ratio,${stall}_math_pipe_throttle_per_issue_active.ratio"
for v in $profile; do
  echo "== ncu: $v"
  IFS=: read -r kind a b c e f <<< "$v"
  case $kind in
    spmm) kre="regex:spmm_"
      cmd=(python3 -m scripts.profile_spmm "${a:-fp16}" "${b:-128}" "${c:-auto}" "${e:-rmat17-d16}" "${f:-none}") ;;
    attn) kre="regex:attn_fwd"; cmd=(python3 -m scripts.profile_attention "$a" "$b") ;;
    attnbwd) kre="regex:grads_windows"; cmd=(python3 -m scripts.profile_attention "$a" "$b" 4 bwd) ;;
    *) echo "unknown profile entry $v"; continue ;;
  esac
  timeout 120 ncu --clock-control none -k "$kre" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --metrics "$NCU_METRICS" \
    "${cmd[@]}" > "$OUT/ncu_${v//:/_}.log" 2>&1
  grep -E "  void|Duration|Throughput|Hit Rate|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|sectors|inst_executed|dram__bytes|stalled" \
    "$OUT/ncu_${v//:/_}.log" | grep -v "^ *[a-z_]*stalled.* 0$" | cut -c1-150
done
if [ $bench = 1 ]; then
  python3 -m benchmarks.bench_chained $quick $bench_args --json "$OUT/suite.json" \
    --plot "$OUT/speedup.png" 2>&1 | tee "$OUT/bench.log" | grep -v "^[a-zA-Z0-9-]* .* us (wall"
fi
exit $status
