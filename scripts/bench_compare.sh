#!/usr/bin/env bash
# Before/after timing of two source trees on one GPU in one call (a change's cost or gain):
# builds BASE and this checkout in place (CPU and CUDA extensions for this GPU; no pip, so the
# two never shadow each other), runs the same bench_kernels arguments in each, alternating for
# ROUNDS rounds, then prints per-row ratios (benchmarks/compare.py). Each tree runs its own
# benchmark code; BASE gets this checkout's shared/ (the benchmark graphs).
#   bash scripts/bench_compare.sh BASE_TREE ROUNDS BENCH_KERNELS_ARGS...   (ROUNDS 0: build only)
# e.g. BASE_TREE from `git archive <commit> | tar -x -C .base` (an ignored folder, carried).
set -uo pipefail
export PYTHONUNBUFFERED=1
base=$(cd "$1" && pwd); rounds=$2; shift 2
here=$(pwd)
export OUT=${OUT:-$here/out}
mkdir -p "$OUT"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
build() {  # $1: tree, $2: log name
  (cd "$1" && cmake -S . -B build/compare -G Ninja -DJAXSPARSE_TC_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" -DPython_EXECUTABLE="$(command -v python3)" \
      && cmake --build build/compare -j "$(nproc)" && cmake --install build/compare --prefix .) \
    > "$OUT/build_$2.log" 2>&1 || { tail -30 "$OUT/build_$2.log"; exit 1; }
}
[ -e "$base/shared" ] || ln -s "$here/shared" "$base/shared"
build "$base" base &
build "$here" after &
wait
for r in $(seq 1 "$rounds"); do
  for side in base after; do
    tree=$base; [ $side = after ] && tree=$here
    (cd "$tree" && PYTHONPATH="$tree" python3 -m benchmarks.bench_kernels "$@" \
      --json "$OUT/compare_${side}_$r.json" > "$OUT/compare_${side}_$r.log" 2>&1) \
      || { echo "$side round $r failed"; tail -20 "$OUT/compare_${side}_$r.log"; }
  done
done
if [ "$rounds" -gt 0 ]; then
  python3 -m benchmarks.compare "$OUT"/compare_base_*.json -- "$OUT"/compare_after_*.json \
    | tee "$OUT/compare.md"
fi
