"""Makes sure Keras runs on its JAX backend before anything of stratax touches Keras."""

from __future__ import annotations

import logging
import os
import sys

from stratax._src.core import env

logger = logging.getLogger(__name__)


def ensure_jax_backend() -> None:
    """Selects Keras' JAX backend, or fails clearly if Keras already runs on another.

    Raises:
        RuntimeError: Keras was imported with another backend before stratax.
    """
    keras = sys.modules.get("keras")
    if keras is not None:
        backend = keras.backend.backend()
        if backend != "jax":
            raise RuntimeError(
                f"Keras was imported with the {backend!r} backend before stratax; stratax needs "
                "the JAX backend. Import stratax before keras, or set "
                f"`{env.KERAS_BACKEND}=jax` in the environment before starting Python."
            )
        return
    requested = os.environ.get(env.KERAS_BACKEND)
    if requested and requested != "jax":
        logger.warning("%s=%s overridden to 'jax': stratax runs Keras on JAX.",
                       env.KERAS_BACKEND, requested)
    os.environ[env.KERAS_BACKEND] = "jax"
