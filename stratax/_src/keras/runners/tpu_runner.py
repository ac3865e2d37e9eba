"""``TPURunner``: how ``fit``/``evaluate``/``predict`` run under ``TPUStrategy`` (TPU semantics).

The runner implements the per-strategy runner shape of the Keras seam (``placement_scope``,
``prepare``, ``batches``, ``make_step``) with what a TPU wants:

- **Static shapes.** Every batch has the global batch size ``B``. A last, partial batch of
  ``n < B`` rows is padded with zero rows, so the step never recompiles for it.
- **Exact loss and metrics on a padded batch.** Padding rows get sample weight 0 and, in the
  step (which counts ``n`` over every host), real rows their weight times ``B / n``: with
  Keras' default ``"sum_over_batch_size"`` reduction the loss is then ``sum(l * w) / n``, so
  the loss and its gradient (hence the update) are exactly those of the ``n`` real rows.
  Metrics need more, because Keras weights its loss tracker by the padded row count ``B`` and
  gives no sample weight to ``compile(metrics=[...])``: the padded step also runs Keras' step
  twice more from the same state, once with the real rows' own weights (C) and once on
  padding rows only (Z), and keeps the metric variables
  ``M_C - (B - n) / B * (M_Z - M_0)``. Metric updates are sums of per-row terms and every
  padding row is the same zero row, so this removes exactly the padding rows' terms, for every
  metric (see ``tpu_padding.exact_padded_metrics``); it costs two extra steps once per epoch.
  Limits: rows that differ randomly (dropout on the padding rows) make unweighted metrics
  approximate, and
  ``BatchNormalization`` batch statistics include the padding rows. A loss the forward pass adds
  (a layer's ``add_loss``, an activity regularizer) is computed over the padded batch and
  cannot be corrected: ``fit`` and ``evaluate`` of such a model refuse a padded batch. Full
  batches run Keras' step over the whole global batch, so such losses are one device's there.
- **One program for ``steps_per_execution`` steps.** The ``N`` batches of a group are stacked
  and placed once, and one jitted program runs ``jax.lax.scan`` over them (Keras' step inlined),
  so ``N`` steps cost one host dispatch. A short last group is padded with skipped steps
  (``lax.cond``), so it reuses the same program.
- **Placement**: a Keras ``ModelParallel`` distribution on the strategy's ``("replica",
  "core")`` mesh: batches split over ``"replica"``; variables laid out by the strategy's
  ``LayoutMap`` (replicated otherwise).
- **Pod slices (several hosts)**: each host feeds its share of every global batch, as the
  feed shares it among processes under every strategy (``FeedLayout.share``), padded exactly
  (:meth:`TPURunner._host_share`); the group is assembled from the hosts' shares with
  ``jax.make_array_from_process_local_data`` (as ``MeshRunner`` places a batch), with each
  host's count of real rows, which the step sums (so per-host inputs may differ in rows at a
  step); logs and predictions come back replicated, so every host reads them.

Example (what the Keras seam does for ``model.fit`` under a ``TPUStrategy``)::

    runner = TPURunner(strategy)
    arguments = runner.prepare("fit", arguments)
    with runner.placement_scope():
        train_function = runner.make_step(model, "train", keras_jitted_train_step)  # a plan
        logs, state = train_function(state, iterator_of(runner.batches(data_adapter)))
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.distributed_input import global_batch
from stratax._src.keras import model_parallel
from stratax._src.keras.feed import GlobalFeed
from stratax._src.keras.runners.runner import KerasRunner, steps_per_execution
from stratax._src.keras.runners.tpu_padding import (
    RowWeights,
    crop_predictions,
    exact_padded_metrics,
    metrics_logs,
    pad_batch,
    replace_metrics,
)
from stratax._src.keras.steps import forward_losses
from stratax._src.keras.steps import plan as plan_lib
from stratax._src.runtime import distributed
from stratax._src.strategies.replica_context import REPLICA_AXIS
from stratax._src.strategies.tpu import TPUStrategy

_KERAS_DEFAULT_BATCH = 32
_EXACT_REDUCTIONS = (None, "sum_over_batch_size", "mean")
# Position of the metric variables in Keras' JAX step state, per kind of step.
_METRICS_INDEX = {"train": 3, "test": 2, "predict": None}


class TPURunner(KerasRunner):
    """Runs Keras' steps for a ``TPUStrategy``: static shapes, padded batches, on-device loops.

    Args:
        strategy: The ``TPUStrategy`` the model belongs to.
    """

    def __init__(self, strategy: TPUStrategy) -> None:
        super().__init__(strategy)
        self.distribution = model_parallel.distribution_for(strategy)
        # The static global batch size of each input, not one for the runner: fit's
        # validation (an evaluate inside fit) may batch differently from its training.
        self._batch_sizes: weakref.WeakKeyDictionary[GlobalFeed, int] = (
            weakref.WeakKeyDictionary())
        self._stacked_sharding = NamedSharding(strategy.mesh, P(None, REPLICA_AXIS))
        self._replicated = NamedSharding(strategy.mesh, P())

    # ------------------------------------------------------------------ runner interface
    def placement_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Keras variables and batches go where the strategy's ``ModelParallel`` puts them."""
        return self.distribution.scope()

    def prepare(self, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Fixes the static global batch size of the input (and of ``fit``'s array
        ``validation_data``) and checks it splits over the replicas.

        Raises:
            ValueError: the batch size does not split over the replicas of every host, or
                (several hosts) the device assignment interleaves the hosts' replicas.
        """
        if self.strategy.is_multi_process:
            _check_hosts_in_order(self.strategy, method)
        batch_size = arguments.get("batch_size")
        if batch_size is None and isinstance(arguments.get("x"), (np.ndarray, jax.Array)):
            batch_size = _KERAS_DEFAULT_BATCH
        validation_size = arguments.get("validation_batch_size") or batch_size
        if batch_size is not None:
            self._check_batch_size(batch_size, f"model.{method}(..., batch_size=")
        arguments = super().prepare(method, arguments)
        x, validation = arguments.get("x"), arguments.get("validation_data")
        if isinstance(x, GlobalFeed) and batch_size is not None:
            self._batch_sizes[x] = batch_size
        # Array validation data is cut at validation_size; other feeds' batches are measured
        # on their first pass (:meth:`_padded_shares`).
        if (isinstance(validation, GlobalFeed) and validation.array_split() is not None
                and validation_size is not None):
            self._batch_sizes[validation] = validation_size
        return arguments

    def _check_batch_size(self, batch_size: int, fix: str) -> None:
        replicas = self.strategy.num_replicas_in_sync
        if batch_size % replicas:
            hosts = self.strategy.num_processes
            over = (f"{replicas} TPU replicas ({hosts} hosts x {replicas // hosts})"
                    if hosts > 1 else f"{replicas} TPU replicas")
            raise ValueError(
                f"Global batch size {batch_size} does not split over {over}; "
                f"use a multiple of {replicas}, e.g. `{fix}"
                f"{global_batch.suggested_batch(batch_size, replicas)})`."
            )

    def feed_batches(self, feed: GlobalFeed, call: Any) -> Iterator[Any]:
        """One pass of ``feed``'s batches, each this host's padded share of a global batch of
        the feed's static size (:meth:`_padded_shares`)."""
        return self._padded_shares(feed.local_batches(), feed)

    def batches(self, local_batches: Iterator[tuple[Any, bool]]) -> Iterator[Any]:
        """One pass of this host's batches of an input without a feed, each padded to its
        share of a global batch of the first batch's size (:meth:`_padded_shares`)."""
        return self._padded_shares(local_batches, None)

    def _padded_shares(self, local_batches: Iterator[tuple[Any, bool]],
                       feed: GlobalFeed | None) -> Iterator[Any]:
        """This host's batches, each padded to its static share of the global batch
        (:meth:`_host_share`); the step assembles a whole group of them from every host's
        shares at once. The static size is ``feed``'s (:meth:`prepare`), else the first
        batch's, kept for ``feed``'s later passes."""
        size = None if feed is None else self._batch_sizes.get(feed)
        for batch, replicated in local_batches:
            if size is None:
                rows = _rows(batch)
                size = rows if replicated else rows * self.strategy.num_processes
                self._check_batch_size(size, "batches of size (")
                if feed is not None:
                    self._batch_sizes[feed] = size
            yield self._host_share(batch, replicated, size)

    def _host_share(self, batch: Any, replicated: bool,
                    size: int) -> tuple[Any, Any, RowWeights]:
        """This host's rows of a global batch of the static ``size``, padded (``pad_batch``);
        ``real_rows`` counts the real rows among them.

        A whole global batch (one host, a batch that does not split over the replicas, or
        ``predict``) is padded to the static size, real rows first, and cut into the hosts'
        equal shares. A host's own rows (its share of a batch that splits, the feed's
        ``FeedLayout.share``, or a per-host input's batch) are padded to its share of the
        static size: every host pads its own rows, which changes no loss, gradient or metric
        (padding rows weigh nothing and the metrics drop them wherever they are).
        """
        hosts = self.strategy.num_processes
        if hosts == 1:
            return pad_batch(batch, size)
        share = size // hosts
        if not replicated:
            return pad_batch(batch, share)
        x, y, weights = pad_batch(batch, size)
        start = self.strategy.process_rank * share
        x, y, weights = jax.tree.map(lambda a: a[start:start + share], (x, y, weights))
        weights.real_rows = min(max(weights.real_rows - start, 0), share)
        return x, y, weights

    def place_unconverted(self, batches: Iterator[Any]) -> Iterator[Any]:
        return self.batches((batch, False) for batch in batches)

    def make_step(self, model: Any, kind: str,
                  step_fn: Callable[[Any, Any], tuple[Any, Any]]) -> plan_lib.PlannedStep:
        """Returns the planned step (plan ``tpu-loop``) whose ``function(state, iterator) ->
        (logs, state)`` runs up to ``model.steps_per_execution`` batches of ``iterator`` as one
        on-device loop.

        Raises:
            ValueError: ``kind`` is not ``"train"``, ``"test"`` or ``"predict"``.
        """
        if kind not in _METRICS_INDEX:
            raise ValueError(f"kind must be 'train', 'test' or 'predict'; received {kind!r}.")
        group = steps_per_execution(model)
        program = self._group_program(model, kind, step_fn)
        compiled: list[Callable[..., Any]] = []

        def function(state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
            steps = _take(iterator, group)
            padded = [batch for batch in steps if batch[2].padded]
            if padded:
                self._check_exact_padding(model, kind, padded[0])
            # The state keeps its layout from call to call (committed to it, as the outputs
            # are), so one program serves every call.
            shardings = jax.tree.map(lambda a: a.sharding, state)
            state = jax.device_put(state, shardings)
            if not compiled:
                # Several hosts: logs and predictions replicated, so that every host reads them.
                outputs_sharding = self._replicated if self.strategy.is_multi_process else None
                compiled.append(jax.jit(program, donate_argnums=0,
                                        out_shardings=(outputs_sharding, shardings)))
            outputs, state = compiled[0](state, *self._stack(steps, group))
            self.strategy.dispatch_window.admit(outputs)  # the state is donated next call
            if kind == "predict":
                outputs = crop_predictions(*outputs, len(steps), self.strategy.num_processes)
            return outputs, state

        over = f"{self.strategy.num_replicas_in_sync} TPU replica(s)"
        if self.strategy.is_multi_process:
            over += f" on {self.strategy.num_processes} hosts, each feeding its share"
        return plan_lib.PlannedStep.fixed(
            plan_lib.StepPlan(kind, step="tpu-loop", over=over,
                              group=group, group_program=True,
                              window=max(self.strategy.dispatch_window.size, 0)),
            plan_lib.StepPrograms(whole=function))

    def call(self, run: Callable[[], Any]) -> Any:
        """Runs Keras' method; on several hosts a peer's failure in a collective is named."""
        if self.strategy.is_multi_process:
            return distributed.translate_collective_errors(run)
        return run()

    # ------------------------------------------------------------------ internals
    def _stack(self, steps: list[Any], group: int) -> tuple[Any, Any, Any]:
        """The group's batches as global arrays ``(group, batch, ...)`` and their real-row
        counts ``(group, replicas)``, split over the replicas: each host gives its share of
        every batch and its count in its first replica's column
        (``jax.make_array_from_process_local_data``, as ``MeshRunner`` places a batch); the
        valid-step mask, replicated."""
        filler = jax.tree.map(np.zeros_like, steps[-1])
        padded = steps + [filler] * (group - len(steps))
        stacked = jax.tree.map(lambda *leaves: np.stack([np.asarray(v) for v in leaves]), *padded)
        replicas = self.strategy.num_replicas_in_sync
        real = np.zeros((group, replicas // self.strategy.num_processes), np.int32)
        real[:len(steps), 0] = [int(b[2].real_rows) for b in steps]
        valid = np.arange(group) < len(steps)
        size = self._global_rows(steps[0])
        placed = jax.tree.map(lambda a: self._assembled(a, size), stacked)
        return (placed, self._assembled(real, replicas),
                jax.make_array_from_process_local_data(self._replicated, valid, valid.shape))

    def _assembled(self, local: np.ndarray, rows: int) -> jax.Array:
        """The global ``(group, rows, ...)`` array whose second axis, split over the replicas,
        is every host's ``local`` part."""
        return jax.make_array_from_process_local_data(
            self._stacked_sharding, local, (local.shape[0], rows, *local.shape[2:]))

    def _group_program(self, model: Any, kind: str,
                       step_fn: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[..., Any]:
        metrics_index = _METRICS_INDEX[kind]

        def tpu_steps(state: Any, stacked: Any, real: Any, valid: Any) -> tuple[Any, Any]:
            size = jax.tree.leaves(stacked)[0].shape[1]

            def one_step(state: Any, inputs: Any) -> tuple[Any, Any]:
                batch, host_rows, ok = inputs
                rows = jnp.sum(host_rows)   # the real rows of the global batch, every host's
                out_shape = jax.eval_shape(step_fn, state, batch)[0]

                def full(state: Any) -> tuple[Any, Any]:
                    return step_fn(state, batch)

                def padded(state: Any) -> tuple[Any, Any]:
                    x, y, own = batch
                    scaled = own * (size / rows.astype(own.dtype))   # Keras divides by size
                    out, new_state = step_fn(state, (x, y, scaled))
                    if metrics_index is None:
                        return out, new_state
                    metrics = exact_padded_metrics(step_fn, state, batch, rows, size,
                                                    metrics_index)
                    return out, replace_metrics(new_state, metrics_index, metrics)

                def run(state: Any) -> tuple[Any, Any]:
                    out, new_state = jax.lax.cond(rows == size, full, padded, state)
                    return (out if kind == "predict" else None), new_state

                def skip(state: Any) -> tuple[Any, Any]:
                    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
                    return (zeros if kind == "predict" else None), state

                out, state = jax.lax.cond(ok, run, skip, state)
                return state, out

            state, outs = jax.lax.scan(one_step, state, (stacked, real, valid))
            if metrics_index is None:
                return (outs, real), state
            return metrics_logs(model, state[metrics_index]), state

        return tpu_steps

    def _global_rows(self, batch: Any) -> int:
        """The static global batch size of a step whose batch, on this host, is ``batch``
        (every host's share has the same number of rows)."""
        return len(batch[2]) * self.strategy.num_processes

    def _check_exact_padding(self, model: Any, kind: str, batch: Any) -> None:
        """Refuses a padded batch whose loss cannot be made exact (a step of ``kind`` on
        ``batch``, one of the padded batches).

        Raises:
            ValueError: a compiled loss is not a mean over the batch, or (``fit``,
                ``evaluate``) the forward pass adds losses, which the padding rows change.
        """
        problem = None if kind == "predict" else forward_losses.problem(model, lambda: batch)
        size = self._global_rows(batch)
        if problem is not None:
            raise ValueError(
                f"The last batch has fewer rows than the static batch size {size} "
                f"and is padded; the model's loss cannot be made exact on padded rows: "
                f"{problem}. Use a data size that is a multiple of the batch size (e.g. "
                "`x[:len(x) // batch_size * batch_size]`)."
            )
        for loss in jax.tree.leaves(getattr(model, "loss", None)):
            reduction = getattr(loss, "reduction", None)
            if reduction not in _EXACT_REDUCTIONS:
                raise ValueError(
                    f"The last batch has fewer rows than the static batch size {size}"
                    f" and is padded; a loss with reduction={reduction!r} cannot be made exact on "
                    "padded rows. Use the default reduction ('sum_over_batch_size'), or a data "
                    "size that is a multiple of the batch size."
                )


def _check_hosts_in_order(strategy: TPUStrategy, method: str) -> None:
    """Each host's share of a batch is a block of the replica axis: host 0's replicas first,
    then host 1's, ..., every replica's cores on one host.

    Raises:
        ValueError: naming the replica out of place.
    """
    grid = strategy.mesh.devices.reshape(strategy.num_replicas_in_sync, -1)
    hosts = [sorted({device.process_index for device in replica}) for replica in grid]
    for replica, owners in enumerate(hosts):
        before = hosts[replica - 1][0] if replica else 0
        if len(owners) > 1 or owners[0] < before:
            raise ValueError(
                f"model.{method} on a TPU pod slice feeds each host's share of a batch to that "
                f"host's replicas, which must come host by host; replica {replica} is on "
                f"host(s) {owners}, after a replica on host {before}. Use the default device "
                "assignment, or a DeviceAssignment whose computation_shape keeps each "
                "replica's cores on one host."
            )


def _rows(batch: Any) -> int:
    return int(np.shape(jax.tree.leaves(keras.utils.unpack_x_y_sample_weight(batch)[0])[0])[0])


def _take(iterator: Iterator[Any], count: int) -> list[Any]:
    steps = []
    for _ in range(count):
        try:
            steps.append(next(iterator))
        except StopIteration:
            break
    if not steps:
        raise StopIteration
    return steps
