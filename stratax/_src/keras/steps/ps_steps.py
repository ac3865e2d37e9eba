"""Keras' steps under ``ParameterServerStrategy``: one scheduled closure per step group.

Keras' loop runs on the chief and calls its step function once per group of
``steps_per_execution`` batches. Here that call schedules the group as one closure on a worker
(``ClusterCoordinator.schedule``), running one exported program per step (``strategy.run``):

- **train**: the worker pulls the variables (``strategy.read``), computes Keras' loss and
  gradients (``model.compute_loss_and_updates``), pushes the gradients to the parameter servers,
  which apply ``model.optimizer`` (``strategy.apply_gradients``), writes the new non-trainable
  state (BatchNorm statistics, dropout seeds: ``strategy.assign``), and returns the Keras metric
  variables computed from a **zero** state for its batch;
- **test**: Keras' ``test_step`` from a zero metric state, returning the metric variables;
- **predict**: Keras' ``predict_step``, returning the outputs.

**The metrics rule.** The chief adds each group's metric variables to the model's: Keras'
built-in metrics keep additive states (``Mean``'s total and count, accuracy, precision, recall,
AUC, IoU counts, ...), so the sum over groups equals one process's state. Metrics whose update
Keras does not define (custom ``update_state``/``reset_state``) are refused unless they declare
``stratax_additive = True``.

**Scheduling ahead.** :class:`GroupPipeline` keeps up to one group per worker in flight: the
call for group ``k`` schedules groups up to ``k + workers - 1`` (never past the epoch's last
group) and returns group ``k``'s own result, so callbacks see every group in order, the progress
bar advances as groups complete, predictions come back in input order, and when the last call
of an epoch returns, nothing of the epoch is in flight. Only a ``RemoteValue`` that completed
counts: a closure re-run after a worker died reads the same batches (``worker_data``), so
``evaluate`` sees each example once.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from stratax._src import seam
from stratax._src.core.reduce_op import ReduceOp
from stratax._src.keras.runners.runner import steps_per_execution
from stratax._src.keras.steps import forward_losses
from stratax._src.parameter_server.closures import PerWorkerValues
from stratax._src.parameter_server.program import optimizer_spec
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES

# A group waits behind at most one group per worker, each bounded by the strategy's step
# deadline; this bound only catches a coordinator that stopped answering.
GROUP_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class BatchRef:
    """One batch of a ``fit`` input as the chief sees it: rows of arrays the workers hold
    (``data`` an ``ArrayData``), or the next batch of a per-worker iterator (``rows`` None)."""

    data: Any
    rows: np.ndarray | None = None

    def placeholders(self) -> Any:
        """Inside a scheduled function: the batch's placeholders for ``strategy.run``."""
        return next(self.data) if self.rows is None else self.data.batch(self.rows)


def check_additive_metrics(model: Any) -> None:
    """Refuses metrics whose states the chief cannot add up (see the module docstring).

    Raises:
      ValueError: a metric updates or resets its state with code Keras does not define.
    """
    stack = list(model.metrics)
    while stack:
        metric = stack.pop()
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, list):  # a container (Keras' CompileMetrics)
            stack.extend(inner)
            continue
        if getattr(metric, "stratax_additive", False):
            continue
        kind = type(metric)
        own = [name for name in ("update_state", "reset_state")
               if not getattr(kind, name).__module__.startswith("keras.")]
        if own:
            raise ValueError(
                f"Metric {metric.name!r} ({kind.__name__}) defines its own {' and '.join(own)}; "
                "under ParameterServerStrategy each worker computes metric states from zero and "
                "the chief adds them, which is exact only for additive states (sums and counts, "
                "as in Keras' built-in metrics). If its state is additive and resets to zeros, "
                "declare it: `metric.stratax_additive = True`; otherwise compute it after fit "
                "with model.predict."
            )


def sparse_tables(model: Any) -> list[Any]:
    """The tables read row-sparse: those of the model's ``keras.layers.Embedding`` layers
    (exactly that class, so nothing but its lookup reads the table; not quantized, no LoRA, no
    regularizer), trainable, unless the layer says ``stratax_sparse = False``."""
    trainable = {id(v) for v in model.trainable_variables}
    tables, stack = [], list(model.layers)
    while stack:
        layer = stack.pop(0)
        stack.extend(getattr(layer, "layers", None) or [])
        if (type(layer) is keras.layers.Embedding and not layer.quantization_mode
                and not layer.lora_enabled and layer.embeddings_regularizer is None
                and getattr(layer, "stratax_sparse", True) and id(layer.embeddings) in trainable
                and all(layer.embeddings is not t for t in tables)):
            tables.append(layer.embeddings)
    return tables


