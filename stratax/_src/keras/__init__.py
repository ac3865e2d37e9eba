"""``model.fit`` under a strategy: the runners that serve Keras' methods (``MeshRunner``,
``TPURunner``, ``ParameterServerRunner``), the feed of batches, the train-step variants and
the callbacks on Keras' state (ARCHITECTURE.md, layer 6, "Train-step variants")."""
