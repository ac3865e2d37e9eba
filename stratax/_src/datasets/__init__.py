"""Small datasets embedded in the package, for training with no network (``stratax train``)."""

from stratax._src.datasets.digits import load_digits

__all__ = ["load_digits"]
