#!/usr/bin/env bash
# One prepared run for a lent CUDA GPU (an H200 here): kernel checks on CUDA, HBM bandwidth, the
# decode-step roofline sweep of a ~1B bf16 Llama at B = 1..256, and throughput vs transformers.
# Usage (repository root): bash benchmarks/gpu/run.sh     -> JSON under $OUT, else benchmarks/results/
# Budget: at most 10 minutes (the two timeouts below: 180 s of kernel tests, 420 s of benchmark).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"

# The device image has torch, triton and transformers but not this package: install it, without its
# dependencies and with the image's own setuptools (>= 77; nothing can be fetched there), into a
# temporary folder on PYTHONPATH.
if ! "$PY" -c "import specfleet.engine" 2>/dev/null; then
  SITE=$(mktemp -d)
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" . ; then
    echo "cannot install specfleet here (needs pip and setuptools >= 77 in the image)" >&2
    exit 1
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$RESULTS/gpu_info.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$RESULTS/gpu_info.txt"

echo "== kernel tests compiled for CUDA (the interpreter suite, on the GPU)"
SPECFLEET_KERNEL_TESTS_ON_CUDA=1 timeout 180 "$PY" -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
  tests/kernels/test_paged_attention.py tests/kernels/test_reshape_and_cache.py 2>&1 | tee "$RESULTS/gpu_kernel_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== benchmark"
timeout 420 "$PY" benchmarks/gpu/bench_decode.py --out "$RESULTS/gpu_decode.json" 2>&1 | tee "$RESULTS/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "kernel tests rc=$tests_rc  bench rc=$bench_rc"
exit $(( tests_rc != 0 || bench_rc != 0 ))
