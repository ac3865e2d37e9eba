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
global batches (``DATA``).
"""

from __future__ import annotations

from typing import Any

from stratax._src import seam
from stratax._src.data.input_context import AutoShardPolicy


def shard_for_process(dataset: Any, policy: AutoShardPolicy, num_processes: int,
                      rank: int) -> tuple[Any, bool]:
    """``(pipeline, per_process)``: what process ``rank`` of ``num_processes`` reads, and
    whether it gives this process's part of each global batch (rather than whole ones).

    Raises:
        ValueError: a ``tf.data`` policy stratax does not support (``HINT``), or a ``FILE``
            policy over a pipeline that reads no files or has no batch size to find.
    """
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


def tf_auto_shard_policy(dataset: Any) -> AutoShardPolicy:
    """A ``tf.data`` pipeline's ``options().experimental_distribute.auto_shard_policy``."""
    name = dataset.options().experimental_distribute.auto_shard_policy.name
    if name not in AutoShardPolicy.__members__:
        raise ValueError(
            f"auto_shard_policy {name} of the tf.data pipeline is not supported by stratax; use "
            "AUTO, FILE, DATA or OFF (tf.data.experimental.AutoShardPolicy)."
        )
    return AutoShardPolicy[name]
