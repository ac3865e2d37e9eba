"""``ParameterServerStrategy``: variables on parameter servers, steps on workers.

Not a mesh strategy: the coordinator (chief) holds variable handles, the ``ps`` tasks hold the
values and apply the optimizer, the ``worker`` tasks run exported steps (see ``coordinator``
and ``program``). The same program may be started on every task: on a ``ps`` or ``worker``
task, constructing the strategy serves that task and exits the process when the chief is done.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.core.context import replica_context_scope
from stratax._src.core.errors import StrataxError
from stratax._src.data.input_context import InputContext
from stratax._src.parameter_server import (
    checkpoint,
    closures,
    functions,
    program,
    sharded_checkpoint,
    shared_session,
)
from stratax._src.parameter_server import coordinator as coord
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.partitioners import (
    build_shard,
    partition_aware,
    partition_count,
    shard_offsets,
    shard_sizes,
)
from stratax._src.parameter_server.per_worker_variables import PerWorkerVariable
from stratax._src.parameter_server.residency import Residency, hybrid_settings, require_tables
from stratax._src.parameter_server.shard_init import ShardRecipe, remote_recipe
from stratax._src.parameter_server.tasks import cluster_check, compute_threads
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES
from stratax._src.parameter_server.tasks.server import SERVED_JOBS, Server, prepare_process, serve
from stratax._src.parameter_server.transport.ps_client import PSClients
from stratax._src.parameter_server.transport.rpc import RpcClient
from stratax._src.parameter_server.variables import (
    Placement,
    PSVariable,
    ShardedVariable,
    aggregation_name,
    describe_table,
    initial_array,
)
from stratax._src.parameter_server.worker_context import WorkerReplicaContext
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.replica_context import ReplicaContext

logger = logging.getLogger(__name__)
MODES = ("async", "sync")


class ParameterServerStrategy(Strategy):
    """TensorFlow's ``ParameterServerStrategy`` on JAX: a chief, workers and parameter servers.

    An ``sx.Strategy`` like the others: its mesh is the chief's first device, where ``run`` and
    ``reduce`` called outside ``ClusterCoordinator.schedule`` execute (one replica, with a
    warning, as in TensorFlow); inside a scheduled function they record a step for a worker.

    Args:
      cluster_resolver: Gives the cluster (``chief``, ``worker``, ``ps`` jobs) and this task;
        default ``TFConfigClusterResolver()``.
      variable_partitioner: Splits large variables along axis 0, e.g.
        ``sx.partitioners.MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=2)``.
      mode: ``"async"`` (each worker's step updates the parameters when it arrives) or
        ``"sync"`` (every scheduled step runs on every worker, each on its own batch, and the
        parameter servers apply the sum of their gradients as one update: scale the loss by
        the global batch, e.g. ``sx.compute_average_loss(..., global_batch_size=...)``).
      timeout_seconds: The one bound on waiting for a task: start-up, each call, a worker that
        stops answering the heartbeat while running an asynchronous closure (the closure moves
        to another worker), the workers' calls and retries to the parameter servers, a dead
        worker's restart (synchronous mode) and the return of any worker when all are lost.
      step_timeout_seconds: Deadline of one scheduled call on a worker that keeps answering
        (a long step); default 600.
      dense_variables: Where the variables that no step reads row-sparse live: ``"ps"``
        (default, as in TensorFlow: every variable on the parameter servers) or ``"workers"``
        (hybrid mode, for recommenders: the embedding tables stay on the parameter servers,
        every other variable is replicated on the workers and updated from the sum of the
        workers' gradients, as MultiWorkerMirrored does; every step runs on every worker).
        ``mode`` then says how the tables are updated. Default: ``sx.config`` option
        ``ps_dense_variables`` (``STRATAX_PS_DENSE_VARIABLES``).
      max_staleness: Hybrid mode with ``mode="async"``: a worker's row updates may be this many
        steps behind its reads (0: every step reads every earlier step's rows; within one
        closure of ``steps_per_execution`` steps). Default: option ``ps_max_staleness``.

    Example:
      >>> strategy = sx.ParameterServerStrategy(sx.cluster_resolver.TFConfigClusterResolver())
      ... # doctest: +SKIP
      >>> with strategy.scope():                                                  # doctest: +SKIP
      ...     w = strategy.create_variable(np.zeros((784, 10), "float32"), name="w")
    """

    def __init__(self, cluster_resolver: ClusterResolver | None = None,
                 variable_partitioner: Callable[..., Sequence[int]] | None = None,
                 mode: str = "async", timeout_seconds: float = 60.0,
                 step_timeout_seconds: float = 600.0, dense_variables: str | None = None,
                 max_staleness: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not a ParameterServerStrategy mode; use one of "
                             f"{MODES}.")
        self.hybrid = hybrid_settings(mode, dense_variables, max_staleness)
        if cluster_resolver is None:
            from stratax._src.cluster.tfconfig import TFConfigClusterResolver

            cluster_resolver = TFConfigClusterResolver()
        if functions.loading_definitions():
            raise functions.DefinitionsLoaded()
        self.cluster_resolver = cluster_resolver
        spec = cluster_resolver.cluster_spec()
        if not {"ps", "worker"} <= set(spec.jobs):
            raise ValueError(
                f"ParameterServerStrategy needs 'worker' and 'ps' jobs in the cluster, got "
                f"{spec.as_dict()}; describe them in TF_CONFIG or launch with "
                "`stratax launch --workers 2 --ps 1 train.py`."
            )
        cluster_check.require_jobs(spec)
        if cluster_resolver.task_type not in (None, "chief", *SERVED_JOBS):
            raise ValueError(
                f"ParameterServerStrategy runs on 'chief', 'worker' and 'ps' tasks; this task is "
                f"{cluster_resolver.task_type!r} (TensorFlow's side-car evaluator is not "
                "supported: evaluate on the chief instead)."
            )
        self.mode = mode
        self._partitioner = variable_partitioner
        self._timeout = timeout_seconds
        self._step_timeout = step_timeout_seconds
        if cluster_resolver.task_type in SERVED_JOBS:
            self._serve_and_exit(spec, cluster_resolver.task_type, cluster_resolver.task_id)
        self._ps_addresses = list(spec.job_tasks("ps"))
        self._ps = PSClients(self._ps_addresses, timeout_seconds)
        self._worker_clients = [RpcClient(f"worker {i}", a, timeout_seconds)
                                for i, a in enumerate(spec.job_tasks("worker"))]
        self._coordinator: coord.ClusterCoordinator | None = None  # read by the heartbeat
        try:
            for client in [*self._ps.clients, *self._worker_clients]:
                client.wait_ready(timeout_seconds)
            cluster_check.agree([*self._ps.clients, *self._worker_clients], ClusterSpec(spec),
                                timeout_seconds)
            # This process's session on the cluster: the first strategy claims every task (reset
            # after a previous chief) and heartbeats; a later one shares it in its namespace.
            self._membership = shared_session.sessions.join(
                self._ps_addresses, spec.job_tasks("worker"), timeout_seconds,
                [*self._ps.clients, *self._worker_clients], self._restarted)
        except BaseException:
            for client in self._worker_clients:
                client.close()
            self._ps.close()
            raise
        self._variables: list[PSVariable] = []
        self._names: set[str] = set()
        self._built_on_servers: set[str] = set()  # names of variables no process holds whole
        self._load = [0] * len(self._ps_addresses)
        self._programs: dict[Any, program.Program] = {}
        # id(Keras variable) -> (that variable, its PSVariable); the variable is kept alive.
        self._keras: dict[int, tuple[Any, PSVariable]] = {}
        # Keras variables marked per-worker, by id: the variable and its PerWorkerVariable
        # (made when a step first uses it, as Keras variables are placed).
        self._keras_per_worker: dict[int, tuple[Any, PerWorkerVariable | None]] = {}
        self._optimizers_set: set[tuple[str, str]] = set()
        self._residency = Residency(self) if self.hybrid is not None else None
        self._warned: set[str] = set()
        self._colocate: list[PSVariable] = []
        self._closed = False
        atexit.register(self.shutdown)
        # The chief's device, where run/reduce outside schedule execute; after the claim, so
        # starting JAX's backend never delays it past the tasks' chief timeout.
        super().__init__(jax.local_devices()[:1])

    @property
    def _session(self) -> Any:
        """The chief session this strategy shares with the others of this process on its
        cluster (``shared_session``)."""
        return self._membership.session

    @property
    def _namespace(self) -> str:
        """Prefix of this strategy's names on the tasks: ``""`` for the first strategy of this
        process on its cluster, ``"s<n>/"`` for later ones (``shared_session``)."""
        return self._membership.namespace

    def _restarted(self, client: RpcClient) -> None:
        """The heartbeat saw the task of ``client`` (the session's) answer as a new process:
        the coordinator rebuilds a restarted worker's state before its next closure. A ps
        restarted in ``mode="sync"`` (its snapshot, if any, lacks the steps after it and the
        partial sums in flight) fails the steps, so the run resumes from its last backup or
        checkpoint instead of going on with updates lost."""
        if self._coordinator is None:
            return
        for own in self._worker_clients:
            if own.name == client.name:
                self._coordinator.worker_restarted(own)
        if self.mode == "sync" and client.name.startswith("ps "):
            self._coordinator.fail_all(StrataxError(
                f"{client.name} at {client.address} was restarted: in mode='sync' its state "
                "after its last snapshot is lost, so training cannot go on exactly. Restart "
                "the program; sx.BackupAndRestore (or restore_checkpoint) resumes it from the "
                "last backup, as `stratax launch --max-restarts` does."))

    def _serve_and_exit(self, spec: Any, task_type: str, task_id: int | None) -> None:
        if task_type == "worker" and task_id is not None:  # a process that only serves
            compute_threads.limit_worker_threads(ClusterSpec(spec), task_id)
        prepare_process()
        if serve(Server(spec, job_name=task_type, task_index=task_id,
                        timeout_seconds=self._timeout)):
            sys.exit(1)  # no chief heard for the chief timeout
        logger.info("%s %s: the coordinator is done; exiting", task_type, task_id)
        sys.exit(0)

    # ----- TF API ---------------------------------------------------------------------------
    @property
    def synchronous(self) -> bool:
        """Whether every step runs on every worker, each on its own part of the batch:
        ``mode="sync"`` or hybrid mode (``dense_variables="workers"``)."""
        return self.mode == "sync" or self.hybrid is not None

    @property
    def num_replicas_in_sync(self) -> int:
        """1 in asynchronous mode (each worker's step stands alone); the number of workers in
        synchronous and hybrid mode (one update sums one gradient from each)."""
        return len(self._worker_clients) if self.synchronous else 1

    @property
    def is_chief(self) -> bool:
        """True: only the chief (the coordinator) runs the program past the constructor, and it
        writes checkpoints; worker and ps tasks serve inside the constructor."""
        return True

    @property
    def is_multi_process(self) -> bool:
        """False: the chief is one JAX process (workers and servers are other programs, not
        replicas of a JAX job), so a SIGTERM reaches it as a plain signal."""
        return False

    @property
    def variables(self) -> list[PSVariable]:
        """Every variable created on the parameter servers, in creation order."""
        return list(self._variables)

    @property
    def extended(self) -> ParameterServerStrategy:
        """The strategy itself: TensorFlow's ``strategy.extended`` methods
        (``colocate_vars_with``) live on the one strategy class here."""
        return self

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None, options: Any = None) -> Any:
        """Inside a scheduled function: records ``fn(*args, **kwargs)`` as a step on a worker.

        ``fn`` is traced once per argument shapes and exported (see ``program``); it reads
        variables with ``strategy.read``/``read_rows`` and pushes gradients with
        ``strategy.apply_gradients``. Returns placeholders that become numpy values in the
        ``RemoteValue`` of ``schedule``.

        Outside ``schedule`` (TensorFlow warns and runs it on the coordinator): logs a warning
        once and calls ``fn`` here on the chief, eagerly, as one replica (id 0, collectives
        the identity); variables it reads are pulled from the parameter servers then.
        """
        del options  # Accepted for TensorFlow compatibility (``RunOptions``).
        if not closures.is_recording():
            self._warn_outside_schedule("run")
            with replica_context_scope(ReplicaContext(self, traced=False)):
                return fn(*args, **(kwargs or {}))
        closure = closures.recording()
        call_args = (tuple(args), dict(kwargs or {}))
        leaves, treedef = jax.tree_util.tree_flatten(call_args)
        for leaf in leaves:
            if not isinstance(leaf, closures.LeafRef):
                raise TypeError(
                    f"strategy.run arguments must come from next(per_worker_iterator), got "
                    f"{type(leaf).__name__}; close over constants in the function instead."
                )
        specs = [leaf.spec for leaf in leaves]
        key = (_function_key(fn), treedef, tuple((s.shape, s.dtype.name) for s in specs))
        built = self._programs.get(key)
        if built is None:
            def positional(packed: Any) -> Any:
                a, kw = packed
                with replica_context_scope(WorkerReplicaContext(self)):
                    return fn(*a, **kw)

            built = program.build_program(f"{self._namespace}p{len(self._programs)}",
                                          positional, specs,
                                          jax.tree_util.tree_structure((call_args,)))
            if self._residency is not None:
                require_tables(built)
                self._residency.track(built)
            self._set_optimizers(built)
            self._programs[key] = built
        return closure.add_run(built, leaves)

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Inside a scheduled function: combines ``run`` results over the workers of a
        synchronous step (one worker's value in asynchronous mode) and along ``axis``; the
        ``RemoteValue`` then holds the reduced numpy value.

        Outside ``schedule``: logs a warning once (as TensorFlow) and reduces ``value``, a
        result of ``run`` on the chief (one replica), as ``sx.Strategy.reduce`` does.
        """
        if not closures.is_recording():
            self._warn_outside_schedule("reduce")
            return super().reduce(reduce_op, value, axis)
        return closures.reduce_outputs(reduce_op, value, axis)

    def _warn_outside_schedule(self, method: str) -> None:
        if method not in self._warned:
            self._warned.add(method)
            logger.warning(
                "ParameterServerStrategy.%s was called outside ClusterCoordinator.schedule: it "
                "runs here on the chief (one replica), not on a worker. To run on the workers, "
                "call it inside a function given to `coordinator.schedule(fn, args=...)`.",
                method)

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Places the variables created inside on the parameter server of
        ``colocate_with_variable`` (a ``PSVariable``, the first shard of a
        ``ShardedVariable``, or a placed Keras variable), unpartitioned, as TensorFlow's
        ``strategy.extended.colocate_vars_with`` (optimizer slots next to their variable).

        Raises:
          TypeError: ``colocate_with_variable`` is not a variable of this strategy.
        """
        target = self._on_ps(colocate_with_variable)
        if not isinstance(target, PSVariable) or not any(target is v for v in self._variables):
            raise TypeError(
                f"colocate_vars_with needs a variable of this strategy (created by "
                f"strategy.create_variable or a Keras variable under strategy.scope()), got "
                f"{type(colocate_with_variable).__name__}: {colocate_with_variable!r}.")
        self._colocate.append(target)
        try:
            yield
        finally:
            self._colocate.pop()

    def read(self, variables: Any) -> Any:
        """Inside ``run``: this step's values of a pytree of variables (``PSVariable`` or Keras
        variables, placed on the parameter servers the first time a step uses them; a
        ``PerWorkerVariable`` gives the running worker's copy).

        Outside ``schedule`` (``run`` on the chief, as TensorFlow's
        ``testRunNotUsedWithClusterCoordinator`` reads variables there, or between steps): their
        values now, as numpy arrays pulled from the parameter servers (a Keras variable no step
        used yet: its own value), so one replica function serves both.

        Raises:
          TypeError: a leaf is not a variable of the strategy.
          RuntimeError: outside ``schedule``, a ``PerWorkerVariable``: it has a value per
            worker (``read_all()`` gives them).
        """
        if not closures.is_recording():
            return jax.tree_util.tree_map(self._value_now, variables)
        return program.read(self._on_ps(variables))

    def read_rows(self, table: Any, ids: Any) -> tuple[Any, Any]:
        """Inside ``run``: ``(rows, positions)`` with ``table[ids] == rows[positions]``; only
        the distinct rows are pulled, and the gradient of ``rows`` is pushed row-sparse.
        Outside ``schedule``: the same pair from the table's value now (its distinct rows,
        unpadded), as ``read`` there."""
        if not closures.is_recording():
            unique, positions = np.unique(np.asarray(ids), return_inverse=True)
            placed = self._keras.get(id(table), (None, table))[1]
            rows = (placed.sparse_read(unique) if isinstance(placed, PSVariable)
                    else self._value_now(table)[unique])
            return rows, positions.reshape(np.shape(ids))
        return program.read_rows(self._on_ps(table), ids)

    def _value_now(self, leaf: Any) -> np.ndarray:
        """A variable's value on the chief, outside scheduled steps (see ``read``)."""
        if id(leaf) in self._keras_per_worker:
            leaf = self._on_ps(leaf)
        leaf = self._keras.get(id(leaf), (None, leaf))[1]
        if isinstance(leaf, PSVariable):
            return leaf.numpy()
        if isinstance(leaf, PerWorkerVariable):
            raise RuntimeError(
                f"strategy.read({leaf.name}) outside ClusterCoordinator.schedule: a per-worker "
                f"variable has one value per worker; {leaf.name}.read_all() gives them, or read "
                "it inside strategy.run in a scheduled function.")
        if hasattr(leaf, "path") and hasattr(leaf, "assign"):  # a Keras variable no step used
            return np.asarray(leaf.numpy())
        raise TypeError(f"strategy.read expects variables created under the strategy, got "
                        f"{type(leaf).__name__}.")

    def apply_gradients(self, grads_and_vars: Any, optimizer: Any,
                        sparse_updates: str = DEFAULT_SPARSE_UPDATES) -> None:
        """Inside ``run``: the parameter servers apply ``optimizer`` (a Keras SGD/Adam or its
        config) to these gradients. ``sparse_updates``: "dense" (Keras' rule, the default) or
        "lazy" (only the touched rows' slots change: faster, another rule) for row-sparse
        gradients."""
        pairs = [(g, self._on_ps(v)) for g, v in grads_and_vars]
        program.apply_gradients(pairs, optimizer, sparse_updates)

    def assign(self, variables: Any, values: Any) -> None:
        """Inside ``run``: new values for a pytree of variables (state that is not trained by
        gradients: BatchNorm statistics, a dropout seed); the worker writes them to the
        parameter servers after the step's gradients, so its next step reads them (a
        ``PerWorkerVariable``: to its own copy, right after the step's compute)."""
        program.assign(self._on_ps(variables), values)

    def refresh_keras_variables(self) -> None:
        """Copies the parameter servers' values into the Keras variables they came from, so
        ``model.get_weights()``, ``model.save()`` and local evaluation see the trained values
        (not those built by their servers, which no process holds whole)."""
        for keras_var, ps_var in self._keras.values():
            if remote_recipe(keras_var) is None:
                keras_var.assign(ps_var.numpy())

    def pull_optimizer_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Copies the servers' optimizer slots of the placed Keras ``variables`` into the Keras
        ``optimizer``'s (see ``checkpoint.pull_keras_optimizer``): saves hold the trained state."""
        pairs = self._placed_pairs(variables)
        if pairs and optimizer is not None and optimizer.built:
            checkpoint.pull_keras_optimizer(self, optimizer, pairs)

    def push_optimizer_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Gives the servers the Keras ``optimizer``'s state (slots, iterations) and the values
        of the placed Keras ``variables``: a loaded model trains on from its saved state."""
        pairs = self._placed_pairs(variables)
        if pairs and optimizer is not None and optimizer.built:
            checkpoint.push_keras_optimizer(self, optimizer, pairs)

    def is_placed(self, variable: Any) -> bool:
        """Whether the Keras ``variable`` has its parameter-server variable already."""
        return id(variable) in self._keras

    def _placed_pairs(self, variables: Sequence[Any]) -> list[tuple[Any, PSVariable]]:
        """The placed ones of ``variables`` with their ``PSVariable``, less those built by
        their servers (their state never comes to the chief)."""
        return [self._keras[id(v)] for v in variables
                if id(v) in self._keras and remote_recipe(v) is None]

    def place_variables(self, variables: Any) -> Any:
        """Places the Keras variables of a pytree on the parameter servers now (they are
        otherwise placed when a step first uses them) and returns their ``PSVariable`` objects."""
        return self._on_ps(variables)

    def cluster_coordinator(self) -> coord.ClusterCoordinator:
        """This strategy's ``ClusterCoordinator`` (created on first use; the program's own, if it
        made one): ``model.fit`` schedules its steps through it."""
        return coord.ClusterCoordinator(self)  # one per strategy, as in TensorFlow

    def distribute_datasets_from_function(
            self, dataset_fn: Callable[[InputContext], Any],
            options: Any = None) -> dataset_source.DistributedDatasetsFromFunction:
        """A dataset built on each worker as ``dataset_fn(input_context)``, once given to
        ``coordinator.create_per_worker_dataset`` (as in TensorFlow, it is not built on the
        chief). Inside a per-worker dataset function, on a worker, the same call returns the
        worker's dataset (see ``worker_input``)."""
        return dataset_source.DistributedDatasetsFromFunction(dataset_fn, options)

    def experimental_distribute_dataset(
            self, dataset: Any, options: Any = None) -> dataset_source.DistributedDataset:
        """``dataset`` (a ``tf.data.Dataset``) for every worker, once given to
        ``coordinator.create_per_worker_dataset``: each worker iterates a copy of it, not a
        shard, as in TensorFlow's parameter-server strategy."""
        return dataset_source.DistributedDataset(dataset, options)

    def _on_ps(self, variables: Any) -> Any:
        """Maps Keras variables in a pytree to their parameter-server variables (creating them
        from the Keras values on first use); ``PSVariable`` leaves pass through."""
        def convert(leaf: Any) -> Any:
            if isinstance(leaf, PSVariable) or not (hasattr(leaf, "path")
                                                    and hasattr(leaf, "assign")):
                return leaf
            local = self._keras_per_worker.get(id(leaf))
            if local is not None:
                if local[1] is None:
                    local = self._keras_per_worker[id(leaf)] = (leaf, self.create_variable(
                        np.asarray(leaf.numpy()), name=leaf.path, per_worker=True))
                return local[1]
            entry = self._keras.get(id(leaf))
            if entry is None:
                recipe = remote_recipe(leaf)  # built by its servers, never here
                ps_var = self.create_variable(
                    np.asarray(leaf.numpy()) if recipe is None else recipe, name=leaf.path,
                    trainable=bool(getattr(leaf, "trainable", True)),
                    aggregation=getattr(leaf, "aggregation", None),
                    shape=None if recipe is None else tuple(leaf.shape),
                    dtype=None if recipe is None else leaf.dtype)
                entry = self._keras[id(leaf)] = (leaf, ps_var)
            return entry[1]

        return jax.tree_util.tree_map(convert, variables)

    def mark_per_worker(self, keras_variable: Any) -> None:
        """Makes a Keras variable per-worker: steps read and assign each worker's own copy of it
        (see ``create_variable(..., per_worker=True)``). ``keras.Variable(...,
        per_worker_variable=True)`` under ``scope()`` calls it, as TensorFlow spells it.

        Raises:
          ValueError: a step already placed the variable on the parameter servers.
        """
        if self.is_placed(keras_variable):
            raise ValueError(
                f"{keras_variable.path!r} is already on the parameter servers (a step used it): "
                "create it with per_worker_variable=True, before any step uses it.")
        self._keras_per_worker.setdefault(id(keras_variable), (keras_variable, None))

    # ----- variables ------------------------------------------------------------------------
    def create_variable(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                        dtype: Any = None, shape: Sequence[int] | None = None,
                        aggregation: Any = "none", per_worker: bool = False,
                        per_worker_variable: bool = False) -> PSVariable | PerWorkerVariable:
        """Creates a variable on the parameter servers (partitioned if the partitioner says so).

        With ``per_worker=True`` (or TensorFlow's spelling, ``per_worker_variable=True``): a
        ``PerWorkerVariable``, one unsynchronized copy on each worker, on no parameter server,
        never trained (``trainable`` and ``aggregation`` do not apply); a scheduled step reads
        and assigns its worker's copy with ``strategy.read``/``strategy.assign``, and
        ``variable.read_all()`` gives each worker's value (see ``per_worker_variables``).

        Unpartitioned variables go to the least-loaded ps (round-robin by size); inside
        ``colocate_vars_with(v)`` to ``v``'s ps, unpartitioned. A partition-aware
        ``initial_value`` is called once per shard, with ``shape`` (required) and ``dtype``
        (default float32), so no task ever holds the whole variable, as in TensorFlow: a
        callable with a ``shard_info`` parameter (``sx.partitioners.ShardInfo``), or one that
        takes TensorFlow's ``partition_shape`` and ``partition_offset`` keyword arguments (one
        that returns the whole variable instead is sliced, as TensorFlow does).

        ``aggregation`` (TensorFlow's ``VariableAggregation`` or Keras' name: ``"none"``,
        ``"sum"``, ``"mean"``, ``"only_first_replica"``) is kept as ``variable.aggregation``.
        As in TensorFlow with one replica per worker, it changes nothing: each step is one
        replica's, whose updates are written as they are.

        Raises:
          ValueError: an unknown ``aggregation``, or a bad shape (named in the message).
        """
        aggregation = aggregation_name(aggregation)
        per_worker = per_worker or per_worker_variable
        recipe = initial_value if isinstance(initial_value, ShardRecipe) else None
        per_shard = recipe is not None or (callable(initial_value)
                                           and partition_aware(initial_value))
        if per_worker:
            if per_shard:
                raise ValueError(
                    f"create_variable({name!r}, per_worker=True) got a partition-aware "
                    "initializer; a per-worker variable is not partitioned: pass its value or "
                    "a callable without arguments.")
            value = initial_array(initial_value, name, dtype, shape)
            name = self._unique_name(name or "Variable")
            return PerWorkerVariable(
                name, f"{self._namespace}{name}", value,
                lambda var: coord.ClusterCoordinator(self)._read_per_worker(var))
        if per_shard:
            if shape is None:
                raise ValueError(
                    f"create_variable({name!r}): a partition-aware initializer builds one "
                    "shard at a time, so it needs the whole variable's shape=(rows, ...).")
            value = None
            full_shape, full_dtype = tuple(int(d) for d in shape), np.dtype(dtype or "float32")
        else:
            value = initial_array(initial_value, name, dtype, shape)
            full_shape, full_dtype = value.shape, value.dtype
        name = self._unique_name(name or "Variable")
        shards = [full_shape[0]] if full_shape else [1]
        colocated = self._colocate[-1].placements[0].ps if self._colocate else None
        if (self._partitioner is not None and colocated is None and len(full_shape) >= 1
                and full_shape[0] > 1):
            shards = shard_sizes(full_shape[0],
                                 partition_count(self._partitioner, name, full_shape, full_dtype))
        row_bytes = full_dtype.itemsize * int(np.prod(full_shape[1:], dtype=np.int64))
        placements = []
        for i, (start, rows) in enumerate(zip(shard_offsets(shards), shards, strict=False)):
            ps = colocated if colocated is not None else min(
                range(len(self._load)), key=lambda p: (self._load[p], p))
            self._load[ps] += rows * row_bytes
            key = f"{self._namespace}{name}" + (f"/part_{i}" if len(shards) > 1 else "")
            placements.append(Placement(ps, key, start, rows))
        kind = ShardedVariable if len(placements) > 1 else PSVariable
        var = kind(name, full_shape, full_dtype, trainable, placements, self._pull, self._assign,
                   aggregation)
        if value is not None:
            self._write("create", placements, value)
        elif recipe is not None:
            self._build_on_servers(recipe, placements, full_shape, full_dtype)
            self._built_on_servers.add(name)
        for p in placements if per_shard and recipe is None else ():
            self._write("create", [p], build_shard(initial_value, name, p.start, p.rows,
                                                      full_shape, full_dtype))
        self._variables.append(var)
        return var

    def describe_variables(self) -> str:
        """A table: each variable's shards, the ps holding them (with address) and bytes."""
        return describe_table(self._variables, self._ps_addresses)

    def optimizer_iterations(self, variable: PSVariable) -> list[int]:
        """Updates applied to each shard of ``variable`` (exact; one per applied step id)."""
        out = []
        for p in variable.placements:
            reply = self._ps.clients[p.ps].call("stats", {"names": [p.key]})
            out.append(int(reply.meta["stats"][p.key]["iterations"]))
        return out

    def shard_stats(self, variable: Any) -> list[dict[str, Any]]:
        """Per shard of ``variable`` (a ``PSVariable`` or a placed Keras variable), its ps'
        counters: ``iterations``, ``applied_steps``, ``duplicates``, ``whole_pulls``,
        ``rows_pulled`` (the row-sparse path), ``bytes``, ``apply_seconds``."""
        variable = self._on_ps(variable)
        return [self._ps.clients[p.ps].call("stats", {"names": [p.key]}).meta["stats"][p.key]
                for p in variable.placements]

    def save_checkpoint(self, path: str, variables: Sequence[Any] | None = None) -> None:
        """Writes ``variables`` (default: all) with their optimizer state to ``path``.

        A directory (a path without ``.npz``): each parameter server writes its own shards in
        parallel and the chief commits the version with a manifest, so no process holds a
        variable whole and a save killed at any point leaves the previous version (see
        ``sharded_checkpoint``). A ``.npz`` file: the variables whole, from the chief, for
        models that fit it. Either restores with any number of parameter servers and any
        partitioner, and into Keras under any strategy (``sx.checkpoint.load_variables``).

        Raises:
          ValueError: a ``.npz`` path for a variable built by its servers (too large for the
            chief): the message names it; save to a directory instead.
        """
        chosen = self._checkpointed(variables)
        if not sharded_checkpoint.is_sharded(path):
            large = [v.name for v in chosen if v.name in self._built_on_servers]
            if large:
                raise ValueError(
                    f"save_checkpoint({path!r}) would gather {large} whole on the chief, which "
                    "never holds them (built by their parameter servers); save to a directory "
                    "instead, e.g. strategy.save_checkpoint('ckpt'), where each server writes "
                    "its own shards.")
        checkpoint.save(self, path, chosen)

    def restore_checkpoint(self, path: str, variables: Sequence[Any] | None = None) -> list[str]:
        """Loads ``path`` (a directory or ``.npz`` file from ``save_checkpoint``, or
        ``sx.checkpoint.save_variables``' file) into ``variables`` (default: all; Keras
        variables are matched by ``path``), resharding to this strategy's placement; returns
        the names restored. From a directory each parameter server reads only the saved rows
        of its own shards."""
        return checkpoint.restore(self, path, self._checkpointed(variables))

    def save_checkpoint_version(self, path: str, variables: Sequence[Any]) -> str:
        """``save_checkpoint`` into the directory ``path``; returns the version written, which
        ``restore_checkpoint_version`` reads while ``path`` keeps it (the newest two)."""
        return sharded_checkpoint.save(self, path, self._checkpointed(variables))

    def restore_checkpoint_version(self, path: str, version: str,
                                   variables: Sequence[Any]) -> list[str]:
        """``restore_checkpoint`` of one version of the directory ``path`` (not its newest
        necessarily): the one a backup recorded."""
        return sharded_checkpoint.restore(self, path, self._checkpointed(variables), version)

    def _checkpointed(self, variables: Sequence[Any] | None) -> list[PSVariable]:
        return list(self._variables if variables is None else self._on_ps(list(variables)))

    def applied_steps(self, variable: PSVariable) -> list[list[str]]:
        """Per shard of ``variable``, the ids (``"c<closure>:<step>"``) of the steps applied
        to it, sorted: the parameter servers' ledger, to check that no step was applied twice
        (their count equals ``optimizer_iterations``) or lost."""
        return [self._ps.clients[p.ps].call("ledger", {"names": [p.key]}).meta["ledger"][p.key]
                for p in variable.placements]

    def _unique_name(self, name: str) -> str:
        candidate, n = name, 0
        while candidate in self._names:
            n += 1
            candidate = f"{name}_{n}"
        self._names.add(candidate)
        return candidate

    def _pull(self, var: PSVariable) -> np.ndarray:
        return self._ps.pull([var.describe()])[0]

    def _assign(self, var: PSVariable, value: np.ndarray) -> None:
        self._write("assign", var.placements, value)

    def _build_on_servers(self, recipe: ShardRecipe, placements: Sequence[Placement],
                          shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Each ps builds its shards of a variable from ``recipe`` (one call per ps)."""
        by_ps: dict[int, list[Placement]] = defaultdict(list)
        for p in placements:
            by_ps[p.ps].append(p)

        def call(ps: int) -> Callable[[RpcClient], Any]:
            meta = {"names": [p.key for p in by_ps[ps]], "recipe": recipe.describe(),
                    "shape": list(shape), "dtype": dtype.name,
                    "starts": [p.start for p in by_ps[ps]],
                    "rows": [p.rows for p in by_ps[ps]]}
            return lambda c: c.call("build", meta)

        self._ps.each({ps: call(ps) for ps in by_ps})

    def _write(self, method: str, placements: Sequence[Placement], value: np.ndarray) -> None:
        """Sends each shard of ``value`` to its ps (``create`` or ``assign``), one call per ps."""
        names: dict[int, list[str]] = defaultdict(list)
        parts: dict[int, list[np.ndarray]] = defaultdict(list)
        base = placements[0].start  # ``value`` starts at the first placement's row (a shard's)
        for p in placements:
            names[p.ps].append(p.key)
            rows = slice(p.start - base, p.start - base + p.rows)
            parts[p.ps].append(value[rows] if value.ndim else value)

        def call(ps: int) -> Callable[[RpcClient], Any]:
            return lambda c: c.call(method, {"names": names[ps]}, parts[ps], stream=True)

        self._ps.each({ps: call(ps) for ps in names})

    def _set_optimizers(self, built: program.Program) -> None:
        for text, (spec, variables) in built.optimizers.items():
            by_ps: dict[int, list[str]] = defaultdict(list)
            for var in variables:
                for p in var.placements:
                    if (p.key, text) not in self._optimizers_set:
                        by_ps[p.ps].append(p.key)
                        self._optimizers_set.add((p.key, text))
            sparse = spec.get("sparse_updates", DEFAULT_SPARSE_UPDATES)
            clean = {k: v for k, v in spec.items() if k != "sparse_updates"}
            for ps, names in by_ps.items():
                self._ps.clients[ps].call("set_optimizer", {"names": names, "spec": clean,
                                                            "sparse_updates": sparse})

    def shutdown(self) -> None:
        """Stops the coordinator and, for the last strategy of this process on the cluster,
        asks every worker and ps to exit (runs at exit too). An earlier one only lets go of the
        tasks: its variables stay on the ps until they exit."""
        if self._closed:
            return
        self._closed = True
        if self._coordinator is not None:
            self._coordinator.shutdown()
        last = shared_session.sessions.leave(self._membership)
        for client in [*self._worker_clients, *self._ps.clients]:
            try:
                if last:
                    client.call("shutdown", timeout=5)
            except Exception as err:
                logger.info("%s did not take the shutdown request: %s", client.name, err)
            client.close()
        self._ps.close()


def _function_key(fn: Callable[..., Any]) -> Any:
    """Identity of a replica function for the program cache: its code and what it closes over
    (a nested function re-created per call maps to the same programs)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return id(fn)
    cells = tuple(id(c.cell_contents) for c in (fn.__closure__ or ()))
    defaults = tuple(id(d) for d in (fn.__defaults__ or ()))
    return (code, cells, defaults, inspect.ismethod(fn) and id(fn.__self__))
