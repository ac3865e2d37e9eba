"""The replica context inside ``strategy.run`` of a parameter-server step: one worker's step."""

from __future__ import annotations

from typing import Any

from stratax._src.strategies.replica_context import ReplicaContext


class WorkerReplicaContext(ReplicaContext):
    """The replica context inside ``run`` of a parameter-server step: one worker's step.

    Asynchronous mode: one replica (id 0), whose collectives are the value itself, as in
    TensorFlow's ``ParameterServerStrategy``. Synchronous mode: a step per worker, combined by
    the servers (they sum the workers' gradients), so ``num_replicas_in_sync`` counts the
    workers; a collective across them inside the step is not available and says so.
    """

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy, traced=False)

    def _refuse_in_sync_mode(self, what: str) -> None:
        if self.strategy.synchronous:
            raise ValueError(
                f"{what} inside a synchronous ParameterServerStrategy step is not available: "
                "each worker's step runs alone and the parameter servers sum the workers' "
                "gradients (strategy.apply_gradients); combine results with strategy.reduce "
                "in the scheduled function instead.")

    @property
    def replica_id_in_sync_group(self) -> Any:
        self._refuse_in_sync_mode("replica_id_in_sync_group")
        return 0

    def all_reduce(self, reduce_op: Any, value: Any) -> Any:
        self._refuse_in_sync_mode("all_reduce")
        return super().all_reduce(reduce_op, value)

    def all_gather(self, value: Any, axis: int) -> Any:
        self._refuse_in_sync_mode("all_gather")
        return super().all_gather(value, axis)
