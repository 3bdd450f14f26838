#!/usr/bin/env bash
# Every GPU check in one run, for a GPU machine that has torch, Triton and transformers:
#   1. the kernel tests with the compiled kernels (`gpu` tests included),
#   2. benchmarks/kernels_gpu.py (each kernel against its torch twin and masked SDPA),
#   3. benchmarks/fused_prefill_gpu.py (fused vs full prefill at Llama-3-8B shapes).
# Logs and the result tables land in $OUT (default: gpu-results/). Wheels of the pure-Python
# dependencies the machine lacks (pydantic and its own) can sit in .whl/; they are installed
# into a scratch folder first. Each step has its own time limit, so one hang cannot eat the run.
set -u
out=${OUT:-gpu-results}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/adarag-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/adarag-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$out/gpu.txt"

echo "== kernel tests"
timeout "${TESTS_S:-200}" python3 -m pytest -o addopts="" -p no:cacheprovider -q -rs \
    -n "${WORKERS:-8}" tests/kernels >"$out/kernel_tests.log" 2>&1
echo "exit $?" >>"$out/kernel_tests.log"
tail -n 25 "$out/kernel_tests.log"

echo "== kernels_gpu"
(cd benchmarks && timeout "${KERNELS_S:-150}" python3 kernels_gpu.py \
    --contexts 2048 8192 32768 --ratios 0.05 0.15 0.30 --reps 10 --sweep-tiles) \
    >"$out/kernels_gpu.log" 2>&1
echo "exit $?" >>"$out/kernels_gpu.log"
tail -n 4 "$out/kernels_gpu.log"

echo "== fused_prefill_gpu"
(cd benchmarks && timeout "${FUSED_S:-280}" python3 fused_prefill_gpu.py) >"$out/fused.log" 2>&1
echo "exit $?" >>"$out/fused.log"
tail -n 30 "$out/fused.log"
cp benchmarks/results/kernels-gpu/{kernels_gpu,fused_prefill_gpu}.{md,json} "$out/" 2>/dev/null
true
