"""The strategies (OneDevice, Mirrored, MultiWorkerMirrored, TPU), ``strategy.run``'s compiler,
replica contexts and cross-replica reductions (ARCHITECTURE.md, layer 4; docs/strategy_run.md)."""