def replica_function(model: Any, kind: str, strategy: Any) -> Callable[[Any], Any]:
    """The function ``strategy.run`` exports for one step of ``kind`` ("train", "test",
    "predict"); one object per model and kind, so each batch shape exports once.

    Embedding tables (``sparse_tables``) take the row-sparse path: the step pulls only the rows
    its batch looks up (``strategy.read_rows``), the embedding layer gathers from them, and a
    train step pushes the gradient of those rows; the rest is read whole.
    """
    trainable = list(model.trainable_variables)
    non_trainable = list(model.non_trainable_variables)
    tables = sparse_tables(model)
    table_ids = {id(t) for t in tables}
    dense = [v for v in trainable if id(v) not in table_ids]
    metric_specs = [(tuple(v.shape), v.dtype) for v in model.metrics_variables]
    # Read now: Keras empties the optimizer's variables while its loop runs.
    optimizer = optimizer_spec(model.optimizer) if kind == "train" else None
    sparse_updates = getattr(model.optimizer, "stratax_sparse_updates", DEFAULT_SPARSE_UPDATES)
    replicas = strategy.num_replicas_in_sync

    def zero_metrics() -> list[Any]:
        return [jnp.zeros(shape, dtype) for shape, dtype in metric_specs]

    def values(dense_values: list[Any]) -> list[Any]:
        # A table's own value is never read (its layer gathers from the pulled rows): a
        # stand-in of its shape, which XLA never materialises.
        given = iter(dense_values)
        return [jnp.zeros(v.shape, v.dtype) if id(v) in table_ids else next(given)
                for v in trainable]

    def pull_rows(lookups: dict[int, tuple[Any, Any]]) -> Callable[[Any, Any], Any]:
        def lookup(layer: Any, ids: Any) -> Any:
            table = layer.embeddings
            if id(table) not in table_ids:
                return None
            if id(table) in lookups:
                raise ValueError(
                    f"Embedding table {table.path!r} is looked up twice in one step; set "
                    "`layer.stratax_sparse = False` on its layer to read it whole.")
            lookups[id(table)] = strategy.read_rows(table, ids)
            rows, positions = lookups[id(table)]
            return jnp.take(rows, positions, axis=0)
        return lookup

    def gather(rows: dict[int, Any], lookups: dict[int, tuple[Any, Any]]) -> Callable[..., Any]:
        def lookup(layer: Any, ids: Any) -> Any:
            table = layer.embeddings
            if id(table) not in rows:
                return None
            return jnp.take(rows[id(table)], lookups[id(table)][1], axis=0)
        return lookup

    def check_whole_batches(batch: Any) -> None:
        """Refuses, in synchronous mode, a model whose loss a worker's share cannot give."""
        problem = forward_losses.problem(model, lambda: batch) if replicas > 1 else None
        if problem is not None:
            raise ValueError(
                f"model.{'fit' if kind == 'train' else 'evaluate'} under "
                f"ParameterServerStrategy(mode='sync') with {replicas} workers computes the "
                "loss on each worker's share of every batch and averages the shares' losses, "
                f"which is not the loss of the whole batch for this model: {problem}. Use "
                "mode='async' (each step runs one worker's whole batch) or one worker.")

    def train(batch: Any) -> Any:
        check_whole_batches(batch)
        x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
        dense_values, nt_values = strategy.read(dense), strategy.read(non_trainable)

        def loss_fn(dense_values: list[Any], rows: dict[int, Any], lookup: Any) -> Any:
            with seam.embedding_lookups(lookup):
                return model.compute_loss_and_updates(
                    values(dense_values), nt_values, zero_metrics(), x, y, weights,
                    training=True, optimizer_variables=[])

        lookups: dict[int, tuple[Any, Any]] = {}
        if tables:  # a first pass finds the rows (its loss is unused and compiled away)
            loss_fn(dense_values, {}, pull_rows(lookups))
        rows = {k: r for k, (r, _) in lookups.items()}
        (_, (loss, y_pred, new_state, metrics)), (dense_grads, row_grads) = jax.value_and_grad(
            lambda d, r: loss_fn(d, r, gather(r, lookups)), argnums=(0, 1), has_aux=True)(
            dense_values, rows)
        pairs = [*zip(dense_grads, dense, strict=True),
                 *((row_grads[id(t)], t) for t in tables if id(t) in row_grads)]
        if replicas > 1:  # synchronous: the servers sum one gradient per worker; average them
            pairs = [(g / replicas, v) for g, v in pairs]
        strategy.apply_gradients(pairs, optimizer, sparse_updates)
        if non_trainable:  # BatchNorm statistics, dropout seeds: the next step reads these
            strategy.assign(non_trainable, new_state)
        return seam.update_metrics(model, metrics, loss, x, y, y_pred, weights)[1]

    def test(batch: Any) -> Any:
        check_whole_batches(batch)
        state = (values(strategy.read(dense)), strategy.read(non_trainable), zero_metrics())
        with seam.embedding_lookups(pull_rows({})):
            return model.test_step(state, batch)[1][2]

    def predict(batch: Any) -> Any:
        state = (values(strategy.read(dense)), strategy.read(non_trainable))
        with seam.embedding_lookups(pull_rows({})):
            return model.predict_step(state, batch)[0]

    return {"train": train, "test": test, "predict": predict}[kind]


