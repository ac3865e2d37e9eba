"""``ReduceOp``: how values from several replicas are combined."""

import enum


class ReduceOp(enum.Enum):
    """How ``all_reduce`` and ``Strategy.reduce`` combine values across replicas.

    ``SUM`` and ``MEAN`` are TensorFlow's; ``MAX`` and ``MIN`` map to XLA's ``pmax``/``pmin``.

    Example:
        >>> import stratax as sx
        >>> sx.ReduceOp.from_string("sum") is sx.ReduceOp.SUM
        True
    """

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"

    @staticmethod
    def from_string(name: "str | ReduceOp") -> "ReduceOp":
        """Returns the op for ``name`` (case-insensitive), or ``name`` if it already is one."""
        if isinstance(name, ReduceOp):
            return name
        try:
            return ReduceOp[str(name).upper()]
        except KeyError:
            choices = ", ".join(op.name for op in ReduceOp)
            raise ValueError(
                f"Unknown reduce op {name!r}; use one of {choices} (e.g. sx.ReduceOp.SUM)."
            ) from None
