"""stratax's log output: every diagnostic goes to ``logging`` under the ``stratax`` logger.

Library code only logs (``logging.getLogger(__name__)``), so an application's own logging
configuration decides what is shown. For programs that configure nothing, ``STRATAX_LOG_LEVEL``
(or ``stratax --log-level``, which sets it for the processes it starts) attaches one stderr
handler to the ``stratax`` logger; Python's last-resort handler still prints warnings and errors
when neither is set.
"""

from __future__ import annotations

import logging
import os

from stratax._src.core import env

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "stratax %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """Shows ``stratax`` log records at ``level`` and above on stderr (once per process).

    Args:
      level: One of ``LEVELS``, case ignored.

    Raises:
      ValueError: ``level`` is not one of ``LEVELS``.
    """
    name = level.strip().lower()
    if name not in LEVELS:
        raise ValueError(f"Log level {level!r} is not one of {', '.join(LEVELS)}.")
    logger = logging.getLogger("stratax")
    logger.setLevel(name.upper())
    if not any(getattr(h, "_stratax", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._stratax = True  # type: ignore[attr-defined]  # marks the handler as ours
        logger.addHandler(handler)


def configure_from_env() -> None:
    """Applies ``STRATAX_LOG_LEVEL`` when it is set; leaves logging alone otherwise.

    Raises:
      ValueError: The variable names no level (the message lists them).
    """
    if os.environ.get(env.STRATAX_LOG_LEVEL, "").strip():
        configure(env.get_choice(env.STRATAX_LOG_LEVEL, LEVELS, "warning",
                                     what="a log level"))
