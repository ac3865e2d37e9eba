"""``InputContext``, ``ValueContext`` and ``InputOptions``: what an input function is told."""

from __future__ import annotations

import dataclasses
import enum

from stratax._src.distributed_input.global_batch import check_divisible


class AutoShardPolicy(enum.Enum):
    """How a worker picks its share of the data (TensorFlow's ``tf.data`` names).

    ``DATA``: every worker reads every global batch and keeps the rows of its own replicas.
    Each global batch is cut into contiguous chunks of ``ceil(rows / replicas)`` rows in
    replica order (``global_batch.split_sizes``), and a worker's replicas are consecutive, so a
    worker keeps one contiguous block of each global batch: with 2 workers of 2 replicas and a
    batch of 8 rows, worker 0 keeps rows 0-3 and worker 1 rows 4-7. Like TensorFlow's ``DATA``
    policy, every worker reads the whole input and discards what is not its own; the replicas
    are fed the rows a one-process run would feed them.
    ``FILE``: a ``tf.data`` pipeline over files is rewritten (by TensorFlow) so that each worker
    reads only its files, its batches rebatched into the worker's part of the global batch.
    ``AUTO``: ``FILE`` for a ``tf.data`` pipeline that reads files, else ``DATA``; for
    ``tf.data`` it defers to the pipeline's own ``auto_shard_policy`` option.
    ``OFF``: every worker's input is already its own share (the user shards it); its batches
    are cut over the worker's replicas the same way. ``distributed_input.sharding`` has the rule.
    """

    AUTO = "AUTO"
    DATA = "DATA"
    FILE = "FILE"
    OFF = "OFF"


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What ``distribute_datasets_from_function`` tells ``dataset_fn`` about its pipeline.

    One input pipeline runs per process (worker). ``dataset_fn`` should read its own shard and
    batch it with ``get_per_replica_batch_size(global_batch_size)``.

    Example:
        >>> def dataset_fn(ctx: sx.InputContext):
        ...     batch = ctx.get_per_replica_batch_size(64)
        ...     return batches(x[ctx.input_pipeline_id :: ctx.num_input_pipelines], batch)
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size // num_replicas_in_sync``.

        Raises:
            ValueError: the global batch does not split evenly over the replicas.
        """
        check_divisible(global_batch_size, self.num_replicas_in_sync,
                        hint="`ctx.get_per_replica_batch_size({batch})`")
        return global_batch_size // self.num_replicas_in_sync


@dataclasses.dataclass(frozen=True)
class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells ``value_fn``: which replica."""

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1


class InputReplicationMode(enum.Enum):
    """How many input pipelines ``distribute_datasets_from_function`` builds (TensorFlow's
    ``tf.distribute.InputReplicationMode``).

    ``PER_WORKER``: one pipeline per worker, whose batches the worker's replicas share (the
    default, and what stratax runs). ``PER_REPLICA``: one pipeline per replica, each feeding its
    own replica; stratax refuses it (``InputOptions`` names the fix).
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """Options of ``experimental_distribute_dataset`` / ``distribute_datasets_from_function``.

    Args:
        experimental_fetch_to_device: put each batch on the replicas' devices in a background
            thread while the previous step runs (default). When False, batches are
            ``PerReplica`` values holding host numpy arrays (this process's replicas), placed on
            the devices by ``strategy.run``.
        experimental_prefetch_to_device: how many batches the background thread prepares ahead
            of use (default 2; 0 = no thread, each batch is prepared when requested).
        auto_shard_policy: how a worker takes its share of the input in multi-worker runs.
        experimental_replication_mode: ``InputReplicationMode.PER_WORKER`` (one pipeline per
            process, the default; its name as a string is taken too). ``PER_REPLICA`` is an
            error.
    """

    experimental_fetch_to_device: bool = True
    experimental_prefetch_to_device: int = 2
    auto_shard_policy: AutoShardPolicy = AutoShardPolicy.AUTO
    experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER

    def __post_init__(self) -> None:
        if self.experimental_prefetch_to_device < 0:
            raise ValueError(
                "experimental_prefetch_to_device must be >= 0; received "
                f"{self.experimental_prefetch_to_device}."
            )
        mode = self.experimental_replication_mode
        names = [m.value for m in InputReplicationMode]
        if not isinstance(mode, InputReplicationMode) and str(mode).upper() not in names:
            raise ValueError(
                f"experimental_replication_mode={mode!r} is not an InputReplicationMode; use "
                "sx.InputReplicationMode.PER_WORKER."
            )
        mode = InputReplicationMode(mode.value if isinstance(mode, InputReplicationMode)
                                    else str(mode).upper())
        if mode is not InputReplicationMode.PER_WORKER:
            raise ValueError(
                f"experimental_replication_mode={mode} is not supported; stratax runs one input "
                "pipeline per worker whose batches its replicas share: use "
                "sx.InputReplicationMode.PER_WORKER, and have dataset_fn batch for "
                "input_context.get_per_replica_batch_size(global_batch) * its replicas."
            )
        object.__setattr__(self, "experimental_replication_mode", mode)
        if not isinstance(self.auto_shard_policy, AutoShardPolicy):
            object.__setattr__(
                self, "auto_shard_policy", AutoShardPolicy(str(self.auto_shard_policy).upper())
            )
