"""Reading cluster environment variables with errors that name the variable and the fix."""

from __future__ import annotations

import os


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


def parse_int(name: str, value: str, minimum: int = 0) -> int:
    """Parses the value of environment variable ``name`` as an integer ``>= minimum``.

    Raises:
      ValueError: If ``value`` is not a decimal integer or is below ``minimum``.
    """
    text = value.strip()
    try:
        number = int(text)
    except ValueError:
        raise ValueError(
            f"Environment variable {name}={value!r} is not an integer; set it to a whole number "
            f">= {minimum}, e.g. {name}={max(minimum, 1)}."
        ) from None
    if number < minimum:
        raise ValueError(
            f"Environment variable {name}={value!r} is below {minimum}; set it to a whole "
            f"number >= {minimum}."
        )
    return number


def get_int(name: str, context: str, minimum: int = 0) -> int:
    """Returns environment variable ``name`` as an integer ``>= minimum``; see ``get_str``."""
    return parse_int(name, get_str(name, context), minimum)


def get_optional_int(name: str, minimum: int = 0) -> int | None:
    """Like ``get_int`` but returns ``None`` when the variable is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    return parse_int(name, value, minimum)
