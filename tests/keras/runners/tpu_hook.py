"""Counts how often ``model.fit`` under a ``TPUStrategy`` builds and calls TPURunner's step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from stratax._src.keras.runners.tpu_runner import TPURunner


@contextlib.contextmanager
def tpu_runner_hook() -> Iterator[dict[str, int]]:
    """Yields counts of runner step functions made and of their calls (one call per
    ``steps_per_execution`` group)."""
    counters = {"make_step": 0, "calls": 0}
    original = TPURunner.make_step

    def make_step(self: TPURunner, *args: Any, **kwargs: Any) -> Any:
        counters["make_step"] += 1
        function = original(self, *args, **kwargs)

        def counted(state: Any, iterator: Any) -> Any:
            counters["calls"] += 1
            return function(state, iterator)

        return counted

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TPURunner, "make_step", make_step)
        yield counters
