"""``sx.config``: stratax's options, and TensorFlow's ``tf.config`` calls of a TPU program.

Options are set in code or mirrored by ``STRATAX_*`` variables for launch scripts; an explicit
argument wins over ``update``, which wins over the variable, which wins over the default
(docs/options.md lists them)::

    import stratax as sx
    sx.config.update("sharded_update", "off")   # or STRATAX_SHARDED_UPDATE=off
    sx.config.sharded_update                    # "off"
    sx.config.reset("sharded_update")
"""

from typing import Any

from stratax._src.core.config import config as _config
from stratax._src.runtime.tpu_system import experimental_connect_to_cluster

update = _config.update
reset = _config.reset

__all__ = ["experimental_connect_to_cluster", "reset", "update"]


def __getattr__(name: str) -> Any:
    """An option's value, e.g. ``sx.config.prefetch_depth``.

    Raises:
        AttributeError: ``name`` is not an option; the message lists them.
    """
    if name not in _option_names():
        raise AttributeError(f"module 'stratax.config' has no attribute {name!r}; the options "
                             f"are {', '.join(_option_names())}.")
    return _config.get(name)


def __dir__() -> list[str]:
    """The public names and the options: what an editor should offer after ``sx.config.``."""
    return sorted({*__all__, *_option_names()})


def _option_names() -> list[str]:
    return sorted(option.name for option in _config)
