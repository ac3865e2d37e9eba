"""``GlobalFeed``: the one batch path of ``fit``/``evaluate``/``predict`` under every strategy.

Every input kind a TensorFlow user passes — numpy/JAX arrays (dicts and lists of them too), a
list of ``(x, y[, sample_weight])`` batches, a ``keras.utils.PyDataset``, a Python generator, a
stratax distributed dataset — becomes a ``GlobalFeed``, in one process and in many, with or
without callbacks. The rules, each written once:

- **Global batches.** The data describe *global* batches; ``batch_size`` is global and must
  split over the replicas (:func:`stratax._src.distributed_input.global_batch.check_divisible`).
- **Order.** With ``shuffle=True`` the order of epoch ``e`` is a permutation drawn from
  ``(seed, e)`` alone — rows for arrays, batches for a ``PyDataset`` — where ``seed`` is
  ``keras.utils.set_random_seed``'s, else a draw from numpy's generator (worker 0's, on every
  worker). It is the same in one process
  and in many, and does not change when a callback is added or a run resumes from a backup.
  (Plain Keras draws its permutation from numpy's global generator instead, so with
  ``shuffle=True`` plain Keras and stratax visit the data in different orders; with
  ``shuffle=False`` they are equal.)
- **Weights.** ``class_weight`` becomes per-example weights exactly as Keras computes them, for
  arrays, batch lists, ``PyDataset``\\ s and generators.
- **This process's share.** Worker ``p`` of ``P`` feeds rows ``[p*B/P, (p+1)*B/P)`` of each
  global batch of ``B`` rows (auto-shard by data), so the global batch is exactly the one a
  single process would see; from arrays it gathers only those rows (``FeedLayout.share``).
  Per-worker data (``AutoShardPolicy.OFF``, ``distribute_datasets_from_function``) is fed as
  it comes.
- **Placement ahead of the step.** A background thread places up to ``prefetch`` batches on
  the replicas while the previous step runs: ``InputOptions(experimental_fetch_to_device=...,
  experimental_prefetch_to_device=...)`` of a distributed dataset, else
  ``STRATAX_PREFETCH_DEPTH``, else the runner's default (2 on accelerators; 0 on CPU, where the
  thread competes with the step for the same cores and was slower).
- **The last partial batch** is trained, never dropped: split when it divides over the
  replicas, else fed whole to every replica (each computes the same update one device would:
  exact, one slower step). ``predict`` in a multi-process run feeds every batch whole to every
  worker, so each gets all predictions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import keras
import numpy as np

from stratax._src import seam
from stratax._src.core.config import config
from stratax._src.distributed_input import global_batch, sharding
from stratax._src.distributed_input.distributed_dataset import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
)
from stratax._src.distributed_input.input_context import AutoShardPolicy
from stratax._src.keras import seeds
from stratax._src.keras.feed_layout import FeedLayout, batch_rows
from stratax._src.keras.feed_sources import (
    ArraySource,
    IterableSource,
    PassSource,
    RowPass,
    SequenceSource,
)

_KERAS_DEFAULT_BATCH = 32


class GlobalFeed(keras.utils.PyDataset):
    """This process's batches of one ``fit``/``evaluate``/``predict`` input (module docstring).

    Keras sees a ``PyDataset``; the strategy's runner reads :meth:`local_batches` directly.
    """

    def __init__(self, source: Any, layout: FeedLayout, *, seed: int = 0,
                 per_worker: bool = False) -> None:
        super().__init__()
        if per_worker and layout.processes_per_replica > 1:
            raise ValueError(
                f"This input gives each worker its own batches (a per-worker pipeline: "
                f"distribute_datasets_from_function, AutoShardPolicy.OFF, a sharded loader), "
                f"but each replica spans {layout.processes_per_replica} workers, which must "
                "feed it the same rows. Give every worker the same global batches (numpy "
                "arrays, or a dataset of global batches with AutoShardPolicy AUTO or DATA)."
            )
        self._source = source
        self.layout = layout
        self.seed = seed
        self.per_worker = per_worker
        # Batches placed ahead of the step; None: the strategy's runner decides.
        self.prefetch: int | None = configured_prefetch_depth()
        self.epoch = 0
        self._skip = 0

    def array_split(self) -> tuple[Any, ArraySource] | None:
        """For a feed cut from arrays, ``ArraySource.split``'s ``(arrays, row source)``;
        ``None`` for other inputs."""
        return self._source.split() if isinstance(self._source, ArraySource) else None

    def arrays(self) -> Any:
        """The arrays a feed cut from arrays (the same on every worker) serves, else ``None``."""
        if isinstance(self._source, ArraySource) and not self.per_worker:
            return self._source.arrays
        return None

    def row_pass(self) -> RowPass:
        """One pass from the current position, like :meth:`local_batches`, as a
        :class:`RowPass` (for a feed whose :meth:`arrays` is not ``None``)."""
        skip, self._skip = self._skip, 0
        return self._source.row_pass(self.seed, self.epoch, skip)

    @property
    def num_batches(self) -> int | None:
        return self._source.num_batches

    def __getitem__(self, index: int) -> Any:
        return self._local(next(self._source.batches(self.seed, self.epoch, index)))[0]

    def peek(self) -> Any:
        """This process's first batch of the next pass, without consuming it."""
        return self._local(self.build_batch())[0]

    def build_batch(self) -> Any:
        """The next pass's first batch as the input gives it, without consuming it.

        Keras builds a model from a batch of the user's input, so stratax does too: under
        several processes that is the global batch (cut into each process' rows only for the
        step), and a model that does not take it fails naming the user's shape, ``(64, 19)``,
        not one process' rows, ``(32, 19)``. A per-worker input's batch is already the user's.
        """
        if hasattr(self._source, "peek"):
            return self._source.peek()
        return next(self._source.batches(self.seed, self.epoch, self._skip))

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass over the data produce epoch ``epoch``'s order."""
        self.epoch = epoch

    def resume_at(self, epoch: int, skip: int) -> None:
        """Makes the next pass start ``skip`` batches into epoch ``epoch`` (after a restore)."""
        self.epoch, self._skip = epoch, skip

    def local_batches(self) -> Iterator[tuple[Any, bool]]:
        """One pass of ``(this process's batch, replicated)`` from the current position."""
        skip, self._skip = self._skip, 0
        if isinstance(self._source, ArraySource) and not self.per_worker:
            yield from self._source.local_batches(self.seed, self.epoch, skip, self.layout)
            return
        for batch in self._source.batches(self.seed, self.epoch, skip):
            yield self._local(batch)

    def _local(self, batch: Any) -> tuple[Any, bool]:
        if self.per_worker:
            return batch, False
        return self.layout.local(batch)

    def on_epoch_end(self) -> None:
        sequence = getattr(self._source, "sequence", None)
        if isinstance(sequence, keras.utils.PyDataset):
            sequence.on_epoch_end()


