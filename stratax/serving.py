"""Inference for models whose tables no machine holds whole (see docs/parameter_server.md,
"A table larger than the chief"): ``for_serving(model, checkpoint)`` and the ``RowLookup``
layer read rows from a sharded checkpoint of ``ParameterServerStrategy.save_checkpoint``.
"""

from stratax._src.keras.serving import RowLookup, for_serving

__all__ = ["RowLookup", "for_serving"]
