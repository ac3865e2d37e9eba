"""The ``pydataset-workers`` pipeline's dataset of ``benchmarks.workloads.input_pipelines``.

A module of its own, importing Keras at the top, so that the class pickles by name: stratax
starts a ``PyDataset``'s worker processes from multiprocessing's forkserver, which receives the
dataset by pickling.
"""

from __future__ import annotations

import time
from typing import Any

import keras


class DecodedBatches(keras.utils.PyDataset):
    """Batches of ``batch`` rows of ``(x, y)`` that each take ``decode_s`` seconds to load (a
    stand-in for decoding files), read by 2 worker processes."""

    def __init__(self, x: Any, y: Any, batch: int, decode_s: float) -> None:
        super().__init__(workers=2, use_multiprocessing=True)
        self.x, self.y, self.batch, self.decode_s = x, y, batch, decode_s

    def __len__(self) -> int:
        return len(self.x) // self.batch

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        time.sleep(self.decode_s)
        rows = slice(index * self.batch, (index + 1) * self.batch)
        return self.x[rows], self.y[rows]