class FeedEpochs(keras.callbacks.Callback):
    """Tells a feed which epoch ``fit`` is in, before the epoch reads its first batch."""

    def __init__(self, feed: GlobalFeed) -> None:
        super().__init__()
        self.feed = feed

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.feed.set_epoch(epoch)


def configured_prefetch_depth() -> int | None:
    """Option ``prefetch_depth`` (``STRATAX_PREFETCH_DEPTH``: batches placed ahead of the
    step, 0 = off), or ``None`` for the runner's default."""
    return config.prefetch_depth


def data_seed(layout: FeedLayout) -> int:
    """The seed of the data order: Keras' global seed, else a fresh draw (like Keras' shuffle),
    worker 0's on every worker of a multi-process job."""
    seed = seam.keras_random_seed()
    if seed is not None:
        return int(seed)
    return seeds.agreed_draw(int(np.random.randint(0, 2**31 - 1)), layout.num_processes)


def _is_array_like(x: Any) -> bool:
    if not isinstance(x, (np.ndarray, jax.Array, list, tuple, dict)):
        return False
    leaves = jax.tree.leaves(x)
    return bool(leaves) and all(isinstance(a, (np.ndarray, jax.Array)) for a in leaves)


def _is_batch_list(x: Any) -> bool:
    # Every element a batch: ``(x_dict, y)`` (e.g. ``validation_data``) is one batch's arrays.
    return isinstance(x, (list, tuple)) and bool(x) and all(
        isinstance(batch, (tuple, dict)) for batch in x)


