"""Model parallelism with Keras' own tools: a ``ModelParallel`` distribution on a strategy's mesh.

A strategy whose mesh has a ``"core"`` axis (``TPUStrategy`` with several logical cores per
replica, ``MirroredStrategy(cores_per_replica=...)``) or that was given a ``layout_map`` lays
its Keras variables out with ``keras.distribution.ModelParallel``: the ``LayoutMap`` (variable
path regex -> axes) splits the variables it names over the mesh, the others are replicated,
and batches are split over ``"replica"`` (``batch_dim_name="replica"``). The same ``LayoutMap``
serves any strategy whose mesh has the axes it names: one program, any mesh.

The strategies' Keras runners enter that distribution (``distribution_for``) in ``scope()`` and
in every ``fit``/``evaluate``/``predict`` call.

Across processes (``MultiWorkerMirroredStrategy(cores_per_replica=..., layout_map=...)``) a
variable split over a mesh axis whose devices lie in several processes is held in parts: no
process can read it whole. ``model.get_weights()`` and ``model.save`` gather such state into
every process first when it fits (:func:`whole_values`), or refuse naming the fix.

Example:
    >>> layout_map = keras.distribution.LayoutMap(None)     # re-homed onto the strategy's mesh
    >>> layout_map["dense.*kernel"] = (None, "core")        # split the output units over cores
    >>> strategy = sx.TPUStrategy(resolver, experimental_device_assignment=assignment,
    ...                           layout_map=layout_map)
"""

from __future__ import annotations

import contextlib
import math
import re
import resource
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from keras import distribution as keras_distribution

from stratax._src import seam
from stratax._src.checkpoint import sharded_state
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.replica_context import CORE_AXIS, REPLICA_AXIS

_distributions: weakref.WeakKeyDictionary[Strategy, keras_distribution.ModelParallel] = (
    weakref.WeakKeyDictionary()
)


def needs_model_parallel(strategy: Any) -> bool:
    """True for a strategy with a ``"core"`` mesh axis or a ``layout_map``."""
    return isinstance(strategy, Strategy) and (
        CORE_AXIS in strategy.mesh.shape or strategy.layout_map is not None)


def device_mesh(strategy: Strategy) -> keras_distribution.DeviceMesh:
    """The strategy's ``jax.sharding.Mesh`` as a Keras ``DeviceMesh`` (same devices and axes)."""
    mesh = strategy.mesh
    return keras_distribution.DeviceMesh(
        shape=tuple(mesh.devices.shape), axis_names=list(mesh.axis_names),
        devices=np.asarray(mesh.devices))


def rehome_layout_map(layout_map: Any, mesh: keras_distribution.DeviceMesh
                      ) -> keras_distribution.LayoutMap:
    """Copies a ``LayoutMap`` (or a ``{regex: axes}`` dict) onto ``mesh``, checking its axes.

    Raises:
        TypeError: ``layout_map`` is neither a ``LayoutMap`` nor a mapping.
        ValueError: a layout names an axis the mesh does not have.
    """
    result = keras_distribution.LayoutMap(mesh)
    if layout_map is None:
        return result
    if not isinstance(layout_map, Mapping):
        raise TypeError(
            f"layout_map must be a keras.distribution.LayoutMap or a dict of variable-path "
            f"regex -> axes; received {type(layout_map).__name__}."
        )
    for pattern in layout_map:
        layout = layout_map[pattern]
        axes = tuple(getattr(layout, "axes", layout))
        unknown = [a for a in axes if a is not None and a not in mesh.axis_names]
        if unknown:
            raise ValueError(
                f"layout_map[{pattern!r}] = {axes} names axis {unknown[0]!r}, but the strategy's "
                f"mesh has axes {tuple(mesh.axis_names)}; use those (or None to replicate)."
            )
        result[pattern] = axes
    return result


def distribution_for(strategy: Strategy) -> keras_distribution.ModelParallel:
    """The strategy's ``ModelParallel`` distribution (one per strategy, built on first use)."""
    dist = _distributions.get(strategy)
    if dist is None:
        layout_map = rehome_layout_map(strategy.layout_map, device_mesh(strategy))
        dist = seam.accepts_stratax_feeds(_CheckedModelParallel(
            layout_map=layout_map, batch_dim_name=REPLICA_AXIS, auto_shard_dataset=False))
        _distributions[strategy] = dist
    return dist


class _CheckedModelParallel(keras_distribution.ModelParallel):
    """Keras' ``ModelParallel`` that refuses a layout which does not divide a variable's
    dimension before JAX does, naming the ``layout_map`` rule and the variable (JAX's
    ``IndivisibleError`` names neither)."""

    def get_variable_layout(self, variable: Any) -> Any:
        layout = super().get_variable_layout(variable)
        mesh = self.device_mesh
        check_layout_divides(self._layout_map, variable.path, tuple(variable.shape),
                             tuple(layout.axes),
                             dict(zip(mesh.axis_names, mesh.shape, strict=True)))
        return layout


