"""``model.fit`` under a strategy (ARCHITECTURE.md, layer 6).

The modules here are the hooks into Keras: the one install step, the ``Model`` methods routed
through the strategy's runner, the feed of batches, a failed call's recovery, atomic saving,
the Keras ``Distribution`` made from a strategy's mesh, and the layers and utilities stratax
adds (``SyncBatchNormalization``, ``DatasetCreator``). ``runners`` holds each strategy's runner
(``MeshRunner``, ``TPURunner``, ``ParameterServerRunner``), ``steps`` the train-step variants
they compile (ARCHITECTURE.md, "Train-step variants"), ``callbacks`` the callbacks stratax adds.
"""
