#!/usr/bin/env bash
# Benchmarks on ONE GPU: MLP and CNN (steps_per_execution 1 and 32) and ResNet-50 on
# CIFAR-shaped synthetic data, TF vs Keras 3 on JAX vs stratax. Not run in CI; needs a CUDA GPU.
#
#   bash benchmarks/gpu.sh                # quick GPU run, about 5-8 minutes
#   bash benchmarks/gpu.sh --reps 5       # extra arguments go to `python -m benchmarks run`
#
# Needs JAX with CUDA in the project's environment (e.g. `pip install "jax[cuda12]"`, same
# jax version as stratax uses). TensorFlow for GPU (tensorflow[and-cuda] + tf-keras) is
# installed by the harness into benchmarks/.venvs/tf-gpu/ on first use (needs a package
# index); without it the TF rows read "not installed: <reason>".
# Results: benchmarks/results/gpu.{json,md,png} and gpu_resnet50.{json,md,png}.
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"   # a single GPU
python - <<'PY'
import os
os.environ.setdefault("KERAS_BACKEND", "jax")
import jax
platforms = {d.platform for d in jax.devices()}
if "gpu" not in platforms:
    raise SystemExit(f"gpu.sh: JAX sees {sorted(platforms)}, no GPU; install jax with CUDA "
                     "support (pip install 'jax[cuda12]') and check CUDA_VISIBLE_DEVICES.")
print(f"gpu.sh: JAX {jax.__version__} on {jax.devices()[0].device_kind}")
PY
python -m benchmarks run --quick --only gpu,gpu_resnet50 "$@"
