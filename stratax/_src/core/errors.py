"""Errors raised by stratax for cluster and collective failures.

Bad arguments raise ``ValueError``/``TypeError`` and calls in the wrong order or context raise
``RuntimeError``; the classes here are for failures of the distributed system itself, so users can
catch them apart from programming errors.
"""


class StrataxError(RuntimeError):
    """Base class of the errors stratax raises for failures of the distributed system."""


class MixedStrategyError(RuntimeError):
    """Raised when the scopes of two different strategies are mixed."""


class CollectiveTimeoutError(StrataxError):
    """A collective or rendezvous did not complete in time; names the peer that did not answer."""


class WorkerUnavailableError(StrataxError):
    """A worker or server stopped answering; names the task (type and index)."""
