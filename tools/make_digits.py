"""Regenerates ``stratax/_src/datasets/digits.npz`` from scikit-learn's UCI 8x8 digits.

A maintainer's script, kept outside the package so that it is not installed; run it on a
machine with scikit-learn installed::

    python tools/make_digits.py

scikit-learn is needed only here; ``load_digits`` reads the ``.npz`` written by this script and
never imports scikit-learn. The file holds ``images`` (uint8, shape ``(1797, 8, 8)``, values
0..16 as in the source) and ``labels`` (uint8, shape ``(1797,)``, digits 0..9), compressed.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

DEFAULT_OUTPUT = pathlib.Path(__file__).resolve().parents[1] / "stratax/_src/datasets/digits.npz"


def extract(output: pathlib.Path = DEFAULT_OUTPUT) -> pathlib.Path:
    """Writes the digits to ``output`` and returns its path.

    Raises:
        RuntimeError: scikit-learn is not installed.
        ValueError: the source data has an unexpected shape or value range.
    """
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits
    except ImportError as err:
        raise RuntimeError(
            "Extracting the digits needs scikit-learn; install it with `pip install scikit-learn` "
            "(only for this script, not for stratax)."
        ) from err
    bunch = sklearn_load_digits()
    images = np.asarray(bunch.images)
    labels = np.asarray(bunch.target)
    if images.shape != (1797, 8, 8) or labels.shape != (1797,):
        raise ValueError(
            f"Unexpected digits shapes: images {images.shape}, labels {labels.shape}; expected "
            "(1797, 8, 8) and (1797,)."
        )
    if images.min() < 0 or images.max() > 16 or np.any(images != np.round(images)):
        raise ValueError("Digit pixels must be integers in 0..16; the source data changed.")
    np.savez_compressed(output, images=images.astype(np.uint8), labels=labels.astype(np.uint8))
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUTPUT,
                        help=f"where to write the .npz (default: {DEFAULT_OUTPUT})")
    path = extract(parser.parse_args().output)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
