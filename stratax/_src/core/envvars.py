"""Reading numeric and choice environment variables with one error that names the variable and
the fix.

Every ``STRATAX_*`` setting (and every cluster variable a resolver reads) goes through these
functions, so a bad value reads the same everywhere, e.g.::

    Environment variable STRATAX_SHM_SLOT_BYTES='12x' is not an integer >= 64 (bytes per
    process slot); set it to an integer >= 64 or unset it for the default 1048576.

An unset variable and an empty one are the same. ``env`` holds the variables' names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

_Number = TypeVar("_Number", int, float)


def get_str(name: str, context: str) -> str:
    """Returns the non-empty value of environment variable ``name``.

    Args:
      name: The variable.
      context: Who needs it and how to set it, appended to the error message.

    Raises:
      ValueError: If the variable is unset or empty.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"Environment variable {name} is not set (or empty); {context}")
    return value


def get_choice(name: str, choices: tuple[str, ...], default: str, *, what: str) -> str:
    """The value of ``name``, case and surrounding spaces ignored, or ``default`` when unset.

    Raises:
      ValueError: a value outside ``choices``; the message says it is not ``what`` (e.g. "a
        CPU collectives implementation") and lists the choices.
    """
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not {what}; use one of {', '.join(choices)} "
                         f"(or unset it for {default}).")
    return value


def _parse(convert: Callable[[str], _Number], kind: str, name: str, value: str,
           minimum: _Number, default: _Number | None, meaning: str, unset: str) -> _Number:
    """``convert(value)`` if it is ``>= minimum``, ``default`` if ``value`` is empty and there
    is one, else the one error, worded by ``kind`` ("an integer", "a number")."""
    text = value.strip()
    if not text and default is not None:
        return default
    try:
        number = convert(text)
    except ValueError:
        number = None
    if number is not None and number >= minimum:  # False for NaN too
        return number
    expected = f"{kind} >= {_show(minimum)}"
    if default is not None:
        fix = f" or unset it for the default {_show(default)}"
    elif unset:
        fix = f" or unset it {unset}"
    else:
        fix = f", e.g. {name}={_show(max(minimum, 1))}"
    what = f" ({meaning})" if meaning else ""
    raise ValueError(f"Environment variable {name}={value!r} is not {expected}{what}; "
                     f"set it to {expected}{fix}.")


def _show(number: float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)


def parse_int(name: str, value: str, minimum: int = 0, *, default: int | None = None,
              meaning: str = "", unset: str = "") -> int:
    """Parses the value of environment variable ``name`` as an integer ``>= minimum``.

    Args:
      name: The variable, named in the error.
      value: Its raw value (``""`` when unset).
      minimum: The smallest value accepted.
      default: Returned when ``value`` is empty; the error offers it ("or unset it for the
        default 2").
      meaning: What the number counts, shown in the error ("bytes per process slot").
      unset: For a variable without a plain default, what unsetting it does, shown in the error
        instead of a default ("for one CPU device"; ``get_optional_int`` returns ``None``).

    Raises:
      ValueError: ``value`` is not a decimal integer ``>= minimum`` (an empty one neither,
        unless there is a ``default``).
    """
    return _parse(int, "an integer", name, value, minimum, default, meaning, unset)


def get_int(name: str, context: str, minimum: int = 0) -> int:
    """Returns required environment variable ``name`` as an integer ``>= minimum``; see
    ``get_str`` for ``context``."""
    return parse_int(name, get_str(name, context), minimum)


def get_optional_int(name: str, minimum: int = 0, *, meaning: str = "",
                     unset: str = "") -> int | None:
    """Environment variable ``name`` as an integer ``>= minimum``, or ``None`` when it is unset
    or empty; ``meaning`` and ``unset`` word the error as in ``parse_int``."""
    value = os.environ.get(name, "")
    if not value.strip():
        return None
    return parse_int(name, value, minimum, meaning=meaning, unset=unset)


def get_int_or(name: str, default: int, minimum: int = 0, *, meaning: str = "") -> int:
    """Environment variable ``name`` as an integer ``>= minimum``, or ``default`` when it is
    unset or empty; see ``parse_int``."""
    return parse_int(name, os.environ.get(name, ""), minimum, default=default, meaning=meaning)


def get_float_or(name: str, default: float, minimum: float = 0, *, meaning: str = "") -> float:
    """Environment variable ``name`` as a number ``>= minimum`` (not NaN), or ``default`` when it
    is unset or empty; the error reads like ``parse_int``'s, with "a number" for "an integer"."""
    return _parse(float, "a number", name, os.environ.get(name, ""), float(minimum), default,
                  meaning, "")
