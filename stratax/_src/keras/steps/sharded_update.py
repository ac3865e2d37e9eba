"""``fit``'s optimizer update sharded over the processes (ZeRO stage 1) in the group program.

In the packed step (``keras.steps.packed_step``) every process all-reduces the whole gradient and
then repeats the whole optimizer update, so the update does not shrink when the batch is split over
more processes while the forward and backward passes do (docs/design/performance.md gives
its share of a step). Here, in the group program
of ``steps_per_execution`` steps kept on the devices, each process updates only its part of
every variable, as XLA's cross-replica weight-update sharding does for TPUs (Xu et al., 2020)
and DeepSpeed's ZeRO stage 1 does for GPUs: the gradients are reduce-scattered (each process
gets the sum of its parts), a clone of the user's optimizer built over those parts updates them
and the optimizer's slots (Adam's moments) for its parts only, and the new parts are
all-gathered, all over shared memory (``runtime.shm_collectives``). The slots stay sharded
through the group's steps and are gathered once at its end, so everything outside the program
(Keras' variables, checkpoints, callbacks) sees the replicated state it always did.

Used only where it computes what the replicated update computes, element by element
(:func:`why_not`): the shared-memory transport (with gloo, two collectives a step would cost
two round trips), groups of more than one step, an optimizer whose update of an element reads
only that element's gradient, value and slots (SGD, Adam and their like: not Adafactor, not
norm clipping, not an EMA of the weights), all in float32. ``STRATAX_SHARDED_UPDATE=off`` keeps
the replicated update.

Each element is updated by the same operations, and every process ends with the same bits (the
all-gather copies them); the sums are the all-reduce's (the same rank order), so the only
difference from the replicated step is XLA compiling the update over other shapes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import PartitionSpec as P

from stratax._src import seam
from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.keras.steps import device_rows, packed_step
from stratax._src.strategies.replica_context import REPLICA_AXIS

# Optimizers whose update of an element reads only that element's gradient, value and slots
# (and scalars such as the step count): exactly these classes, not subclasses, which may
# override the update.
ELEMENTWISE = (keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW,
               keras.optimizers.Adamax, keras.optimizers.Nadam, keras.optimizers.RMSprop,
               keras.optimizers.Adagrad, keras.optimizers.Adadelta, keras.optimizers.Lion)
_PART = "stratax_update_part"


def enabled_by_option() -> bool:
    """Option ``sharded_update`` (``STRATAX_SHARDED_UPDATE``): ``auto`` (default: wherever
    :func:`why_not` allows) or ``off``."""
    return config.sharded_update == "auto"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a model's variables and optimizer slots are cut into the processes' parts.

    Args:
        optimizer: a clone of the model's optimizer, built over one flat part per trainable
            variable (``parts[i]`` elements).
        shapes: the trainable variables' shapes.
        parts: each trainable variable's part size (its size over the processes, rounded up).
        sources: for each of the clone's variables, the index of the model optimizer's
            variable it stands for.
        owners: for each of the clone's variables, the index of the trainable variable whose
            slot (e.g. Adam's momentum) it is, or ``None`` (the step count, the learning rate).
    """

    optimizer: Any
    shapes: tuple[tuple[int, ...], ...]
    parts: tuple[int, ...]
    sources: tuple[int, ...]
    owners: tuple[int | None, ...]


def why_not(model: Any, strategy: Any, group: int) -> str | None:
    """Why ``model``'s group program keeps the replicated update, or ``None``."""
    if not enabled_by_option():
        return f"{env.STRATAX_SHARDED_UPDATE}=off"
    if group < 2:
        return "steps_per_execution is 1"
    exchanges = strategy.cross_device_ops.exchanges()
    return exchanges if isinstance(exchanges, str) else model_problem(model)