def metrics_logs(model: Any, values: list[Any]) -> dict[str, Any]:
    """Keras' logs (``model.get_metrics_result()``) for metric variable ``values``."""
    mapping = list(zip(model.metrics_variables, values, strict=True))
    with keras.StatelessScope(state_mapping=mapping):
        return model.get_metrics_result()


class GroupPipeline:
    """Keras' step function for one model and kind: schedules groups ahead, returns in order.

    Args:
      model: The Keras model.
      kind: "train", "test" or "predict".
      coordinator: The strategy's ``ClusterCoordinator``.
      depth: Groups kept in flight (one per worker).
      planned_steps: ``() -> steps of the current epoch`` (``steps_per_epoch``/``steps``, else
        the number of batches), or None when unknown.
    """

    def __init__(self, model: Any, kind: str, coordinator: Any, depth: int,
                 planned_steps: Callable[[], int | None]) -> None:
        self.model, self.kind = model, kind
        self._coordinator = coordinator
        self._strategy = coordinator.strategy
        self._depth = max(depth, 1)
        self._planned_steps = planned_steps
        self._replica = replica_function(model, kind, self._strategy)
        self._queue: collections.deque[tuple[Any, int]] = collections.deque()  # (value, steps)
        self._iterator: Iterator[Any] | None = None
        self._groups: float = 0
        self._scheduled = self._returned = 0
        self._steps_scheduled = self._steps_returned = 0   # in the current epoch
        self._hold: float = math.inf      # schedule no step past this one (see hold_after)
        self._exhausted = False

    def __call__(self, state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        """Keras' ``iterator_step(state, iterator) -> (logs or outputs, state)``."""
        if iterator is not self._iterator or self._returned >= self._groups:
            self._new_epoch(iterator)
        self._fill(iterator)
        if not self._queue:
            raise StopIteration
        remote, steps = self._queue.popleft()
        self._returned += 1
        self._steps_returned += steps
        per_step = remote.fetch(timeout=GROUP_TIMEOUT_S)
        if self.kind == "predict":  # synchronous: each worker predicted its share, in order
            per_step = jax.tree.map(
                lambda v: np.concatenate(list(v)) if isinstance(v, PerWorkerValues) else v,
                per_step, is_leaf=lambda v: isinstance(v, PerWorkerValues))
            outputs = jax.tree.map(lambda *parts: np.concatenate(parts), *per_step)
            return outputs, state
        *rest, metrics = state
        totals = [np.asarray(total) + sum(step[i] for step in per_step)
                  for i, total in enumerate(metrics)]
        totals = [jnp.asarray(t) for t in totals]
        return metrics_logs(self.model, totals), (*rest, totals)

    def hold_after(self, steps: int) -> None:
        """Schedules no step more than ``steps`` past the last one returned until the steps
        before it have returned, so that nothing is in flight when the callbacks of that step
        read the servers' state (a backup). A hold never stops the epoch: with nothing in
        flight, the next group is scheduled."""
        self._hold = self._steps_returned + steps

    def discard(self) -> None:
        """Forgets groups still in flight (their updates still apply; their results do not
        count): after a stopped or failed call."""
        self._queue.clear()
        self._iterator = None

    def _new_epoch(self, iterator: Iterator[Any]) -> None:
        self.discard()
        self._iterator = iterator
        steps = self._planned_steps()
        group = steps_per_execution(self.model)
        self._groups = math.inf if steps is None else math.ceil(steps / group)
        self._scheduled = self._returned = 0
        self._hold -= self._steps_returned
        self._steps_scheduled = self._steps_returned = 0
        self._exhausted = False

    def _fill(self, iterator: Iterator[Any]) -> None:
        group = steps_per_execution(self.model)
        while (len(self._queue) < self._depth and self._scheduled < self._groups
               and not self._exhausted
               and (self._steps_scheduled < self._hold or not self._queue)):
            refs = []
            for _ in range(group):
                try:
                    ref = next(iterator)
                except StopIteration:
                    self._exhausted = True
                    break
                if not isinstance(ref, BatchRef):
                    raise TypeError(
                        f"Under ParameterServerStrategy, Keras' {self.kind} steps run on the "
                        f"workers from model.fit/evaluate/predict inputs; got a batch of type "
                        f"{type(ref).__name__} (train_on_batch/test_on_batch/predict_on_batch "
                        "are not supported): call fit/evaluate/predict instead."
                    )
                refs.append(ref)
            if not refs:
                break
            self._queue.append((self._coordinator.schedule(self._group_fn, args=(refs,)),
                                len(refs)))
            self._scheduled += 1
            self._steps_scheduled += len(refs)

    def _group_fn(self, refs: list[BatchRef]) -> Any:
        outputs = [self._strategy.run(self._replica, args=(ref.placeholders(),)) for ref in refs]
        if self.kind == "predict":
            return outputs
        return self._strategy.reduce(ReduceOp.SUM, outputs, axis=None)
