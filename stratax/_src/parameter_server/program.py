"""Turning a replica function into programs a generic worker runs: ``jax.export``, no user code.

Inside ``strategy.run(fn, args)`` (itself inside a function given to
``ClusterCoordinator.schedule``), ``fn`` reads parameter-server variables and hands back
gradients and new state through four calls, which this module records while tracing ``fn`` on the
coordinator with abstract shapes:

- ``strategy.read(variables)`` -> their current values (any pytree of variables);
- ``strategy.read_rows(table, ids)`` -> ``(rows, positions)`` with
  ``table[ids] == rows[positions]``: only the distinct looked-up rows are pulled (row-sparse
  path for embeddings);
- ``strategy.apply_gradients(grads_and_vars, optimizer)`` -> the parameter servers apply
  ``optimizer`` (a Keras optimizer or its config) to those gradients; a gradient for a table
  read with ``read_rows`` is the gradient of ``rows`` and is pushed row-sparse;
- ``strategy.assign(variables, values)`` -> new values of untrained state (BatchNorm
  statistics, seeds), extra outputs of the step that the worker writes after its push.

``read`` and ``assign`` also take per-worker variables (``per_worker_variables``): their values
are inputs of the step that the worker takes from its own copies, and their new values extra
outputs it keeps there; no parameter server is involved.

Three traces per distinct (function, argument shapes): one discovers what ``fn`` reads and
pushes, one exports the step ``(dense values, rows, positions, batch, per-worker values) ->
(gradients and new values, outputs)``, and, when ``read_rows`` is used, one exports the id
program ``batch -> ids`` the worker runs first to know which rows to pull. Rows are padded to
``ids.size`` so one program serves every batch of a shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from stratax._src.parameter_server.per_worker_variables import PerWorkerVariable, refuse_training
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES, SPARSE_MODES
from stratax._src.parameter_server.variables import PSVariable


class _Trace(threading.local):
    def __init__(self) -> None:
        self.recorder: _Recorder | None = None


_trace = _Trace()


@dataclasses.dataclass
class _Recorder:
    mode: str  # "discover", "step" or "ids"
    dense: list[PSVariable] = dataclasses.field(default_factory=list)
    sparse: list[tuple[PSVariable, jax.ShapeDtypeStruct]] = dataclasses.field(default_factory=list)
    pushes: list[tuple[PSVariable, dict[str, Any]]] = dataclasses.field(default_factory=list)
    grads: list[Any] = dataclasses.field(default_factory=list)
    dense_inputs: Sequence[Any] = ()
    row_inputs: Sequence[Any] = ()
    position_inputs: Sequence[Any] = ()
    ids_out: list[Any] = dataclasses.field(default_factory=list)
    sparse_calls: int = 0
    assigns: list[PSVariable] = dataclasses.field(default_factory=list)
    assign_values: list[Any] = dataclasses.field(default_factory=list)
    local: list[PerWorkerVariable] = dataclasses.field(default_factory=list)  # read
    local_inputs: Sequence[Any] = ()
    local_assigns: list[PerWorkerVariable] = dataclasses.field(default_factory=list)
    local_assign_values: list[Any] = dataclasses.field(default_factory=list)


def _recorder(what: str) -> _Recorder:
    recorder = _trace.recorder
    if recorder is None:
        raise RuntimeError(
            f"`strategy.{what}` is only valid inside `strategy.run(fn, ...)` called from a "
            "function given to `ClusterCoordinator.schedule`."
        )
    return recorder


def read(variables: Any) -> Any:
    """Values of a pytree of ``PSVariable`` and ``PerWorkerVariable`` for this step (see the
    module docstring)."""
    recorder = _recorder("read")
    leaves, treedef = jax.tree_util.tree_flatten(variables)
    values = []
    for var in leaves:
        if isinstance(var, PerWorkerVariable):
            values.append(_read_local(recorder, var))
            continue
        if not isinstance(var, PSVariable):
            raise TypeError(f"strategy.read expects variables created under the strategy, got "
                            f"{type(var).__name__}.")
        if any(var is v for v, _ in recorder.sparse):
            raise ValueError(f"{var.name!r} is read with read_rows; read it one way per step.")
        if recorder.mode == "step":
            values.append(recorder.dense_inputs[_index(recorder.dense, var)])
            continue
        if not any(var is v for v in recorder.dense):
            recorder.dense.append(var)
        values.append(jnp.zeros(var.shape, var.dtype))
    return jax.tree_util.tree_unflatten(treedef, values)


def _read_local(recorder: _Recorder, var: PerWorkerVariable) -> Any:
    """The running worker's copy of ``var`` (a step input the worker fills in)."""
    if recorder.mode == "step":
        return recorder.local_inputs[_index(recorder.local, var)]
    if not any(var is v for v in recorder.local):
        recorder.local.append(var)
    return jnp.zeros(var.shape, var.dtype)


