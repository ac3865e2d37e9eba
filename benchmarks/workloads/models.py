"""Models, synthetic data and initial weights, identical for every system.

Data are made once by the parent with numpy and saved as ``.npy`` files that every child
loads, so all systems see the same bytes in the same order. Labels come from a fixed random
linear "teacher", so the task is learnable and the loss visibly falls. Initial weights are
drawn with numpy from a fixed seed (Glorot-uniform for every kernel, framework defaults for
1-D parameters, which are deterministic: zeros, ones), so every system starts from the same
point and the final losses are comparable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.configs import GLOBAL_BATCH, SEED, Mode, Workload


def data_paths(cache_dir: Path, workload: Workload, mode: Mode, spe: int) -> tuple[Path, Path]:
    """Return the (x, y) ``.npy`` paths of ``workload``'s data for ``mode`` and ``spe``."""
    per_epoch, _ = workload.steps(mode, spe)
    n = per_epoch * GLOBAL_BATCH
    stem = f"{workload.name}-n{n}-seed{SEED}-v2"
    return cache_dir / "data" / f"{stem}.x.npy", cache_dir / "data" / f"{stem}.y.npy"


def ensure_data(cache_dir: Path, workload: Workload, mode: Mode, spe: int) -> tuple[Path, Path]:
    """Create (once) and return the data files of ``workload`` for ``mode`` and ``spe``.

    One epoch holds exactly ``steps per epoch * GLOBAL_BATCH`` samples, so no batch is partial.
    Smaller sets are prefixes of larger ones (same seed, same teacher).
    """
    x_path, y_path = data_paths(cache_dir, workload, mode, spe)
    if x_path.exists() and y_path.exists():
        return x_path, y_path
    per_epoch, _ = workload.steps(mode, spe)
    n = per_epoch * GLOBAL_BATCH
    dim = int(np.prod(workload.input_shape))
    teacher = np.random.default_rng(SEED + 7).standard_normal((dim, workload.num_classes),
                                                                dtype=np.float32)
    x = np.random.default_rng(SEED).standard_normal((n, *workload.input_shape), dtype=np.float32)
    y = np.argmax(x.reshape(n, dim) @ teacher, axis=1).astype(np.int32)
    x_path.parent.mkdir(parents=True, exist_ok=True)
    for path, array in ((x_path, x), (y_path, y)):
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, array)
        tmp.replace(path)
    return x_path, y_path


def build_model(keras: Any, workload: Workload) -> Any:
    """Build ``workload``'s model with the given ``keras`` module (tf.keras or Keras 3 on JAX)."""
    layers = keras.layers
    if workload.name == "mlp":
        stack = [layers.Dense(128, activation="relu"), layers.Dense(10)]
    elif workload.name == "wide_mlp":
        stack = [layers.Dense(1024, activation="relu"), layers.Dense(1024, activation="relu"),
                 layers.Dense(10)]
    elif workload.name == "cnn":
        stack = [layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
                 layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
                 layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10)]
    elif workload.name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=workload.input_shape,
                                           classes=workload.num_classes,
                                           classifier_activation=None)
    else:
        raise ValueError(f"Unknown workload {workload.name!r}; expected one of mlp, wide_mlp, "
                         "cnn, resnet50.")
    return keras.Sequential([keras.Input(shape=workload.input_shape), *stack])


def initial_weights(shapes: list[tuple[int, ...]], current: list[np.ndarray]) -> list[np.ndarray]:
    """Glorot-uniform kernels from ``SEED`` for every array of rank >= 2; others kept as is.

    Args:
        shapes: shapes of ``model.get_weights()``, in order.
        current: the model's current values (used for rank-1 parameters: biases, BN stats).
    """
    rng = np.random.default_rng(SEED + 1)
    out = []
    for shape, value in zip(shapes, current, strict=True):
        if len(shape) < 2:
            out.append(np.asarray(value, dtype=np.float32))
            continue
        receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        out.append(((rng.random(shape) * 2.0 - 1.0) * limit).astype(np.float32))
    return out
