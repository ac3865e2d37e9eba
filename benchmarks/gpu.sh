#!/usr/bin/env bash
# One GPU: ResNet-50 on CIFAR-shaped data (and optionally the MLP), stratax and Keras `fit`
# against a hand-written jax.jit loop and PyTorch; samples/s and MFU. Not run in CI.
#
#   bash benchmarks/gpu.sh                     # on the GPU machine, about 5-7 minutes
#   bash benchmarks/gpu.sh --cpu-smoke         # here, on CPU: every code path, tiny sizes
#   bash benchmarks/gpu.sh --workloads resnet50,mlp --reps 5   # more (see gpu_bench.py)
#
# Made for a machine without network and without Keras (the GPU machine's image: Python 3.12,
# jax with CUDA, torch + torchvision, no keras, no TensorFlow): if Keras is not importable and
# .whl/ holds wheels (bash benchmarks/fetch_gpu_wheels.sh, run where there is network), they
# are installed into a private folder first. TensorFlow rows read "not available on this
# machine" there. Results: benchmarks/results/gpu_bench.{json,md} (gpu_bench_smoke.* for the
# smoke test).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export KERAS_BACKEND=jax
if ! "$PYTHON" -c "import keras" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "gpu.sh: keras is not importable and .whl/ holds no wheels; run" \
             "bash benchmarks/fetch_gpu_wheels.sh where there is network and carry .whl/" >&2
        exit 2
    fi
    SITE="${GPU_WHEEL_SITE:-/tmp/stratax-gpu-site}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
GPUS_GIVEN="${CUDA_VISIBLE_DEVICES:-}"   # the model-parallel run below uses all of them
case " $* " in
    *" --cpu-smoke "*) ;;
    *) export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"   # one GPU
       command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
           --format=csv,noheader || true ;;
esac
"$PYTHON" -m benchmarks.workloads.gpu_bench "$@"
# Model vs data parallelism (MirroredStrategy with cores_per_replica and a LayoutMap, the layouts
# TPUStrategy uses) over every GPU; it needs 2 or more, and says so on a one-GPU machine.
case " $* " in
    *" --cpu-smoke "*) "$PYTHON" -m benchmarks.workloads.tpu --model-parallel --platform cpu --devices 2 \
                           --quick --reps 1 ;;
    *) if [ -n "$GPUS_GIVEN" ]; then export CUDA_VISIBLE_DEVICES="$GPUS_GIVEN"
       else unset CUDA_VISIBLE_DEVICES; fi
       GPUS=$("$PYTHON" -c "import jax; print(len(jax.devices('gpu')))" 2>/dev/null || echo 0)
       "$PYTHON" -m benchmarks.workloads.tpu --model-parallel --platform gpu --devices "$GPUS" --reps 3 ;;
esac
