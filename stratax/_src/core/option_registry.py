"""A registry of options in the manner of ``jax.config``: typed, documented, validated, each
mirrored by a ``STRATAX_*`` environment variable for launch scripts.

An option's value, first found wins: an explicit argument where an API takes one (e.g.
``CommunicationOptions(implementation=...)``), ``update(name, value)``, the environment
variable, the default. The variable is read at each use, not at import, so a launch script or a
test may set it at any time before the decision it feeds is made; that decision is made once,
where the strategy or the runner is built.

Global state is a class plus one instance (``stratax._src.core.config.config``), so tests can
build registries of their own.

Example::

    options = Options([Option("depth", "MY_DEPTH", Integer(0, "batches ahead"), 2, "Depth.")])
    options.update("depth", 4)
    options.depth                      # 4
    options.reset("depth")             # back to $MY_DEPTH, else 2
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from stratax._src.core import env


class Choice:
    """One of a few names, case and surrounding spaces ignored (``"auto"``, ``"off"``)."""

    def __init__(self, choices: tuple[str, ...], what: str) -> None:
        self.choices = choices
        self.what = what  # "a sharded-update setting", in the environment variable's error

    def accepted(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)

    def check(self, value: Any) -> str | None:
        text = value.strip().lower() if isinstance(value, str) else None
        return text if text in self.choices else None

    def from_env(self, name: str, default: Any) -> str:
        return env.get_choice(name, self.choices, default, what=self.what)


class Integer:
    """An integer ``>= minimum`` (``bool`` is refused)."""

    def __init__(self, minimum: int, meaning: str, unset: str = "") -> None:
        self.minimum = minimum
        self.meaning = meaning  # what it counts, in the error
        self.unset = unset  # what leaving it unset does, where the default is decided later

    def accepted(self) -> str:
        return f"an integer >= {self.minimum} ({self.meaning})"

    def check(self, value: Any) -> int | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= self.minimum
        return int(value) if ok else None

    def from_env(self, name: str, default: Any) -> int | None:
        if default is None:
            return env.get_optional_int(name, self.minimum, meaning=self.meaning,
                                            unset=self.unset)
        return env.get_int_or(name, default, self.minimum, meaning=self.meaning)


class ChoiceOrInteger:
    """A name of ``choice`` or an integer of ``integer`` (``"auto"``, ``"all"`` or a count)."""

    def __init__(self, choice: Choice, integer: Integer) -> None:
        self.choice = choice
        self.integer = integer

    def accepted(self) -> str:
        return f"{self.choice.accepted()} or {self.integer.accepted()}"

    def check(self, value: Any) -> str | int | None:
        name = self.choice.check(value)
        return name if name is not None else self.integer.check(value)

    def from_env(self, name: str, default: Any) -> str | int:
        text = os.environ.get(name, "").strip().lower() or default
        if text in self.choice.choices:
            return text
        return env.parse_int(name, text, self.integer.minimum, meaning=self.integer.meaning,
                                 unset=self.integer.unset)


class Number:
    """A real number ``>= minimum`` (not NaN; ``bool`` is refused); read as ``float``."""

    def __init__(self, minimum: float, meaning: str) -> None:
        self.minimum = minimum
        self.meaning = meaning

    def accepted(self) -> str:
        return f"a number >= {self.minimum:g} ({self.meaning})"

    def check(self, value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        number = float(value)
        return number if not math.isnan(number) and number >= self.minimum else None

    def from_env(self, name: str, default: Any) -> float | None:
        if default is None and not os.environ.get(name, "").strip():
            return None
        return env.get_float_or(name, default, self.minimum, meaning=self.meaning)


class Directory:
    """A directory (a non-empty string or ``os.PathLike``), kept as a string."""

    def __init__(self, meaning: str) -> None:
        self.meaning = meaning

    def accepted(self) -> str:
        return f"a non-empty path ({self.meaning})"

    def check(self, value: Any) -> str | None:
        text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        return text if isinstance(text, str) and text.strip() else None

    def from_env(self, name: str, default: Any) -> str | None:
        return os.environ.get(name, "").strip() or default


Kind = Choice | Integer | ChoiceOrInteger | Number | Directory


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its name, its environment variable, its kind, its default and what it does.

    ``default`` ``None`` means the code that reads it decides (e.g. by the devices), and passes
    that default to :meth:`Options.get`.
    """

    name: str
    env: str
    kind: Kind
    default: Any
    doc: str


_UNSET = object()


class Options:
    """The registry: option values by name, as attributes or through :meth:`get`.

    Example::

        options.update("sharded_update", "off")
        options.sharded_update            # "off"
        options.get("cpu_collectives", explicit="shm")   # "shm": an argument wins
    """

    def __init__(self, options: Iterable[Option]) -> None:
        self._options = {option.name: option for option in options}
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[Option]:
        """The options, in the order they were defined."""
        return iter(self._options.values())

    def option(self, name: str) -> Option:
        """The definition of option ``name``.

        Raises:
          ValueError: no option has that name; the message lists them.
        """
        option = self._options.get(name)
        if option is None:
            raise ValueError(f"Unknown stratax option {name!r}; the options are "
                             f"{', '.join(sorted(self._options))}.")
        return option

    def validate(self, name: str, value: Any) -> Any:
        """``value`` as option ``name`` holds it (e.g. ``" Off "`` -> ``"off"``).

        Raises:
          ValueError: an unknown option, or a value it does not accept; the message names the
            option, the value and what it accepts.
        """
        option = self.option(name)
        checked = option.kind.check(value)
        if checked is None:
            raise ValueError(f"stratax option {name!r} cannot be {value!r}; it accepts "
                             f"{option.kind.accepted()}. Environment equivalent: {option.env}.")
        return checked

    def update(self, name: str, value: Any) -> None:
        """Sets option ``name`` for this process; it wins over its environment variable.

        Raises:
          ValueError: see :meth:`validate`.
        """
        checked = self.validate(name, value)
        with self._lock:
            self._values[name] = checked

    def reset(self, name: str | None = None) -> None:
        """Forgets what :meth:`update` set for ``name`` (every option when ``None``)."""
        with self._lock:
            if name is None:
                self._values.clear()
            else:
                self.option(name)
                self._values.pop(name, None)

    def updates(self) -> dict[str, Any]:
        """What :meth:`update` set and :meth:`reset` did not forget, by option name (e.g. to
        log a run's settings)."""
        with self._lock:
            return dict(self._values)

    def get(self, name: str, explicit: Any = None, *, default: Any = _UNSET) -> Any:
        """The value of option ``name``: ``explicit`` unless ``None``, else what :meth:`update`
        set, else its environment variable, else ``default`` (when given) or the option's.

        Raises:
          ValueError: ``explicit`` or the variable holds a value the option does not accept.
        """
        option = self.option(name)
        if explicit is not None:
            return self.validate(name, explicit)
        with self._lock:
            value = self._values.get(name, _UNSET)
        if value is not _UNSET:
            return value
        return option.kind.from_env(option.env, option.default if default is _UNSET else default)

    def origin(self, name: str, explicit: Any = None) -> str:
        """Where :meth:`get` takes option ``name``'s value from, as an error message may name
        it: ``"argument"``, ``"sx.config"``, the environment variable's name, or
        ``"default"``."""
        option = self.option(name)
        if explicit is not None:
            return "argument"
        with self._lock:
            if name in self._values:
                return "sx.config"
        return option.env if os.environ.get(option.env, "").strip() else "default"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._options:
            raise AttributeError(f"stratax has no option {name!r}; the options are "
                                 f"{', '.join(sorted(self._options))}.")
        return self.get(name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._options})
