"""Input for every strategy: distributed datasets, the one global-batch policy (split, pad,
mask), sharding of a pipeline over workers as TensorFlow shards it, and prefetching
(ARCHITECTURE.md, layer 3; docs/inputs.md, docs/uneven_batches.md)."""
