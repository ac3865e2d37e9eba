"""``ParameterServerStrategy``: variables on parameter servers, steps on workers.

Not a mesh strategy: the coordinator (chief) holds variable handles, the ``ps`` tasks hold the
values and apply the optimizer, the ``worker`` tasks run exported steps (see ``coordinator``
and ``program``). The same program may be started on every task: on a ``ps`` or ``worker``
task, constructing the strategy serves that task and exits the process when the chief is done
(``tasks.server.serve_and_exit``).

The class is the TensorFlow API; its parts live beside it: the variables and their placement in
``variable_store``, the checkpoint methods in ``server_checkpoints`` (``CheckpointMethods``),
the servers' counters in ``server_stats`` (``ServerStats``), ``strategy.extended`` in
``extended``, scheduling in ``coordinator``.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.core.context import replica_context_scope
from stratax._src.distributed_input.input_context import InputContext
from stratax._src.parameter_server import closures, functions, program, recovery
from stratax._src.parameter_server import coordinator as coord
from stratax._src.parameter_server.connection import TaskConnection
from stratax._src.parameter_server.extended import ParameterServerExtended
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.per_worker_variables import PerWorkerVariable
from stratax._src.parameter_server.residency import Residency, hybrid_settings, require_tables
from stratax._src.parameter_server.server_checkpoints import CheckpointMethods
from stratax._src.parameter_server.server_stats import ServerStats
from stratax._src.parameter_server.shard_init import remote_recipe
from stratax._src.parameter_server.tasks import cluster_check
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES
from stratax._src.parameter_server.tasks.server import SERVED_JOBS, serve_and_exit
from stratax._src.parameter_server.transport.rpc import RpcClient
from stratax._src.parameter_server.variable_store import VariableStore
from stratax._src.parameter_server.variables import PSVariable
from stratax._src.parameter_server.worker_context import WorkerReplicaContext
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.replica_context import ReplicaContext

logger = logging.getLogger(__name__)
MODES = ("async", "sync")


class ParameterServerStrategy(CheckpointMethods, ServerStats, Strategy):
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
        self._timeout = timeout_seconds
        self._step_timeout = step_timeout_seconds
        if cluster_resolver.task_type in SERVED_JOBS:
            serve_and_exit(spec, cluster_resolver.task_type, cluster_resolver.task_id,
                           timeout_seconds)
        self._coordinator: coord.ClusterCoordinator | None = None  # read by the heartbeat
        self._tasks = TaskConnection(spec, timeout_seconds, self._restarted)
        self._ps, self._worker_clients = self._tasks.ps, self._tasks.workers
        self._ps_addresses = self._tasks.ps_addresses
        self._store = VariableStore(
            self._ps, variable_partitioner, lambda: self._namespace,
            lambda var: coord.ClusterCoordinator(self)._read_per_worker(var))
        self._programs = program.ProgramCache(
            lambda: replica_context_scope(WorkerReplicaContext(self)), self._new_program)
        self._residency = Residency(self) if self.hybrid is not None else None
        self._warned: set[str] = set()
        self._closed = False
        atexit.register(self.shutdown)
        # The chief's device, where run/reduce outside schedule execute; after the claim, so
        # starting JAX's backend never delays it past the tasks' chief timeout.
        super().__init__(jax.local_devices()[:1])

    @property
    def _session(self) -> Any:
        """The chief session this strategy shares with the others of this process on its
        cluster (``shared_session``)."""
        return self._tasks.membership.session

    @property
    def _namespace(self) -> str:
        """Prefix of this strategy's names on the tasks: ``""`` for the first strategy of this
        process on its cluster, ``"s<n>/"`` for later ones (``shared_session``)."""
        return self._tasks.membership.namespace

    def _restarted(self, client: RpcClient) -> None:
        """The heartbeat saw the task of ``client`` answer as a new process (see
        ``recovery.task_restarted``)."""
        if self._coordinator is not None:
            recovery.task_restarted(self._coordinator, client, self.mode == "sync")

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
        return list(self._store.variables)

    _extended_type = ParameterServerExtended  # ``extended.colocate_vars_with`` places on a ps

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
        leaves = jax.tree_util.tree_leaves(call_args)
        for leaf in leaves:
            if not isinstance(leaf, closures.LeafRef):
                raise TypeError(
                    f"strategy.run arguments must come from next(per_worker_iterator), got "
                    f"{type(leaf).__name__}; close over constants in the function instead."
                )
        built = self._programs.get(fn, call_args, [leaf.spec for leaf in leaves],
                                   self._namespace)
        return closure.add_run(built, leaves)

    def _new_program(self, built: program.Program) -> None:
        """A step traced for the first time: the servers learn its optimizers; hybrid mode
        tracks the dense variables it reads."""
        if self._residency is not None:
            require_tables(built)
            self._residency.track(built)
        self._store.set_optimizers(built)

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
            return jax.tree_util.tree_map(self._store.value_now, variables)
        return program.read(self._store.on_ps(variables))

    def read_rows(self, table: Any, ids: Any) -> tuple[Any, Any]:
        """Inside ``run``: ``(rows, positions)`` with ``table[ids] == rows[positions]``; only
        the distinct rows are pulled, and the gradient of ``rows`` is pushed row-sparse.
        Outside ``schedule``: the same pair from the table's value now (its distinct rows,
        unpadded), as ``read`` there."""
        if not closures.is_recording():
            unique, positions = np.unique(np.asarray(ids), return_inverse=True)
            placed = self._store.placed(table)
            rows = (placed.sparse_read(unique) if isinstance(placed, PSVariable)
                    else self._store.value_now(table)[unique])
            return rows, positions.reshape(np.shape(ids))
        return program.read_rows(self._store.on_ps(table), ids)

    def apply_gradients(self, grads_and_vars: Any, optimizer: Any,
                        sparse_updates: str = DEFAULT_SPARSE_UPDATES) -> None:
        """Inside ``run``: the parameter servers apply ``optimizer`` (a Keras SGD/Adam or its
        config) to these gradients. ``sparse_updates``: "dense" (Keras' rule, the default) or
        "lazy" (only the touched rows' slots change: faster, another rule) for row-sparse
        gradients."""
        pairs = [(g, self._store.on_ps(v)) for g, v in grads_and_vars]
        program.apply_gradients(pairs, optimizer, sparse_updates)

    def assign(self, variables: Any, values: Any) -> None:
        """Inside ``run``: new values for a pytree of variables (state that is not trained by
        gradients: BatchNorm statistics, a dropout seed); the worker writes them to the
        parameter servers after the step's gradients, so its next step reads them (a
        ``PerWorkerVariable``: to its own copy, right after the step's compute)."""
        program.assign(self._store.on_ps(variables), values)

    def refresh_keras_variables(self) -> None:
        """Copies the parameter servers' values into the Keras variables they came from, so
        ``model.get_weights()``, ``model.save()`` and local evaluation see the trained values
        (not those built by their servers, which no process holds whole)."""
        for keras_var, ps_var in self._store.keras_pairs():
            if remote_recipe(keras_var) is None:
                keras_var.assign(ps_var.numpy())

    def is_placed(self, variable: Any) -> bool:
        """Whether the Keras ``variable`` has its parameter-server variable already."""
        return self._store.is_placed(variable)

    def place_variables(self, variables: Any) -> Any:
        """Places the Keras variables of a pytree on the parameter servers now (they are
        otherwise placed when a step first uses them) and returns their ``PSVariable`` objects."""
        return self._store.on_ps(variables)

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

    def mark_per_worker(self, keras_variable: Any) -> None:
        """Makes a Keras variable per-worker: steps read and assign each worker's own copy of it
        (see ``create_variable(..., per_worker=True)``). ``keras.Variable(...,
        per_worker_variable=True)`` under ``scope()`` calls it, as TensorFlow spells it.

        Raises:
          ValueError: a step already placed the variable on the parameter servers.
        """
        self._store.mark_per_worker(keras_variable)

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
        return self._store.create(initial_value, name, trainable, dtype, shape, aggregation,
                                  per_worker or per_worker_variable,
                                  self.extended.colocated_ps())

    def shutdown(self) -> None:
        """Stops the coordinator and, for the last strategy of this process on the cluster,
        asks every worker and ps to exit (runs at exit too). An earlier one only lets go of the
        tasks: its variables stay on the ps until they exit."""
        if self._closed:
            return
        self._closed = True
        if self._coordinator is not None:
            self._coordinator.shutdown()
        self._tasks.close()

