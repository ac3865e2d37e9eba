"""The 8x8 handwritten digits, embedded in the package so training needs no network.

1,797 grey-scale images of the digits 0-9 (about 180 per class), 8x8 pixels with values 0..16,
from the test set of the UCI "Optical Recognition of Handwritten Digits" data (E. Alpaydin and
C. Kaynak, 1998) as distributed with scikit-learn (``sklearn.datasets.load_digits``).

License and attribution: scikit-learn is distributed under the BSD 3-Clause license,
Copyright (c) 2007-2024 The scikit-learn developers; the UCI Machine Learning Repository
publishes the original data under CC BY 4.0 (doi:10.24432/C50P49). ``digits.npz`` is an
unmodified copy of the pixel values and labels, written by ``tools/make_digits.py``.
"""

from __future__ import annotations

import importlib.resources
import io

import numpy as np

NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8)
_RESOURCE = "digits.npz"
_MAX_PIXEL = 16.0

Split = tuple[np.ndarray, np.ndarray]


def _read_raw() -> tuple[np.ndarray, np.ndarray]:
    """Reads ``(images uint8 (1797, 8, 8), labels uint8 (1797,))`` from the package data."""
    resource = importlib.resources.files(__package__).joinpath(_RESOURCE)
    with np.load(io.BytesIO(resource.read_bytes())) as data:
        return data["images"], data["labels"]


def load_digits(
    split_seed: int = 0, test_fraction: float = 0.2, *, flatten: bool = True
) -> tuple[Split, Split]:
    """Loads the embedded 8x8 digits as ``((x_train, y_train), (x_test, y_test))``.

    The split is stratified (each digit keeps its share in both parts) and depends only on
    ``split_seed``, so every process and every run sees the same train and test sets.

    The data: 1,797 images from the UCI "Optical Recognition of Handwritten Digits" test set
    (Alpaydin and Kaynak, 1998) as shipped by scikit-learn (BSD 3-Clause license, Copyright (c)
    2007-2024 The scikit-learn developers); UCI publishes the data under CC BY 4.0.

    Args:
        split_seed: seed of the train/test shuffle.
        test_fraction: share of each class held out for the test set, in ``(0, 1)``.
        flatten: ``True`` gives images as ``(N, 64)`` rows (for an MLP); ``False`` as
            ``(N, 8, 8, 1)`` (channels-last, for a ``Conv2D`` network).

    Returns:
        ``x`` arrays are float32 scaled to ``[0, 1]``; ``y`` arrays are int32 labels 0..9.

    Raises:
        ValueError: ``test_fraction`` is not strictly between 0 and 1.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_digits()
        >>> x_train.shape, x_test.shape
        ((1438, 64), (359, 64))
    """
    if isinstance(test_fraction, bool) or not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(
            f"test_fraction must be strictly between 0 and 1; received {test_fraction!r}. "
            "Use e.g. test_fraction=0.2 to hold out 20% of each digit."
        )
    images, labels = _read_raw()
    rng = np.random.default_rng(split_seed)
    train_idx, test_idx = [], []
    for digit in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == digit))
        n_test = max(1, round(len(members) * float(test_fraction)))
        test_idx.append(members[:n_test])
        train_idx.append(members[n_test:])
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))

    x = images.astype(np.float32) / _MAX_PIXEL
    x = x.reshape(len(x), -1) if flatten else x[..., None]
    y = labels.astype(np.int32)
    return (x[train], y[train]), (x[test], y[test])