def model_problem(model: Any) -> str | None:
    """Why updating ``model``'s variables part by part would not be its optimizer's update, or
    ``None``."""
    optimizer = model.optimizer
    if type(optimizer) not in ELEMENTWISE:
        return f"{type(optimizer).__name__} is not one of the element-wise optimizers"
    for option in ("clipnorm", "global_clipnorm"):
        if getattr(optimizer, option, None) is not None:
            return f"the optimizer clips by {option}, which reads every element"
    if optimizer.use_ema or (optimizer.gradient_accumulation_steps or 0) > 1:
        return "the optimizer keeps an EMA of the weights or accumulates gradients"
    if optimizer.weight_decay and (getattr(optimizer, "_exclude_from_weight_decay", None)
                                   or getattr(optimizer, "_exclude_from_weight_decay_pattern",
                                              None)):
        return "weight decay excludes some variables"
    if any(getattr(v, "overwrite_with_gradient", False) for v in model.trainable_variables):
        return "a variable is overwritten with its gradient"
    variables = [*model.trainable_variables, *model.metrics_variables]
    if any(np.dtype(v.dtype) != np.float32 for v in variables):
        return "a trainable or metric variable is not float32"
    return None


def plan(model: Any, world: int) -> Plan | str:
    """The model's :class:`Plan` over ``world`` processes, or why its optimizer cannot be
    cloned over parts."""
    optimizer = model.optimizer
    trainables = model.trainable_variables
    shapes = tuple(tuple(v.shape) for v in trainables)
    parts = tuple(-(-math.prod(shape) // world) for shape in shapes)
    try:
        clone = type(optimizer).from_config(optimizer.get_config())
    except Exception as error:  # a custom schedule or option that does not round-trip
        return f"the optimizer cannot be re-created from its config ({error})"
    placeholders = [keras.Variable(np.zeros((part,), np.float32), name=f"{_PART}_{i}")
                    for i, part in enumerate(parts)]
    clone.build(placeholders)
    names: dict[str, int] = {}
    for index, variable in enumerate(optimizer.variables):
        names.setdefault(variable.name, index)
    prefixes = [(f"{v.path.replace('/', '_')}_", f"{t.path.replace('/', '_')}_")
                for v, t in zip(placeholders, trainables, strict=True)]
    sources: list[int] = []
    owners: list[int | None] = []
    for variable in clone.variables:
        owner = next((i for i, (mine, _) in enumerate(prefixes)
                      if variable.name.startswith(mine)), None)
        owners.append(owner)
        if owner is None:
            sources.append(-1)
            continue
        mine, theirs = prefixes[owner]
        name = theirs + variable.name[len(mine):]
        source = names.get(name, -1)
        if source < 0 or tuple(optimizer.variables[source].shape) != shapes[owner]:
            return f"the optimizer has no slot {name!r} of the trainable variable's shape"
        sources.append(source)
    # The clone's other variables (step count, learning rate, ...) are the original's others,
    # in order.
    claimed = {s for s in sources if s >= 0}
    others = [i for i in range(len(optimizer.variables)) if i not in claimed]
    plain = [j for j, owner in enumerate(owners) if owner is None]
    if len(claimed) != len(sources) - len(plain) or len(others) != len(plain):
        return "the optimizer's variables do not map one to one onto its clone's"
    for j, i in zip(plain, others, strict=True):
        if tuple(optimizer.variables[i].shape) != tuple(clone.variables[j].shape):
            return f"the optimizer's variable {optimizer.variables[i].name!r} changed shape"
        sources[j] = i
    if any(np.dtype(optimizer.variables[i].dtype) != np.float32
           for i, owner in zip(sources, owners, strict=True) if owner is not None):
        return "an optimizer slot is not float32"
    return Plan(clone, shapes, parts, tuple(sources), tuple(owners))


def group_program(model: Any, strategy: Any, layout: Plan,
                  out_shardings: Any) -> Callable[[Any, device_rows.RowGroup], Any]:
    """The jitted ``program(state, rows) -> (logs, state)`` running the group's steps, each
    with one reduce-scatter and one all-gather, and one all-gather of the slots at the end.

    ``state`` is Keras' JAX train state (replicated, donated) and comes back replicated;
    ``rows`` a :class:`device_rows.RowGroup` of batches that split over the replicas.
    """
    world = strategy.num_replicas_in_sync
    optimizer, parts = layout.optimizer, layout.parts
    exchanges = strategy.cross_device_ops.exchanges()
    if isinstance(exchanges, str):
        raise RuntimeError(f"internal: a sharded update without exchanges ({exchanges}).")

    def padded(value: Any, part: int) -> Any:
        """``value`` flat, padded with zeros to ``world * part`` elements."""
        flat = value.reshape(-1)
        return jnp.pad(flat, (0, world * part - flat.shape[0]))

    def own(value: Any, part: int) -> Any:
        """This process's part of ``value`` (flattened and padded)."""
        start = jax.lax.axis_index(REPLICA_AXIS) * part
        return jax.lax.dynamic_slice_in_dim(padded(value, part), start, part)

    def whole(gathered: Any, shape: tuple[int, ...]) -> Any:
        """A variable from its gathered parts (in process order)."""
        return gathered[:math.prod(shape)].reshape(shape)

    def body(state: Any, rows: device_rows.RowGroup) -> Any:
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        # The clone's state: this process's part of every slot, the scalars as they are.
        sharded = [optimizer_vars[i] if owner is None else own(optimizer_vars[i], parts[owner])
                   for i, owner in zip(layout.sources, layout.owners, strict=True)]

        def step(carry: Any, start: Any) -> tuple[Any, Any]:
            trainable, sharded, metrics_vars = carry
            data = device_rows.replica_batch(rows.batch(start), world)
            # optimizer_vars (the group's first values) serve only Keras' loss scaling, which
            # reads none of them for the optimizers allowed here.
            grads, _, local_metrics = seam.keras_gradients_and_metrics(
                model, trainable, non_trainable, optimizer_vars, metrics_vars, data)
            deltas = [d.reshape(-1) for d in packed_step.metric_deltas(local_metrics,
                                                                       metrics_vars)]
            # The metric deltas travel as every process's part of one more operand, so the
            # same call sums them for everyone.
            *grads, summed = exchanges.reduce_scatter(
                [padded(g, part) for g, part in zip(grads, parts, strict=True)]
                + [jnp.tile(jnp.concatenate([*deltas, jnp.zeros((0,), jnp.float32)]), world)])
            metrics_vars = _plus_flat(metrics_vars, summed)
            new_parts, sharded = optimizer.stateless_apply(
                sharded, [g / world for g in grads],
                [own(v, part) for v, part in zip(trainable, parts, strict=True)])
            trainable = [whole(g, shape) for g, shape in
                         zip(exchanges.all_gather(new_parts), layout.shapes, strict=True)]
            return (trainable, sharded, metrics_vars), packed_step.step_logs(model, metrics_vars)

        (trainable, sharded, metrics_vars), logs = jax.lax.scan(
            step, (trainable, sharded, metrics_vars), jnp.stack(rows.starts))
        # The custom calls carry no JAX effect (C++ dispatch), so only data orders them: each
        # step's reduce-scatter needs the previous all-gather's parameters, its all-gather the
        # update of its reduce-scatter's sums. The barrier makes the slots' all-gather wait
        # for the last step's too, even if XLA unrolled the loop.
        trainable, sharded = jax.lax.optimization_barrier((trainable, sharded))
        slots = [j for j, owner in enumerate(layout.owners) if owner is not None]
        gathered = exchanges.all_gather([sharded[j] for j in slots]) if slots else []
        optimizer_vars = list(optimizer_vars)
        for j, (i, owner) in enumerate(zip(layout.sources, layout.owners, strict=True)):
            if owner is None:
                optimizer_vars[i] = sharded[j]
        for j, value in zip(slots, gathered, strict=True):
            optimizer_vars[layout.sources[j]] = whole(value, layout.shapes[layout.owners[j]])
        logs = jax.tree.map(lambda stacked: stacked[-1], logs)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def train_steps(state: Any, rows: device_rows.RowGroup) -> Any:  # for jit's logs, profiles
        return jax.shard_map(body, mesh=strategy.mesh, in_specs=(P(), P()),
                             out_specs=(P(), P()), axis_names=frozenset({REPLICA_AXIS}),
                             check_vma=False)(state, rows)

    return jax.jit(train_steps, donate_argnums=0, out_shardings=out_shardings)


def _plus_flat(arrays: list[Any], flat: Any) -> list[Any]:
    """Each of ``arrays`` plus its piece of ``flat`` (their elements one after the other)."""
    out, offset = [], 0
    for array in arrays:
        out.append(array + flat[offset:offset + array.size].reshape(array.shape))
        offset += array.size
    return out