def read_rows(table: PSVariable, ids: Any) -> tuple[Any, Any]:
    """``(rows, positions)`` for the rows of ``table`` named by integer ``ids``."""
    recorder = _recorder("read_rows")
    if isinstance(table, PerWorkerVariable):
        raise refuse_training(table, "strategy.read_rows")
    if not isinstance(table, PSVariable) or len(table.shape) < 1:
        raise TypeError(f"read_rows needs a variable of rank >= 1, got {table!r}.")
    if any(table is v for v in recorder.dense) or any(table is v for v, _ in recorder.sparse
                                                       if recorder.mode == "discover"):
        raise ValueError(f"{table.name!r} is read more than once in one step; read it once.")
    ids = jnp.asarray(ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"read_rows ids must be integers, got {ids.dtype}.")
    k = recorder.sparse_calls
    recorder.sparse_calls += 1
    bucket = max(int(np.prod(ids.shape)), 1)
    if recorder.mode == "discover":
        recorder.sparse.append((table, jax.ShapeDtypeStruct(ids.shape, ids.dtype)))
    if recorder.mode == "step":
        return recorder.row_inputs[k], recorder.position_inputs[k]
    if recorder.mode == "ids":
        recorder.ids_out.append(ids)
    return jnp.zeros((bucket, *table.shape[1:]), table.dtype), jnp.zeros(ids.shape, jnp.int32)


def apply_gradients(grads_and_vars: Any, optimizer: Any,
                    sparse_updates: str = DEFAULT_SPARSE_UPDATES) -> None:
    """Records gradients to push; the parameter servers apply ``optimizer`` to them.

    ``sparse_updates`` ("dense", Keras' rule, or the opt-in "lazy") chooses how Adam/momentum
    treat row-sparse gradients (see ``optimizers``); SGD is exact either way.
    """
    recorder = _recorder("apply_gradients")
    if sparse_updates not in SPARSE_MODES:
        raise ValueError(f"sparse_updates must be one of {SPARSE_MODES}, got {sparse_updates!r}.")
    spec = {**optimizer_spec(optimizer), "sparse_updates": sparse_updates}
    for grad, var in list(grads_and_vars):
        if isinstance(var, PerWorkerVariable):
            raise refuse_training(var, "strategy.apply_gradients")
        if not isinstance(var, PSVariable):
            raise TypeError(f"apply_gradients expects (gradient, variable) pairs with variables "
                            f"created under the strategy, got {type(var).__name__}.")
        if any(var is v for v, _ in recorder.pushes):
            raise ValueError(f"Two gradients for {var.name!r} in one step; sum them first.")
        recorder.pushes.append((var, spec))
        recorder.grads.append(grad)


def assign(variables: Any, values: Any) -> None:
    """Records new values for variables (e.g. BatchNorm statistics, a dropout seed); the
    worker writes them to the parameter servers after the step's push, before its next pull,
    and those of per-worker variables to its own copies right after the step's compute."""
    recorder = _recorder("assign")
    targets, new = jax.tree_util.tree_leaves(variables), jax.tree_util.tree_leaves(values)
    if len(targets) != len(new):
        raise ValueError(f"strategy.assign got {len(targets)} variables and {len(new)} values.")
    for var, value in zip(targets, new, strict=True):
        if not isinstance(var, (PSVariable, PerWorkerVariable)):
            raise TypeError(f"strategy.assign expects variables created under the strategy, got "
                            f"{type(var).__name__}.")
        if tuple(np.shape(value)) != tuple(var.shape):
            raise ValueError(f"strategy.assign: {var.name!r} has shape {var.shape}, the value "
                             f"{tuple(np.shape(value))}.")
        local = isinstance(var, PerWorkerVariable)
        assigned = recorder.local_assigns if local else recorder.assigns
        if any(var is v for v in assigned):
            raise ValueError(f"{var.name!r} is assigned twice in one step; assign it once.")
        assigned.append(var)
        (recorder.local_assign_values if local else recorder.assign_values).append(
            jnp.asarray(value, var.dtype))


