#!/usr/bin/env bash
# Downloads, here (with network), the wheels that the GPU machine lacks: Keras and the parts of
# its dependencies that its image does not hold (namex, optree). They land in .whl/ at the
# repository root (git-ignored) for Python 3.12 on x86-64 Linux; gpu.sh installs them there
# with `pip install --no-index --no-deps --target`. The image already holds absl-py, h5py,
# ml-dtypes, numpy, packaging and rich (the device notes' package list).
#
#   bash benchmarks/fetch_gpu_wheels.sh            # then carry .whl with the run
set -euo pipefail
cd "$(dirname "$0")/.."
KERAS_VERSION="${KERAS_VERSION:-$(python -c 'import importlib.metadata as m; print(m.version("keras"))')}"
mkdir -p .whl
rm -f .whl/*.whl
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl \
    "keras==${KERAS_VERSION}" namex optree
ls -l .whl
for w in .whl/keras-*.whl; do
    echo "keras needs (the image must hold the others):"
    unzip -p "$w" '*/METADATA' | grep '^Requires-Dist' | grep -v extra
done