def check_layout_divides(layout_map: Mapping[str, Any], path: str, shape: tuple[int, ...],
                         axes: tuple[Any, ...], mesh_shape: Mapping[str, int]) -> None:
    """Raises when ``axes`` split a dimension of the variable ``path`` (of ``shape``) over a
    number of devices that does not divide it.

    Raises:
        ValueError: naming the rule of ``layout_map`` that matched ``path``, the variable, the
            dimension and the two ways out.
    """
    for dim, (size, axis) in enumerate(zip(shape, axes, strict=False)):
        names = () if axis is None else (axis,) if isinstance(axis, str) else tuple(axis)
        parts = math.prod(mesh_shape[name] for name in names)
        if size % parts:
            rule = _matching_rule(layout_map, path)
            raise ValueError(
                f"layout_map[{rule!r}] = {axes} splits dimension {dim} of variable {path!r} "
                f"(shape {shape}) into {parts} parts over mesh axis {axis!r}, but {size} is not "
                f"divisible by {parts}. Narrow the rule so that it does not match {path!r} "
                f"(e.g. name the layers to split and match their names), or split over a mesh "
                f"axis whose size divides {size}.")


def _matching_rule(layout_map: Mapping[str, Any], path: str) -> str:
    """The key of ``layout_map`` that gives ``path`` its layout, as ``LayoutMap`` picks it."""
    rules = list(layout_map)  # a LayoutMap's ``in`` matches regexes too
    if path in rules:
        return path
    # Keras matches whole paths (re.fullmatch); releases before 3.11 searched (re.search).
    return next((rule for match in (re.fullmatch, re.search) for rule in rules
                 if match(rule, path)), path)


def held_in_parts(variables: Iterable[Any]) -> list[Any]:
    """The ``variables`` (each once) that no process holds whole (split over devices of several
    processes)."""
    unique = {id(v): v for v in variables}
    return [v for v in unique.values() if sharded_state.is_sharded(seam.held_value(v))]


def model_state(model: Any) -> list[Any]:
    """The variables of ``model`` and of its optimizer."""
    optimizer = getattr(model, "optimizer", None)
    return [*model.variables, *(optimizer.variables if optimizer is not None else ())]


@contextlib.contextmanager
def whole_values(variables: Iterable[Any], what: str) -> Iterator[None]:
    """Inside, every variable of ``variables`` held in parts (:func:`held_in_parts`; e.g.
    :func:`model_state`) reads whole on every process: its value is gathered (an all-gather
    over the processes) and put back afterwards.

    A collective: every process enters it together, as every worker of a multi-worker program
    calls ``model.save``/``get_weights`` (the chief writes). The processes agree first whether
    the gathered copies fit in each one's memory.

    Raises:
        MemoryError: the gathered state would not fit in some process (``what`` names the
            call); the message gives the sizes and the fix.
    """
    parts = held_in_parts(variables)
    if not parts:
        yield
        return
    whole = sum(v._value.nbytes for v in parts)
    # A replicated array holds a copy on each of this process's devices, and the host reads one.
    needed = whole * (len(parts[0]._value.sharding.addressable_devices) + 1)
    room = _memory_left()
    fits = multihost_utils.process_allgather(np.asarray(room is None or needed <= room))
    if not np.all(fits):
        raise MemoryError(
            f"{what} would gather {whole / 2**20:.1f} MiB of state that the workers hold in "
            f"parts (variables split over several workers' devices by the strategy's "
            f"layout_map, e.g. {parts[0].path!r}) into every worker, needing "
            f"{needed / 2**20:.1f} MiB in each, more than some worker has left (this one: "
            f"{'unknown' if room is None else f'{room / 2**20:.1f} MiB'}). Save the state in "
            "parts instead, each worker writing its own: `sx.BackupAndRestore(dir)` in `fit` "
            "does (a backup in parts restores into any number of workers, so a run on hosts "
            "with room for the whole model can restore it and `model.save` there); or read "
            "this worker's parts with `variable.value.addressable_shards`."
        )
    originals = [v._value for v in parts]
    gathered = _gather(originals)
    for variable, value in zip(parts, gathered, strict=True):
        variable._value = value
    try:
        yield
    finally:
        for variable, value in zip(parts, originals, strict=True):
            variable._value = value


def _gather(values: list[jax.Array]) -> list[jax.Array]:
    """``values`` replicated on their meshes' devices (readable by every process)."""
    shardings = [NamedSharding(v.sharding.mesh, P()) for v in values]
    return jax.jit(lambda xs: xs, out_shardings=shardings)(values)


def _memory_left() -> int | None:
    """Bytes this process can still allocate: the smaller of the system's available memory
    and what its ``RLIMIT_DATA`` leaves; ``None`` where neither can be read."""
    limits = []
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        limits.append(int(fields["MemAvailable"].split()[0]) * 1024)
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            limits.append(soft - int(fields["VmData"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    return min(limits) if limits else None