def optimizer_spec(optimizer: Any) -> dict[str, Any]:
    """``{"class_name", "config"}`` of a Keras optimizer (duck-typed) or such a dict."""
    if isinstance(optimizer, dict):
        spec = optimizer
    elif hasattr(optimizer, "get_config"):
        spec = {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}
    else:
        raise TypeError(f"optimizer must be a Keras optimizer or its config dict, got "
                        f"{optimizer!r}.")
    return json.loads(json.dumps(spec, default=_json_number))


def _json_number(value: Any) -> Any:
    if isinstance(value, (np.generic, jax.Array)) and np.ndim(value) == 0:
        return np.asarray(value).item()
    raise TypeError(f"Optimizer setting {value!r} is not a number or string; the parameter "
                    "server needs plain values.")


def _index(items: Sequence[Any], item: Any) -> int:
    for i, candidate in enumerate(items):
        if candidate is item:
            return i
    raise ValueError(f"{getattr(item, 'name', item)!r} was not read while tracing; the replica "
                     "function must read the same variables on every trace.")


@dataclasses.dataclass
class Program:
    """An exported step and what the worker needs to run it (all data, no code)."""

    key: str
    step: bytes
    ids: bytes | None
    meta: dict[str, Any]
    out_treedef: Any
    variables: list[PSVariable]
    optimizers: dict[str, tuple[dict[str, Any], list[PSVariable]]]
    per_worker: list[PerWorkerVariable]  # read or assigned: created on a worker before use


class ProgramCache:
    """The programs of one strategy, each built once per replica function and argument shapes.

    Args:
      context: Gives the context a replica function runs in while traced (the worker's
        replica context).
      on_new: Called with each program when it is first built.
    """

    def __init__(self, context: Callable[[], contextlib.AbstractContextManager[Any]],
                 on_new: Callable[[Program], None]) -> None:
        self._context = context
        self._on_new = on_new
        self._built: dict[Any, Program] = {}

    def get(self, fn: Callable[..., Any], call_args: tuple[tuple[Any, ...], dict[str, Any]],
            specs: Sequence[jax.ShapeDtypeStruct], namespace: str) -> Program:
        """The program of ``fn(*args, **kwargs)`` for ``call_args = (args, kwargs)`` whose
        leaves have ``specs``; named ``<namespace>p<n>`` when built."""
        treedef = jax.tree_util.tree_structure(call_args)
        key = (_function_key(fn), treedef, tuple((s.shape, s.dtype.name) for s in specs))
        built = self._built.get(key)
        if built is None:
            def positional(packed: Any) -> Any:
                a, kw = packed
                with self._context():
                    return fn(*a, **kw)

            built = build_program(f"{namespace}p{len(self._built)}", positional, specs,
                                  jax.tree_util.tree_structure((call_args,)))
            self._on_new(built)
            self._built[key] = built
        return built


