"""A ``tf.data.Dataset`` object sent to the workers as its graph, as TensorFlow sends it.

``coordinator.create_per_worker_dataset(dataset)`` (and ``strategy.experimental_distribute_
dataset(dataset)``) accept a dataset built on the chief. No Python crosses the wire: the chief
serializes the pipeline's graph (``DatasetToGraphV2``) and its element spec (JSON: structure,
dtypes, shapes); each worker rebuilds the same pipeline from them (``DatasetFromGraph``). A
pipeline that runs Python (``from_generator``, ``py_function``) has no graph a worker could
run; it is refused with the fix: build it in a dataset function, which runs on the worker.
TensorFlow is imported only when such a dataset is sent.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import numpy as np

from stratax._src.parameter_server.transport import structure

_FAIL_ON_EXTERNAL_STATE = 2  # DatasetToGraphV2's ExternalStatePolicy.FAIL


def is_tf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a ``tf.data.Dataset`` (False, without importing it, when
    TensorFlow was never imported)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(obj, tf.data.Dataset)


def encode(dataset: Any) -> tuple[dict[str, Any], np.ndarray]:
    """``(meta, graph)``: the element spec as JSON and the pipeline's serialized graph.

    Raises:
      TypeError: an element is not made of dense tensors (ragged, sparse, nested datasets).
      ValueError: the pipeline runs Python code, so it has no portable graph.
    """
    import tensorflow as tf

    tree, specs = structure.describe(dataset.element_spec,
                                     is_leaf=lambda x: isinstance(x, tf.TypeSpec))
    if not all(type(spec) is tf.TensorSpec for spec in specs):
        raise TypeError(
            f"A dataset sent to the workers must yield dense tensors; its element_spec is "
            f"{dataset.element_spec!r}. Convert the other kinds in a `.map(...)`, or build the "
            "dataset on each worker: coordinator.create_per_worker_dataset(dataset_fn).")
    try:
        graph = tf.raw_ops.DatasetToGraphV2(
            input_dataset=tf.data.experimental.to_variant(dataset),
            external_state_policy=_FAIL_ON_EXTERNAL_STATE, strip_device_assignment=True)
    except tf.errors.OpError as err:
        reason = re.search(r"graph: (.*?)( \[Op|$)", err.message)
        raise ValueError(
            f"This tf.data pipeline cannot be sent to the workers "
            f"({reason.group(1) if reason else err.message.strip()}): it "
            "runs Python (from_generator, py_function, ...), which only exists on the chief. "
            "Build it where it runs instead: define `def dataset_fn(input_context): ...` at the "
            "top level of the script and call coordinator.create_per_worker_dataset(dataset_fn)."
        ) from None
    meta = {"structure": tree, "specs": [[spec.dtype.name, spec.shape.as_list()]
                                         for spec in specs]}
    return meta, np.frombuffer(graph.numpy(), np.uint8)


def decode(meta: dict[str, Any], graph: np.ndarray) -> Any:
    """The ``tf.data.Dataset`` that ``encode`` described, rebuilt on this task."""
    import tensorflow as tf

    specs = [tf.TensorSpec(shape, tf.as_dtype(dtype)) for dtype, shape in meta["specs"]]
    variant = tf.raw_ops.DatasetFromGraph(graph_def=np.asarray(graph, np.uint8).tobytes())
    return tf.data.experimental.from_variant(variant,
                                             structure=structure.build(meta["structure"], specs))
