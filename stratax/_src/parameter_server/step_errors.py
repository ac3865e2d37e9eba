"""The errors a scheduled closure ends with: the step's own exception type, the worker named.

TensorFlow's coordinator re-raises the exception a step raised (a ``ValueError`` in the user's
function reaches ``join()`` and ``fetch()`` as a ``ValueError``) and fails the closures it
cancels with ``CancelledError``. stratax keeps its own error text (the worker, its address and
the quoted error) and its ``StepError`` base, and adds the type: a step that raised a builtin
exception fails with a class that derives from both ``StepError`` and that builtin, so
``except ValueError`` and ``except sx.StrataxError`` both catch it.

Only builtin exception types are rebuilt: a worker sends the class *name* of its error, never
the class itself, so the chief never imports or builds what a worker names. Other types (the
user's own classes, JAX's runtime errors, a parameter server's ``RemoteError``) arrive as a
plain ``StepError`` whose message names the type.
"""

from __future__ import annotations

import builtins
import functools
from concurrent import futures

from stratax._src.core.errors import StrataxError
from stratax._src.parameter_server.transport.rpc import RemoteError

# Builtins that mean control flow, not a failed step: never re-raised as such.
_NOT_REBUILT = frozenset({"StopIteration", "StopAsyncIteration"})


class StepError(StrataxError):
    """A scheduled step failed on a worker; the message names it and quotes its error.

    When the step raised a builtin exception, the error is also an instance of that type
    (e.g. ``ValueError``), as TensorFlow re-raises it.
    """


class StepCancelledError(StepError, futures.CancelledError):
    """A closure cancelled because another one failed: TensorFlow's ``CancelledError``.

    Closures still queued and closures already running when the error came fail with it
    (a running one's own late result or error is dropped); also a
    ``concurrent.futures.CancelledError``, Python's own "cancelled" signal.
    """


@functools.cache
def _typed_class(type_name: str) -> type[StepError] | None:
    """``StepError`` subclass that is also the builtin ``type_name``, or None when there is
    no such builtin exception or Python cannot combine the two classes."""
    base = getattr(builtins, type_name, None)
    if (type_name in _NOT_REBUILT or not isinstance(base, type)
            or not issubclass(base, Exception) or issubclass(base, StrataxError)):
        return None
    try:
        # BaseException's ``__str__``: the stratax message as is (KeyError's would quote it).
        return type(f"Step{type_name}", (StepError, base),
                    {"__module__": __name__, "__str__": BaseException.__str__,
                     "__doc__": f"A step failed with ``{type_name}``: see ``StepError``."})
    except TypeError:
        return None


def step_error(where: str, error: BaseException) -> BaseException:
    """The error a closure fails with when running it on a worker raised ``error``.

    Args:
      where: The worker, e.g. ``"worker 0 at 127.0.0.1:2222"``, for errors raised on the
        chief (a ``RemoteError`` names its task already).
      error: What the call raised: the worker's ``RemoteError`` (its message is kept; it is
        returned as is unless its ``remote_type`` is a builtin), another stratax error
        (returned as is: a lost worker stays a ``WorkerUnavailableError``), or any exception
        raised here.

    Returns:
      A ``StepError`` that is also the step's builtin exception type where there is one.
    """
    if isinstance(error, RemoteError):
        return _build(error.remote_type, str(error)) or error
    if isinstance(error, StrataxError):
        return error
    message = f"{where}: {type(error).__name__}: {error}"
    builtin = type(error).__module__ == "builtins"
    return (_build(type(error).__name__, message) if builtin else None) or StepError(message)


def _build(type_name: str | None, message: str) -> StepError | None:
    """The typed error for ``message``, or None (no such builtin, or it cannot be built
    from a message alone)."""
    typed = _typed_class(type_name) if type_name else None
    try:
        return typed(message) if typed else None
    except TypeError:
        return None
