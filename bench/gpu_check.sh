#!/usr/bin/env bash
# The device check, start to end, on a CUDA machine with python3, torch, triton, numpy,
# pybind11 and a compiler (no internet): build the native extension, install any carried
# wheels (e.g. xgrammar's) into /tmp/site without their dependencies, run bench/gpu_check.py.
# Results: $OUT/gpu_check.json and $OUT/gpu_check.log ($OUT defaults to bench/results).
# Run from anywhere: bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  echo "== $(date -u +%FT%TZ) $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' || true
  echo "== build the native extension"
  if ! python3 setup.py -q build_ext --inplace; then
    # An older setuptools may refuse pyproject.toml's metadata; the extension needs none of it.
    echo "== setup.py failed; compiling the extension directly"
    suffix="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    c++ -O3 -Wall -shared -fPIC -std=c++17 -pthread $(python3 -m pybind11 --includes) \
      -Inative/include native/src/*.cpp -o "serving/constraints/_native$suffix"
  fi
  mapfile -t wheels < <(find . -maxdepth 3 -type f -name '*.whl' -not -path './.venv/*' | sort)
  if ((${#wheels[@]})); then
    echo "== install carried wheels into /tmp/site: ${wheels[*]}"
    if python3 -m pip install -q --no-deps --no-index --target /tmp/site "${wheels[@]}"; then
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
      echo "== wheel install failed: the peers they carry are skipped"
    fi
  else
    echo "== no wheels carried: xgrammar is skipped unless already installed"
  fi
  echo "== bench/gpu_check.py"
  timeout 480 python3 bench/gpu_check.py --out "$out/gpu_check.json"
} 2>&1 | tee "$out/gpu_check.log"
