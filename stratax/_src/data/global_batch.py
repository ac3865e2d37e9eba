"""The global-batch policy, written once: how a global batch relates to the replicas.

A batch size given by the user is *global*: each of the ``num_replicas_in_sync`` replicas gets
``global // num_replicas`` rows. ``fit`` (``stratax._src.keras.feed``), custom loops
(``stratax._src.data.distributed_dataset``), ``InputContext`` and ``stratax train`` all check it
here, so they can never disagree.
"""

from __future__ import annotations


def check_divisible(global_batch: int, num_replicas: int, *, hint: str = "") -> None:
    """Raises unless ``global_batch`` splits evenly over ``num_replicas``.

    Args:
        global_batch: the global batch size.
        num_replicas: the replicas it is split over.
        hint: the call to show with a corrected batch size, e.g. ``"model.fit(..., batch_size=N)"``.

    Raises:
        ValueError: naming the batch, the replicas and a batch size that works.
    """
    if global_batch % num_replicas == 0:
        return
    fixed = max(num_replicas, global_batch // num_replicas * num_replicas)
    example = f", e.g. `{hint.replace('=N', f'={fixed}')}`" if hint else f", e.g. {fixed}"
    raise ValueError(
        f"Global batch size {global_batch} does not split over {num_replicas} replicas; use a "
        f"multiple of {num_replicas}{example}."
    )
