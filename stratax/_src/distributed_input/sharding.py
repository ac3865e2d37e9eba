"""How the processes of a multi-worker run share a ``tf.data`` or grain pipeline.

``tf.distribute``'s rule, by the pipeline's ``auto_shard_policy`` (TensorFlow's
``options().experimental_distribute.auto_shard_policy``, or ``InputOptions.auto_shard_policy``
of a distributed dataset where it says more than ``AUTO``):

- ``DATA``: every process reads the global batches and keeps its rows of each
  (``FeedLayout.share``), so the processes train exactly what one process trains;
- ``FILE``: each process reads only its files (TensorFlow's own rewrite of the pipeline), each
  global batch rebatched into per-process parts, as ``tf.distribute`` rebatches it;
- ``AUTO``: ``FILE`` where the pipeline reads files, else ``DATA``;
- ``OFF``: the pipeline already gives this process's part (the user sharded it).

A grain ``DataLoader`` built with ``shard_options`` (``ShardByJaxProcess``) reads only its
process's records: its batches are this process's part. Every other grain dataset is read as
global batches (``DATA``). So is a torch ``DataLoader``, unless its sampler is a
``DistributedSampler``: then it reads only its replica's samples, and its batches are this
process's part (its ``num_replicas`` and ``rank`` must be the job's process count and this
process's index, else it is an error: half the data would be skipped or read twice).
"""

from __future__ import annotations

from typing import Any

from stratax._src import seam
from stratax._src.distributed_input.input_context import AutoShardPolicy


def shard_for_process(dataset: Any, policy: AutoShardPolicy, num_processes: int,
                      rank: int) -> tuple[Any, bool]:
    """``(pipeline, per_process)``: what process ``rank`` of ``num_processes`` reads, and
    whether it gives this process's part of each global batch (rather than whole ones).

    Raises:
        ValueError: a ``tf.data`` policy stratax does not support (``HINT``), or a ``FILE``
            policy over a pipeline that reads no files or has no batch size to find.
    """
    sampler = torch_distributed_sampler(dataset)
    if sampler is not None:
        _check_torch_sampler(sampler, num_processes, rank)
        return dataset, num_processes > 1
    if num_processes == 1:
        return dataset, False
    if seam.is_tf_dataset(dataset):
        if policy is AutoShardPolicy.AUTO:
            policy = tf_auto_shard_policy(dataset)
        if policy is AutoShardPolicy.AUTO:
            policy = (AutoShardPolicy.FILE if seam.tf_dataset_reads_files(dataset)
                      else AutoShardPolicy.DATA)
        if policy is AutoShardPolicy.FILE:
            if not seam.tf_dataset_reads_files(dataset):
                raise ValueError(
                    "The tf.data pipeline's auto_shard_policy is FILE, but it reads no files "
                    "(TFRecordDataset, TextLineDataset, ...). Use AutoShardPolicy.DATA (or "
                    "AUTO) to share its batches by rows, or OFF if it is sharded already."
                )
            return seam.tf_dataset_shard_files(dataset, num_processes, rank), True
    return dataset, policy is AutoShardPolicy.OFF or seam.grain_loader_shards(dataset)


def _from_torch(obj: Any, name: str) -> bool:
    """Whether ``obj``'s class is, or derives from, torch's ``torch.utils.data`` class ``name``
    (read by name, as Keras recognises a torch ``DataLoader``: stratax never imports torch)."""
    return any(cls.__name__ == name and cls.__module__.startswith("torch.utils.data")
               for cls in type(obj).__mro__)


def torch_distributed_sampler(loader: Any) -> Any:
    """The ``DistributedSampler`` a torch ``DataLoader`` draws its samples from, else ``None``
    (given as ``sampler=``, or inside ``batch_sampler=``)."""
    if not _from_torch(loader, "DataLoader"):
        return None
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if sampler is not None and _from_torch(sampler, "DistributedSampler"):
            return sampler
    return None


def _check_torch_sampler(sampler: Any, num_processes: int, rank: int) -> None:
    """Raises unless ``sampler`` reads shard ``rank`` of ``num_processes``."""
    replicas, its_rank = int(sampler.num_replicas), int(sampler.rank)
    if (replicas, its_rank) != (num_processes, rank):
        raise ValueError(
            f"The torch DataLoader's DistributedSampler reads shard {its_rank} of {replicas}, "
            f"but this is process {rank} of {num_processes}, so samples would be skipped or "
            "read twice. Build it with DistributedSampler(dataset, "
            "num_replicas=jax.process_count(), rank=jax.process_index()): each process reads "
            "its own part, and its batches are its part of each global batch. Or drop the "
            "sampler: every process then reads the global batches and keeps its rows."
        )


def tf_auto_shard_policy(dataset: Any) -> AutoShardPolicy:
    """A ``tf.data`` pipeline's ``options().experimental_distribute.auto_shard_policy``."""
    name = dataset.options().experimental_distribute.auto_shard_policy.name
    if name not in AutoShardPolicy.__members__:
        raise ValueError(
            f"auto_shard_policy {name} of the tf.data pipeline is not supported by stratax; use "
            "AUTO, FILE, DATA or OFF (tf.data.experimental.AutoShardPolicy)."
        )
    return AutoShardPolicy[name]
