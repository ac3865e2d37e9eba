"""Keras' ``TensorBoard`` under several workers: the chief writes ``log_dir``, the others a
temporary directory, as TensorFlow does.

TensorFlow's Keras gives a non-chief worker ``<log_dir>/workertemp_<task id>`` for its event
files and removes it when training ends (``distributed_file_utils.write_dirpath`` and
``remove_temp_dirpath``), so that one run's log directory holds one worker's curves. Keras 3's
``TensorBoard`` reads ``log_dir`` when ``fit`` hands it the model; :func:`worker_log_dirs`
points it at that temporary directory for the call and restores it after. (``ModelCheckpoint``
needs nothing here: a non-chief's saves inside ``fit`` already go to a private temporary
folder, ``keras.saving``.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import keras


@contextlib.contextmanager
def worker_log_dirs(callbacks: Any, strategy: Any) -> Iterator[None]:
    """During the block a non-chief worker's ``TensorBoard`` callbacks write to
    ``<log_dir>/workertemp_<worker index>``, removed afterwards."""
    if not getattr(strategy, "is_multi_process", False) or strategy.is_chief:
        yield
        return
    given = callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) else (
        callbacks or [])
    moved = []
    for callback in given:
        if isinstance(callback, keras.callbacks.TensorBoard):
            temp = os.path.join(callback.log_dir, f"workertemp_{strategy.worker_index}")
            moved.append((callback, callback.log_dir, temp))
            callback.log_dir = temp
    try:
        yield
    finally:
        for callback, log_dir, temp in moved:
            callback.log_dir = log_dir
            shutil.rmtree(temp, ignore_errors=True)
