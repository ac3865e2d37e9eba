"""The classifiers ``stratax train`` can build for the 8x8 digits (``--model mlp`` / ``cnn``)."""

from __future__ import annotations

from collections.abc import Callable

import keras

NUM_CLASSES = 10


def build_mlp() -> keras.Model:
    """64 -> Dense(128, relu) -> Dense(64, relu) -> Dense(10) logits, on flattened images."""
    return keras.Sequential(
        [
            keras.Input((64,), name="pixels"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(NUM_CLASSES, name="logits"),
        ],
        name="digits_mlp",
    )


def build_cnn() -> keras.Model:
    """A small Conv2D network on ``(8, 8, 1)`` images, ending in 10 logits."""
    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="pixels"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(NUM_CLASSES, name="logits"),
        ],
        name="digits_cnn",
    )


# Model name -> (builder, whether it takes flattened images).
MODELS: dict[str, tuple[Callable[[], keras.Model], bool]] = {
    "mlp": (build_mlp, True),
    "cnn": (build_cnn, False),
}


def build_model(name: str) -> tuple[keras.Model, bool]:
    """Builds the model registered as ``name``; returns it and whether it wants flat inputs.

    Raises:
        ValueError: no model has that name.
    """
    if name not in MODELS:
        raise ValueError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.")
    builder, flat = MODELS[name]
    return builder(), flat