def _function_key(fn: Callable[..., Any]) -> Any:
    """Identity of a replica function for the program cache: its code and what it closes over
    (a nested function re-created per call maps to the same programs)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return id(fn)
    cells = tuple(id(c.cell_contents) for c in (fn.__closure__ or ()))
    defaults = tuple(id(d) for d in (fn.__defaults__ or ()))
    return (code, cells, defaults, inspect.ismethod(fn) and id(fn.__self__))


def build_program(key: str, fn: Callable[..., Any], arg_specs: Sequence[jax.ShapeDtypeStruct],
                  args_treedef: Any) -> Program:
    """Traces ``fn`` (three times at most) and exports its programs."""

    def call(leaves: Sequence[Any]) -> Any:
        return fn(*jax.tree_util.tree_unflatten(args_treedef, list(leaves)))

    discover = _Recorder("discover")
    out_shape = _with(discover, lambda: jax.eval_shape(lambda *a: call(a), *arg_specs))
    out_treedef = jax.tree_util.tree_structure(out_shape)
    sparse_vars = [v for v, _ in discover.sparse]
    dense_specs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in discover.dense]
    row_specs = [jax.ShapeDtypeStruct((max(int(np.prod(s.shape)), 1), *v.shape[1:]), v.dtype)
                 for v, s in discover.sparse]
    pos_specs = [jax.ShapeDtypeStruct(s.shape, jnp.int32) for _, s in discover.sparse]

    local_specs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in discover.local]

    def step(dense_values, rows, positions, leaves, local_values):
        recorder = _Recorder("step", dense=discover.dense, sparse=discover.sparse,
                             dense_inputs=dense_values, row_inputs=rows,
                             position_inputs=positions, local=discover.local,
                             local_inputs=local_values)
        outputs = _with(recorder, lambda: call(leaves))
        if [id(v) for v, _ in recorder.pushes] != [id(v) for v, _ in discover.pushes]:
            raise ValueError("The replica function pushed different variables on two traces; "
                             "it must not branch on Python state.")
        if ([id(v) for v in [*recorder.assigns, *recorder.local_assigns]]
                != [id(v) for v in [*discover.assigns, *discover.local_assigns]]):
            raise ValueError("The replica function assigned different variables on two traces; "
                             "it must not branch on Python state.")
        # New values of assigned variables follow the gradients, those of the parameter
        # servers' first (meta "assigns" and "local_assigns" name them).
        return ([*recorder.grads, *recorder.assign_values, *recorder.local_assign_values],
                jax.tree_util.tree_leaves(outputs))

    step_exp = jax_export.export(jax.jit(step))(dense_specs, row_specs, pos_specs,
                                                list(arg_specs), local_specs)
    ids_bytes = None
    if sparse_vars:
        def ids_fn(leaves):
            recorder = _Recorder("ids")
            _with(recorder, lambda: call(leaves))
            return recorder.ids_out

        ids_bytes = bytes(jax_export.export(jax.jit(ids_fn))(list(arg_specs)).serialize())

    pushes = []
    for (var, _spec), grad_shape in zip(discover.pushes,
                                        step_exp.out_avals[:len(discover.pushes)], strict=False):
        sparse = any(var is v for v in sparse_vars)
        expected = row_specs[_index(sparse_vars, var)].shape if sparse else var.shape
        if tuple(grad_shape.shape) != tuple(expected):
            raise ValueError(f"Gradient for {var.name!r} has shape {tuple(grad_shape.shape)}, "
                             f"expected {tuple(expected)}.")
        pushes.append({"var": var.name, "sparse": _index(sparse_vars, var) if sparse else -1})
    variables = list({id(v): v for v in [*discover.dense, *sparse_vars,
                                         *(v for v, _ in discover.pushes),
                                         *discover.assigns]}.values())
    optimizers: dict[str, tuple[dict[str, Any], list[PSVariable]]] = {}
    for var, spec in discover.pushes:
        text = json.dumps(spec, sort_keys=True)
        optimizers.setdefault(text, (spec, []))[1].append(var)
    meta = {
        "key": key,
        "variables": [v.describe() for v in variables],
        "dense": [v.name for v in discover.dense],
        "sparse": [v.name for v in sparse_vars],
        "pushes": pushes,
        "assigns": [v.name for v in discover.assigns],
        "locals": [v.key for v in discover.local],
        "local_assigns": [v.key for v in discover.local_assigns],
        "num_outputs": out_treedef.num_leaves,
    }
    per_worker = list({id(v): v for v in [*discover.local, *discover.local_assigns]}.values())
    return Program(key, bytes(step_exp.serialize()), ids_bytes, meta, out_treedef, variables,
                   optimizers, per_worker)


def _with(recorder: _Recorder, body: Callable[[], Any]) -> Any:
    previous = _trace.recorder
    _trace.recorder = recorder
    try:
        return body()
    finally:
        _trace.recorder = previous
