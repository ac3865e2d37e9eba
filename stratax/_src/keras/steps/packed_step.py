"""A Keras train step whose gradient all-reduce is one flat buffer (or a few packs).

Left to GSPMD, ``fit``'s step over the ``"replica"`` axis all-reduces every gradient tensor on
its own. XLA combines them into one tuple all-reduce, but its CPU runtime still calls the
transport once per tensor, one after the other; between processes each gloo call costs a
round trip, so a 2-process MLP step spent nearly all its time in collectives
(docs/design/performance.md). This step runs Keras' own forward, loss and metrics on each
replica's share of the batch inside ``jax.shard_map`` and sums, in one packed collective
(``strategies.packing``; ``CommunicationOptions(bytes_per_pack=...)``), the gradients together
with the metric-variable updates; then every replica applies the same optimizer update.

It computes what the GSPMD step computes when the global loss is the mean of the replicas'
losses and metric states are sums of per-example terms (Keras' metrics keep totals and
counts; TensorFlow's MultiWorkerMirroredStrategy sums metric variables over replicas the same
way), so it is used only when that holds (:func:`eligible`): Keras' own ``train_step``,
``compute_loss`` and ``compute_metrics``, every compiled loss reduced with
``"sum_over_batch_size"``, no loss added by the forward pass (``add_loss`` in a layer's call,
activity regularizers: Keras computes them over the batch it is given, so on a replica's share
a sum over rows would be averaged as if it were a mean; ``keras.steps.forward_losses``), no
non-trainable variables (batch statistics or random-number state would differ per replica), a
jitted step. Any other model, and a batch given whole to every replica, keeps the GSPMD step,
which computes Keras' loss over the whole global batch as one device does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import keras
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src import seam
from stratax._src.core.reduce_op import ReduceOp
from stratax._src.keras.steps import device_rows, epoch_logs, forward_losses
from stratax._src.strategies.replica_context import REPLICA_AXIS

_MEAN_REDUCTION = "sum_over_batch_size"


def eligible(model: Any, first_batch: Callable[[], Any]) -> str | None:
    """Why ``model``'s train step must stay GSPMD's, or ``None`` when it can be packed.

    ``first_batch()`` gives one of the step's batches (any rows): once the cheaper checks pass,
    the forward pass is traced on it to find the losses it adds (once per model).
    """
    if model.run_eagerly or not model.jit_compile:
        return "the step is not jit-compiled"
    if model.optimizer is None:
        return "no optimizer"
    name = epoch_logs.overridden(model, ("train_step", "compute_loss", "compute_metrics"))
    if name is not None:
        return f"the model overrides {name}"
    if model.non_trainable_variables:
        return "the model has non-trainable variables (batch statistics or random state)"
    for loss in keras.tree.flatten(model.loss):
        reduction = getattr(loss, "reduction", _MEAN_REDUCTION)
        if isinstance(loss, keras.losses.Loss) and reduction != _MEAN_REDUCTION:
            return f"a loss is reduced with {reduction!r}, not {_MEAN_REDUCTION!r}"
    return forward_losses.problem(model, first_batch)


def splits_over_replicas(data: Any) -> bool:
    """True when every array of the batch is sharded along its first axis over the replicas
    (or the batch is a ``device_rows.RowBatch``, which names only batches that split)."""
    if isinstance(data, device_rows.RowBatch):
        return True
    leaves = jax.tree.leaves(data)
    return bool(leaves) and all(
        isinstance(getattr(leaf, "sharding", None), NamedSharding)
        and len(leaf.sharding.spec) > 0 and leaf.sharding.spec[0] == REPLICA_AXIS
        for leaf in leaves
    )


def compiled_packed_step(model: Any, strategy: Any, state: Any) -> Callable[..., Any]:
    """The jitted ``step(state, data) -> (logs, state)`` with one packed gradient all-reduce.

    ``data`` must be sharded over the replicas along its first axis, or a
    ``device_rows.RowBatch``; ``state`` is Keras' JAX train state (replicated) and is donated,
    as Keras' own step donates it; the step returns its state placed as the given ``state``
    (one such state) is placed (:func:`output_shardings`).
    """
    replicas = strategy.num_replicas_in_sync
    bytes_per_pack = strategy.bytes_per_pack
    ops = strategy.cross_device_ops

    def replica_step(state: Any, data: Any) -> Any:
        """One replica's step."""
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        data = device_rows.replica_batch(data, replicas)
        grads, non_trainable, local_metrics = seam.keras_gradients_and_metrics(
            model, trainable, non_trainable, optimizer_vars, metrics_vars, data)
        deltas = metric_deltas(local_metrics, metrics_vars)
        summed_grads, summed_deltas = ops.all_reduce(ReduceOp.SUM, (grads, deltas),
                                                     bytes_per_pack, only_call=True)
        grads = jax.tree.map(lambda g: g / replicas, summed_grads)
        metrics_vars = [old + d for old, d in zip(metrics_vars, summed_deltas, strict=True)]
        trainable, optimizer_vars = model.optimizer.stateless_apply(
            optimizer_vars, grads, trainable)
        return step_logs(model, metrics_vars), (trainable, non_trainable, optimizer_vars,
                                                metrics_vars)

    def train_step(state: Any, data: Any) -> Any:  # Keras' name, for jit's logs and profiles
        # A RowBatch is whole on every replica; each gathers its own rows.
        split = P() if isinstance(data, device_rows.RowBatch) else P(REPLICA_AXIS)
        return jax.shard_map(replica_step, mesh=strategy.mesh, in_specs=(P(), split),
                             out_specs=(P(), P()), axis_names=frozenset({REPLICA_AXIS}),
                             check_vma=False)(state, data)

    return jax.jit(train_step, donate_argnums=0, out_shardings=output_shardings(strategy, state))


def metric_deltas(local_metrics: list[Any], metrics_vars: list[Any]) -> list[Any]:
    """What one replica's step added to each metric variable (summed over the replicas)."""
    return [new - old for new, old in zip(local_metrics, metrics_vars, strict=True)]


def step_logs(model: Any, metrics_vars: list[Any]) -> Any:
    """Keras' logs of a train step whose metric variables hold ``metrics_vars``."""
    with keras.StatelessScope(state_mapping=list(zip(model.metrics_variables, metrics_vars,
                                                     strict=True))):
        return model.get_metrics_result()


def output_shardings(strategy: Any, state: Any) -> tuple[Any, Any]:
    """``(logs, state)`` shardings of a step's outputs: the state's are those of ``state``,
    Keras' train state as it reads it from the variables at the start of its loop (while the
    loop runs, the variables themselves may hold no value).

    The variables are replicated as ``P(None, ...)`` (Keras' layout); left alone, the group
    program (``keras.steps.group_step``) returned 1-D state as ``P()``, an equal placement that
    jit's dispatch cache still tells apart, so the first group of every fit's second epoch (Keras
    reads the synced variables back) missed the cache and took JAX's slow Python path.
    """
    return (NamedSharding(strategy.mesh, P()),
            tuple([value.sharding for value in values] for values in state))

