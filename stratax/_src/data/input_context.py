"""``InputContext``, ``ValueContext`` and ``InputOptions``: what an input function is told."""

from __future__ import annotations

import dataclasses
import enum


class AutoShardPolicy(enum.Enum):
    """How a worker picks its share of the data (TensorFlow's ``tf.data`` names).

    ``AUTO`` and ``DATA`` give worker ``i`` of ``n`` every ``n``-th batch element starting at
    ``i`` of each global batch; ``OFF`` gives every worker the whole input (the user shards it).
    stratax reads in-memory arrays and Python iterables, which have no files, so ``FILE`` is
    treated as ``DATA``.
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
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"Global batch size {global_batch_size} does not split over "
                f"{self.num_replicas_in_sync} replicas; use a multiple of "
                f"{self.num_replicas_in_sync}."
            )
        return global_batch_size // self.num_replicas_in_sync


@dataclasses.dataclass(frozen=True)
class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells ``value_fn``: which replica."""

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """Options of ``experimental_distribute_dataset`` / ``distribute_datasets_from_function``.

    Args:
        experimental_fetch_to_device: put each batch on the replicas' devices while iterating
            (default). When False, batches stay host numpy arrays split per replica.
        experimental_prefetch_to_device: how many batches to transfer ahead of use (0 = none).
        auto_shard_policy: how a worker takes its share of the input in multi-worker runs.
        experimental_replication_mode: accepted for TensorFlow compatibility; only
            ``"PER_WORKER"`` exists (one pipeline per process).
    """

    experimental_fetch_to_device: bool = True
    experimental_prefetch_to_device: int = 1
    auto_shard_policy: AutoShardPolicy = AutoShardPolicy.AUTO
    experimental_replication_mode: str = "PER_WORKER"

    def __post_init__(self) -> None:
        if self.experimental_prefetch_to_device < 0:
            raise ValueError(
                "experimental_prefetch_to_device must be >= 0; received "
                f"{self.experimental_prefetch_to_device}."
            )
        if self.experimental_replication_mode != "PER_WORKER":
            raise ValueError(
                f"experimental_replication_mode={self.experimental_replication_mode!r} is not "
                "supported; stratax runs one input pipeline per worker ('PER_WORKER')."
            )
        if not isinstance(self.auto_shard_policy, AutoShardPolicy):
            object.__setattr__(
                self, "auto_shard_policy", AutoShardPolicy(str(self.auto_shard_policy).upper())
            )
