"""The running ``fit``/``evaluate``/``predict`` calls of this thread, and where batches come from.

Keras asks its epoch iterator for an iterator once per pass over the data; for a call under a
strategy, :func:`epoch_batches` answers with the feed's batches placed by the strategy's runner.
A ``BackupAndRestore`` finds the running call's feed here to resume it mid-epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

from stratax._src import seam
from stratax._src.data.prefetch import Prefetcher
from stratax._src.keras.feed import GlobalFeed
from stratax._src.keras.runner import KerasRunner


@dataclasses.dataclass
class Call:
    """One ``fit``/``evaluate``/``predict`` call of a model under a strategy."""

    runner: KerasRunner
    method: str  # "fit", "evaluate", "predict", "compile", "train_on_batch", ...
    model: Any = None
    feed: GlobalFeed | None = None
    # What the runner keeps for the length of the call (e.g. arrays placed on the devices).
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Calls(threading.local):
    def __init__(self) -> None:
        self.stack: list[Call] = []


_calls = _Calls()


def active() -> Call | None:
    """The innermost running call of this thread, if any."""
    return _calls.stack[-1] if _calls.stack else None


@contextlib.contextmanager
def running(call: Call) -> Iterator[Call]:
    """Makes ``call`` active, and its runner's placement current, for the block."""
    _calls.stack.append(call)
    try:
        with call.runner.placement_scope():
            yield call
    finally:
        _calls.stack.pop()


def epoch_batches(data_adapter: Any, keras_iterator: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """One pass of placed batches for Keras' epoch iterator over ``data_adapter``."""
    call = active()
    if call is None:
        return keras_iterator()
    feed = seam.adapter_dataset(data_adapter)
    if isinstance(feed, GlobalFeed):
        depth = call.runner.default_prefetch() if feed.prefetch is None else feed.prefetch
        return Prefetcher(call.runner.feed_batches(feed, call), depth)
    return call.runner.place_unconverted(data_adapter.get_jax_iterator())
