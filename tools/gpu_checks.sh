#!/usr/bin/env bash
# Issue 30's GPU checks, as one short script for a session lent a GPU machine (the `device` tool's
# `run`): its image has python3 with torch, but not simpy or cyclonedds, and the data sets do not
# travel.  Prepare here, in the checkout, once:
#
#   echo /.whl/ >> .git/info/exclude; echo /.gpudata/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl simpy==4.1.1 cyclonedds==11.0.1 rich-click   # (the image has torch, numpy, pyyaml, rich, pytest)
#   mkdir -p .gpudata/MNIST && cp -r ../shared/data/MNIST/raw .gpudata/MNIST/
#
# then run it there:  run(command="bash tools/gpu_checks.sh", carry=[".whl", ".gpudata"], timeout_s=540)
# What it prints and writes under $OUT: the GPU tests (tests/test_device.py, which skip without
# one), the ResNet-18 benchmark on the GPU and on the CPU of the same machine (tools.bench_tasks),
# and, where cyclonedds installed, a real launch of a small FL run on the GPU.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD   # (dtemu/ links the folders as the installed namespace has them)
fi
export DTEMU_DATA=$PWD/.gpudata PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee -a "$OUT/gpu.txt"

echo "== the GPU tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_device.py 2>&1 | tee "$OUT/tests.txt"

echo "== ResNet-18 virtual clients against a bare loop (synthetic CIFAR-10), GPU then CPU"
for dev in cuda cpu; do
    timeout 150 python3 -m tools.bench_tasks --synthetic --clients 8 --samples 256 --batch 32 --threads 8 \
        --repeat 2 --device $dev 2>&1 | tee "$OUT/bench_$dev.json"
done

if python3 -c "import cyclonedds" 2>/dev/null; then
    echo "== real launch, one GPU, a small FL run"
    cat > /tmp/gpu_fl.yaml <<'EOF'
name: gpu_fl
device: cuda
model: small_cnn
data: {dataset: mnist, test_samples: 1000}
fl: {clients: 2, rounds: 2, subset: 512, round_timeout_s: 60}
EOF
    timeout 120 python3 -m dtemu.real.cli launch /tmp/gpu_fl.yaml --out /tmp/gpu_real --no-tui --gpus 0 \
        --time-scale 1 2>&1 | tail -5
    timeout 120 python3 -m dtemu.emu.cli run /tmp/gpu_fl.yaml --out /tmp/gpu_emu --no-tui 2>&1 | tail -2
    python3 - <<'EOF' | tee "$OUT/real.txt"
import json
real, emu = (json.load(open(f"/tmp/gpu_{m}/summary.json")) for m in ("real", "emu"))
print({k: (real.get(k), emu.get(k)) for k in ("device", "rounds", "final_accuracy", "model_sha256")})
EOF
fi
