"""The runners: how each strategy serves Keras' ``fit``, ``evaluate`` and ``predict``.

``runner`` is the one interface a strategy plugs into Keras through; ``mesh_runner`` serves the
data-parallel strategies (OneDevice, Mirrored, MWMS), ``tpu_runner`` TPUStrategy's static
shapes (exact on a padded batch: ``tpu_padding``), ``ps_runner`` ParameterServerStrategy (one
scheduled closure per step group, its steps in ``keras.steps.ps_steps``).
"""
