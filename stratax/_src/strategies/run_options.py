"""``RunOptions``: TensorFlow's options of ``strategy.run``, taken so guide code runs unchanged."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of ``strategy.run`` (TensorFlow's ``tf.distribute.RunOptions``).

    stratax compiles each replica function with XLA for the shapes it is given, so none of
    these changes what runs: a batch of another size is compiled for (TensorFlow's dynamic batch
    size), and XLA's options are JAX's (``jax.config``). They are kept, and checked, so that
    code written for TensorFlow passes them unchanged.

    Args:
        experimental_enable_dynamic_batch_size: TensorFlow's TPU option; every size works here.
        experimental_bucketizing_dynamic_shape: TensorFlow's TPU option; no effect here.
        experimental_xla_options: TensorFlow's ``tf.tpu.XLAOptions``; no effect here.

    Example:
        >>> strategy.run(step, args=(batch,), options=sx.RunOptions())  # doctest: +SKIP
    """

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


def check_run_options(options: Any) -> None:
    """Raises unless ``options`` is ``None`` or a ``RunOptions``.

    Raises:
        TypeError: naming the received type and the fix.
    """
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(
            f"strategy.run(options=...) takes an sx.RunOptions, got {type(options).__name__} "
            f"({options!r}); pass sx.RunOptions(...) or leave options out."
        )
