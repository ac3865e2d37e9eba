"""``stratax.launch``: run a program as a local group of worker processes (like torchrun).

Importing it needs neither JAX nor Keras. ``stratax launch --help`` lists the options.

Example:
    >>> from stratax.launch import launch
    >>> result = launch([sys.executable, "train.py"], nproc_per_node=2)   # doctest: +SKIP
"""

from stratax._src.launch import (
    EXIT_TIMEOUT,
    LaunchConfig,
    LaunchError,
    LaunchResult,
    TaskFailure,
    launch,
)

__all__ = ["EXIT_TIMEOUT", "LaunchConfig", "LaunchError", "LaunchResult", "TaskFailure", "launch"]
