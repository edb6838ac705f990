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
# A dry run here, on the stand-in GPU of tests/fake_cuda.py (the CPU, refusing what CUDA refuses), without
# the benchmark:  PATH=$PWD/.venv/bin:$PATH DTEMU_FAKE_CUDA=1 DTEMU_DATA=../shared/data bash tools/gpu_checks.sh
# What it prints and writes under $OUT: the GPU tests (tests/test_device.py, which skip without
# one), the ResNet-18 benchmark on the GPU and on the CPU of the same machine (tools.bench_tasks),
# and, where cyclonedds installed, a real launch of a small fl, ddp and geo run on the GPU beside emu's.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
SITE=$(mktemp -d /tmp/dtemu-site.XXXX)
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
# The checkout is not installed there, so its entry points (the CLIs' verbs: report, audit, soak) are
# declared by hand, as pip would from pyproject.toml; dtemu/ links the folders as the namespace has them.
python3 - "$SITE" <<'EOF'
import pathlib, sys, tomllib
info = pathlib.Path(sys.argv[1]) / "dtemu-0.0.0.dist-info"
info.mkdir()
(info / "METADATA").write_text("Metadata-Version: 2.1\nName: dtemu\nVersion: 0.0.0\n")
groups = tomllib.load(open("pyproject.toml", "rb"))["project"].get("entry-points", {})
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) for group, points in groups.items()))
EOF
export PYTHONPATH=$SITE:$PWD
FAKE=${DTEMU_FAKE_CUDA:-}
if [ "$FAKE" = 1 ]; then   # every python3 below installs the stand-in as it starts
    export PYTHONPATH=$PWD/tests/fake_cuda_site:$PYTHONPATH
fi
export DTEMU_DATA=${DTEMU_DATA:-$PWD/.gpudata} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    | tee -a "$OUT/gpu.txt"

echo "== the GPU tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_device.py 2>&1 | tee "$OUT/tests.txt"

echo "== ResNet-18 virtual clients against a bare loop (synthetic CIFAR-10), GPU then CPU"
for dev in $([ "$FAKE" = 1 ] || echo cuda cpu); do
    timeout 150 python3 -m tools.bench_tasks --synthetic --clients 8 --samples 256 --batch 32 --threads 8 \
        --repeat 2 --device $dev 2>&1 | tee "$OUT/bench_$dev.json"
done

if python3 -c "import cyclonedds" 2>/dev/null; then
    echo "== real launch, one GPU, a small run of fl, ddp and geo, beside emu on the same GPU"
    rm -rf /tmp/gpu; mkdir -p /tmp/gpu
    common='"device": "cuda", "model": "small_cnn", "seed": 1, "threads": 2, "data": {"dataset": "mnist", "test_samples": 1000}'
    echo "{\"name\": \"gpu_fl\", $common, \"fl\": {\"clients\": 2, \"rounds\": 2, \"subset\": 512, \"round_timeout_s\": 60}}" > /tmp/gpu/fl.json
    echo "{\"name\": \"gpu_ddp\", $common, \"mode\": \"ddp\", \"ddp\": {\"workers\": 2, \"epochs\": 1, \"batch_size\": 32, \"max_steps\": 40, \"compression\": \"dgc\", \"density\": 0.01, \"momentum\": 0.9}}" > /tmp/gpu/ddp.json
    echo "{\"name\": \"gpu_geo\", $common, \"mode\": \"geo\", \"network\": {\"sites\": {\"central\": {}, \"a\": {}, \"b\": {}}}, \"geo\": {\"workers_per_site\": 1, \"rounds\": 8, \"eval_every\": 4, \"batch_size\": 32, \"compression\": \"bisparse_fp16\", \"round_timeout_s\": 30}}" > /tmp/gpu/geo.json
    for m in fl ddp geo; do
        timeout 100 python3 -m dtemu.real.cli launch /tmp/gpu/$m.json --out /tmp/gpu/$m-real --no-tui --gpus 0 \
            --time-scale 1 2>&1 | tail -2
        timeout 60 python3 -m dtemu.emu.cli run /tmp/gpu/$m.json --out /tmp/gpu/$m-emu --no-tui 2>&1 | tail -1
    done
    python3 - <<'EOF' | tee "$OUT/real.txt"
import json
for m in ("fl", "ddp", "geo"):
    try:
        real, emu = (json.load(open(f"/tmp/gpu/{m}-{r}/summary.json")) for r in ("real", "emu"))
    except OSError as err:
        print(m, "no summary:", err)
        continue
    print(m, {k: (real.get(k), emu.get(k)) for k in ("device", "final_accuracy", "model_sha256")})
EOF
fi
