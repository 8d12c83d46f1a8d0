#!/usr/bin/env bash
# The GPU checks, as one short script for a lent GPU machine (the `device` tool runs it in the repository root):
#   bash benchmarks/gpu_check.sh
# Installs the project on the machine's Python, checks that CUDA is visible, runs the engine tests that can use it
# and the backend benchmarks on cuda, writing their output under $OUT (or ./gpu-results). vLLM's CUDA build goes in
# an environment of its own (its pins clash with ours) and the sampling benchmark runs through it too.
set -euo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
python3 -m venv /tmp/gpu-venv
. /tmp/gpu-venv/bin/activate
pip install -q --upgrade pip
# The CUDA torch wheel of the pinned version, then the project without letting pip swap torch.
pip install -q "torch==2.13.0"
pip install -q -e ".[dev]"
python - <<'PY' | tee "$OUT/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
PY
python3 -m venv /tmp/vllm-venv
/tmp/vllm-venv/bin/pip install -q "vllm==0.33.0"
python -m benchmarks.backend_gemma --device cuda --batch 8 --tokens 128 --repeats 3 --vllm-python /tmp/vllm-venv/bin/python \
  | tee "$OUT/backend_gemma.txt"
python -m benchmarks.cross_tenant_batching --device cuda --repeats 3 --vllm-python /tmp/vllm-venv/bin/python \
  | tee "$OUT/cross_tenant_batching.txt"
python -m benchmarks.duty_cycle --model google/gemma-3-270m --device cuda --concurrency 1 3 --steps 4 \
  --plot "$OUT/duty_cycle_gemma_cuda.png" | tee "$OUT/duty_cycle.txt"
python -m benchmarks.duty_cycle --model google/gemma-3-270m --device cuda --concurrency 1 3 --steps 4 \
  --no-sequential --vllm-python /tmp/vllm-venv/bin/python --plot "$OUT/duty_cycle_gemma_cuda_vllm.png" \
  | tee "$OUT/duty_cycle_vllm.txt"
# Two trials of one key (issue 48): their device shares and the makespan together against one after the other, where
# the device has room to spare (on a 2-core CPU it has little).
python -m benchmarks.trial_pair --model google/gemma-3-270m --steps 6 --eval-interval 3 --eval-size 64 --serial \
  --plot "$OUT/trial_pair_shares.png" \
  | tee "$OUT/trial_pair.txt"
# The sharded backend (issue 49), where the machine has two GPUs or more: one process against a group of one process
# per GPU, NCCL gathering each decoder layer's weights.
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -ge 2 ]; then
  python -m pytest -q tests/trainer_backend/test_sharded_engine.py tests/trainer_backend/test_sharded_server.py \
    tests/trainer_backend/test_sharded_loading.py \
    | tee "$OUT/sharded_tests.txt"  # the parity tests, on CPU processes over gloo
  python -m benchmarks.sharded --model Qwen/Qwen2.5-Coder-0.5B-Instruct --shards "$GPUS" --device cuda \
    | tee "$OUT/sharded.txt"
fi
