"""Checkpoints that change shape (see docs/parameter_server.md, Failures: "Checkpoints that
change shape").

``ParameterServerStrategy.save_checkpoint`` / ``restore_checkpoint`` write and read them on the
parameter servers; these functions do the same for Keras variables under any strategy.
"""

from stratax._src.keras.checkpoint_variables import load_variables, save_variables

__all__ = ["load_variables", "save_variables"]