def is_array_input(x: Any) -> bool:
    """True for arrays (and dicts/lists of them) that ``fit`` cuts into batches itself."""
    return _is_array_like(x) and not _is_batch_list(x)


def _arrays_feed(arrays: tuple[Any, ...], batch_size: int | None, shuffle: bool | str,
                 layout: FeedLayout, class_weight: dict[int, float] | None,
                 hint: str, steps: int | None = None) -> GlobalFeed:
    seam.check_data_cardinality(arrays)   # x and y of different lengths: Keras' ValueError
    # Keras' rule: without a batch size, ``steps`` batches cover the data, else 32 rows.
    rows = batch_rows(arrays)
    batch = batch_size or (-(-rows // steps) if steps else _KERAS_DEFAULT_BATCH)
    global_batch.check_divisible(batch, layout.num_replicas, hint=hint)
    if class_weight is not None:
        if len(arrays) != 2:
            raise ValueError("You cannot use class_weight and sample_weight at the same time.")
        arrays = (*arrays, seam.class_weight_to_sample_weights(arrays[1], class_weight))
    return GlobalFeed(ArraySource(arrays, batch, shuffle), layout, seed=data_seed(layout))


def as_feed(x: Any, layout: FeedLayout, *, shuffle: bool | str = False,
            class_weight: dict[int, float] | None = None,
            policy: AutoShardPolicy = AutoShardPolicy.AUTO) -> GlobalFeed | None:
    """The feed of a non-array input, or ``None`` for arrays (left to the caller).

    ``policy``: how the processes share the input (``InputOptions.auto_shard_policy`` of a
    distributed dataset); ``AUTO`` defers to a ``tf.data`` pipeline's own option.

    Raises:
        TypeError: ``x`` is no input ``fit`` accepts.
    """
    if isinstance(x, GlobalFeed):
        return x
    if isinstance(x, DistributedDataset):
        options = x.options
        feed = as_feed(x.dataset, layout, class_weight=class_weight,
                       policy=options.auto_shard_policy)
        if feed is not None:
            feed.prefetch = (options.experimental_prefetch_to_device
                             if options.experimental_fetch_to_device else 0)
        return feed
    if isinstance(x, DistributedDatasetsFromFunction):  # a pass over each pipeline per epoch
        source = (PassSource(x.local_global_batches, None, class_weight) if x.reiterable
                  else IterableSource(x.local_global_batches(), class_weight))
        return GlobalFeed(source, layout, per_worker=True)
    per_worker = policy is AutoShardPolicy.OFF and layout.num_shares > 1
    if seam.is_keras_dataset(x):
        return _dataset_feed(x, layout, class_weight, policy)
    if _is_batch_list(x):  # batches come in the order given, as from a dataset
        return GlobalFeed(SequenceSource(x, False, class_weight), layout, per_worker=per_worker)
    if isinstance(x, keras.utils.PyDataset):
        sized = hasattr(x, "__len__") or getattr(x, "num_batches", None) is not None
        if sized:
            return GlobalFeed(SequenceSource(x, bool(shuffle), class_weight), layout,
                              seed=data_seed(layout), per_worker=per_worker)
        return GlobalFeed(IterableSource(x, class_weight), layout, per_worker=per_worker)
    if isinstance(x, Iterator):  # one pass only, as Keras reads a generator
        return GlobalFeed(IterableSource(x, class_weight), layout, per_worker=per_worker)
    if _is_array_like(x):
        return None
    if isinstance(x, Iterable) and not isinstance(x, (str, bytes, dict)):
        size = len(x) if hasattr(x, "__len__") else None
        return GlobalFeed(PassSource(lambda: x, size, class_weight), layout,
                          per_worker=per_worker)
    raise TypeError(
        f"Cannot train on x of type {type(x).__name__}. stratax takes what Keras takes: numpy "
        "or JAX arrays (or dicts/lists of them), a tf.data.Dataset, a grain dataset or "
        "DataLoader, a torch DataLoader, a keras.utils.PyDataset, a generator or any "
        "re-iterable object of (x, y[, sample_weight]) batches, or a dataset from "
        "strategy.experimental_distribute_dataset."
    )


def _dataset_feed(x: Any, layout: FeedLayout, class_weight: dict[int, float] | None,
                  policy: AutoShardPolicy) -> GlobalFeed:
    """The feed of a ``tf.data``, grain or torch input, read through Keras' own data adapter
    a fresh pass per epoch, and shared by the processes as ``tf.distribute`` shares it
    (``data.sharding``)."""
    x, per_worker = sharding.shard_for_process(x, policy, layout.num_shares,
                                               layout.share_index)
    adapter = seam.keras_data_adapter(x, class_weight)
    return GlobalFeed(PassSource(adapter.get_numpy_iterator, adapter.num_batches), layout,
                      per_worker=per_worker)


def feed_arguments(method: str, arguments: dict[str, Any], layout: FeedLayout) -> dict[str, Any]:
    """Rewrites bound ``fit``/``evaluate``/``predict`` arguments so ``x`` is a ``GlobalFeed``.

    ``y``, ``sample_weight``, ``class_weight``, ``batch_size``, ``shuffle`` and
    ``validation_split`` are consumed by the feed; ``validation_data`` gets its own feed.
    """
    arguments = dict(arguments)
    x = arguments.get("x")
    shuffle = arguments.get("shuffle", True) if method == "fit" else False
    class_weight = arguments.get("class_weight") if method == "fit" else None
    hint = f"`model.{method}(..., batch_size={{batch}})`"
    if _is_array_like(x) and not _is_batch_list(x):
        if method == "fit" and arguments.get("validation_split"):
            (x, y, weights), validation = seam.train_validation_split(
                (x, arguments.get("y"), arguments.get("sample_weight")),
                arguments["validation_split"],
            )
            arguments.update(y=y, sample_weight=weights, validation_data=validation)
        packed = (x,) if method == "predict" else tuple(
            a for a in (x, arguments.get("y"), arguments.get("sample_weight")) if a is not None)
        steps = arguments.get("steps_per_epoch" if method == "fit" else "steps")
        feed = _arrays_feed(packed, arguments.get("batch_size"), shuffle, layout, class_weight,
                            hint, steps)
    else:
        feed = as_feed(x, layout, shuffle=shuffle, class_weight=class_weight)
        if feed is None:
            return arguments
    arguments["x"] = feed
    if method == "fit":
        arguments["shuffle"] = False  # the feed shuffles, identically on every worker
        arguments["validation_data"] = _validation_feed(arguments, layout)
    for name in ("y", "sample_weight", "batch_size", "class_weight", "validation_split"):
        if arguments.get(name) is not None:
            arguments[name] = None
    if method == "fit":
        callbacks = arguments.get("callbacks")
        if not isinstance(callbacks, keras.callbacks.CallbackList):
            arguments["callbacks"] = [FeedEpochs(feed), *(callbacks or ())]
    return arguments


def _validation_feed(arguments: dict[str, Any], layout: FeedLayout) -> Any:
    validation = arguments.get("validation_data")
    if validation is None:
        return None
    if isinstance(validation, (tuple, list)) and _is_array_like(validation) and not (
            _is_batch_list(validation)):
        size = arguments.get("validation_batch_size") or arguments.get("batch_size")
        arguments["validation_batch_size"] = None
        return _arrays_feed(tuple(v for v in validation if v is not None), size, False, layout,
                            None, "`model.fit(..., validation_batch_size={batch})`")
    feed = as_feed(validation, layout)
    return validation if feed is None else feed
