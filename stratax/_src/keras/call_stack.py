"""The running ``fit``/``evaluate``/``predict`` calls of this thread, and where batches come from.

Keras asks its epoch iterator for an iterator once per pass over the data; for a call under a
strategy, :func:`epoch_batches` answers with the feed's batches placed by the strategy's runner.
A ``BackupAndRestore`` finds the running call's feed here to resume it mid-epoch.

Each call also keeps the newest step state (``record_state``, from the step plan's Python loop,
``keras.steps.plan``), so that a call that fails can leave the model its last completed step
(``keras.failed_calls``), and the prefetch threads it started, which end with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

from stratax._src import seam
from stratax._src.distributed_input.prefetch import Prefetcher
from stratax._src.keras.feed import GlobalFeed


@dataclasses.dataclass
class Call:
    """One ``fit``/``evaluate``/``predict`` call of a model under a strategy."""

    runner: Any  # the strategy's ``KerasRunner`` (which plans its steps with this module)
    method: str  # "fit", "evaluate", "predict", "compile", "train_on_batch", ...
    model: Any = None
    feed: GlobalFeed | None = None
    # What the runner keeps for the length of the call (e.g. arrays placed on the devices).
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Keras' step state as the newest step of this call took or returned it (None: no step
    # ran): what the model holds if the call fails (``keras.failed_calls``).
    state: Any = None
    # The prefetch threads of this call's passes over its data, closed when the call ends.
    prefetchers: list[Prefetcher] = dataclasses.field(default_factory=list)
    # The global step a ``BackupAndRestore`` resumed this call from (None: not resumed), so
    # that reports (``WorkerMetrics``) number steps on from it, not from the resumed epoch.
    resumed_step: int | None = None


class _Calls(threading.local):
    def __init__(self) -> None:
        self.stack: list[Call] = []


_calls = _Calls()


def active() -> Call | None:
    """The innermost running call of this thread, if any."""
    return _calls.stack[-1] if _calls.stack else None


def record_state(state: Any) -> None:
    """Notes ``state`` (Keras' step state, concrete) as the running call's newest one."""
    if _calls.stack:
        _calls.stack[-1].state = state


@contextlib.contextmanager
def running(call: Call) -> Iterator[Call]:
    """Makes ``call`` active, and its runner's placement current, for the block; its prefetch
    threads end with it (a failed call's would otherwise read on from the user's input)."""
    _calls.stack.append(call)
    try:
        with call.runner.placement_scope():
            yield call
    finally:
        _calls.stack.pop()
        for prefetcher in call.prefetchers:
            prefetcher.close()


def epoch_batches(data_adapter: Any, keras_iterator: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """One pass of placed batches for Keras' epoch iterator over ``data_adapter``."""
    call = active()
    if call is None:
        return keras_iterator()
    feed = seam.adapter_dataset(data_adapter)
    if isinstance(feed, GlobalFeed):
        depth = call.runner.default_prefetch() if feed.prefetch is None else feed.prefetch
        prefetcher = Prefetcher(call.runner.feed_batches(feed, call), depth)
        if depth:
            call.prefetchers = [p for p in call.prefetchers if not p.done]
            call.prefetchers.append(prefetcher)
        return prefetcher
    return call.runner.place_unconverted(data_adapter.get_jax_iterator())
