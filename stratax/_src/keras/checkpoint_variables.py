"""``sx.checkpoint.save_variables``/``load_variables``: Keras variables, under any strategy, in
the variables format (``checkpoint/variables_file.py``) that ``ParameterServerStrategy``'s
``save_checkpoint``/``restore_checkpoint`` write and read.

Variables are matched by name (a Keras variable's ``path``); given the optimizer (a built Keras
``SGD``/``Adam``), its slots and iterations are saved and loaded too, under the parameter
servers' names (``parameter_server/optimizer_state.py``: the servers apply Keras' formulas, so
the state means the same on both sides).

State held in parts (a variable split over several processes' devices by a
``MultiWorkerMirroredStrategy(layout_map=...)``): ``save_variables`` gathers it into every
process when it fits, as ``model.save`` and ``get_weights`` do, since the file holds each
variable whole (the format other strategies read: a ``ParameterServerStrategy``, one process);
otherwise it refuses, naming a variable, the sizes and the fix (``sx.BackupAndRestore``
writes state in parts, each process its own). ``load_variables`` places each value straight
into the variable's parts, each process reading only its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratax._src.checkpoint import variables_file
from stratax._src.checkpoint.entries import find, iterations_at
from stratax._src.checkpoint.sharded_state import value_for
from stratax._src.keras import model_parallel
from stratax._src.parameter_server.optimizer_state import keras_optimizer_state


def save_variables(path: str | os.PathLike, variables: Sequence[Any],
                   optimizer: Any = None) -> None:
    """Writes Keras variables (any strategy; named by their ``path``) in the checkpoint format,
    with ``optimizer``'s state for them when given (a built Keras ``SGD`` or ``Adam``).
    ``strategy.restore_checkpoint`` reads it.

    Variables held in parts by several processes are gathered first: then every process of
    the job calls it together (as every worker calls ``model.save``), each writing ``path``
    (give the workers other than the chief their own paths, as TensorFlow's guides do).

    Raises:
      MemoryError: the variables held in parts would not fit whole in some process; the
        message names one, the sizes and the fix.

    Example:
      >>> sx.checkpoint.save_variables("model.npz", model.trainable_variables,
      ...                              model.optimizer)                        # doctest: +SKIP
    """
    key, slots_of = keras_optimizer_state(optimizer, variables)
    entries, arrays = [], {}
    state = [*variables, *(optimizer.variables if optimizer is not None else ())]
    iterations = int(np.asarray(optimizer.iterations.numpy())) if optimizer else 0
    with model_parallel.whole_values(state, f"sx.checkpoint.save_variables({str(path)!r})"):
        for i, var in enumerate(variables):
            value = np.asarray(var.numpy())
            arrays[f"value/{i}"] = value
            slots = slots_of(var)
            for name, slot in slots.items():
                arrays[f"slot/{i}/{name}"] = np.asarray(slot.numpy())
            entries.append({"name": var.path, "shape": list(value.shape),
                            "dtype": value.dtype.name, "optimizer": key if optimizer else None,
                            "slots": sorted(slots), "iterations": [
                                [0, value.shape[0] if value.shape else 1, iterations]]})
    variables_file.write(path, entries, arrays)


def load_variables(path: str | os.PathLike, variables: Sequence[Any],
                   optimizer: Any = None) -> list[str]:
    """Assigns Keras variables (matched by ``path``) from a checkpoint written under any
    strategy and placement (e.g. ``ParameterServerStrategy.save_checkpoint``), and, when
    ``optimizer`` (a Keras ``SGD`` or ``Adam``) is given, its slots and iterations; returns the
    names loaded. A variable held in parts by several processes takes only this process's
    parts."""
    entries, data = variables_file.read(path)  # a sharded directory: each array when used
    if optimizer is not None and not optimizer.built:
        optimizer.build(list(variables))
    key, slots_of = keras_optimizer_state(optimizer, variables)
    for var in variables:
        index, entry = find(entries, var.path, tuple(var.shape), path)
        var.assign(value_for(var, data[f"value/{index}"]))
        if optimizer is None:
            continue
        if entry["optimizer"] is None or json.loads(entry["optimizer"])["spec"]["class_name"] \
                != json.loads(key)["spec"]["class_name"]:
            raise ValueError(f"Checkpoint {str(path)!r} has no {type(optimizer).__name__} state "
                             f"for {var.path!r}; load it without `optimizer`.")
        for name, slot in slots_of(var).items():
            slot.assign(value_for(slot, data[f"slot/{index}/{name}"]))
        optimizer.iterations.assign(iterations_at(entry["iterations"], 0))
    return [var.path for var in variables]
