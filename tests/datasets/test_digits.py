"""The embedded digits dataset (``sx.datasets.load_digits``) that ``stratax train`` uses
without a network: its shapes, its deterministic split, and its place in the wheel."""

import fnmatch
import importlib.resources
import pathlib
import tomllib

import numpy as np
import pytest

from stratax.datasets import load_digits

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_load_digits_shapes_dtypes_and_ranges():
    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.shape == (1438, 64) and x_test.shape == (359, 64)
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int32
    assert y_train.shape == (1438,) and y_test.shape == (359,)
    for x in (x_train, x_test):
        assert x.min() == 0.0 and x.max() == 1.0
    # Stratified: every digit in both parts, about 20% of each held out.
    train_counts = np.bincount(y_train, minlength=10)
    test_counts = np.bincount(y_test, minlength=10)
    assert np.all(train_counts > 130) and np.all((test_counts >= 35) & (test_counts <= 37))
    (images, labels), _ = load_digits(flatten=False)
    assert images.shape == (1438, 8, 8, 1)
    np.testing.assert_array_equal(images.reshape(1438, 64), x_train)
    np.testing.assert_array_equal(labels, y_train)


def test_load_digits_split_is_deterministic_per_seed():
    first, second, other = load_digits(split_seed=3), load_digits(split_seed=3), load_digits()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(first[1][0], other[1][0])
    (x_train, _), (x_test, _) = load_digits(test_fraction=0.5)
    assert len(x_train) + len(x_test) == 1797 and abs(len(x_test) - 899) <= 5
    with pytest.raises(ValueError, match="test_fraction must be strictly between 0 and 1"):
        load_digits(test_fraction=1.0)


def test_digits_file_is_package_data():
    resource = importlib.resources.files("stratax._src.datasets").joinpath("digits.npz")
    assert resource.is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["stratax"]
    assert any(fnmatch.fnmatch("_src/datasets/digits.npz", p) for p in patterns)
    assert (REPO / "stratax" / "_src" / "datasets" / "__init__.py").is_file()  # a real package
