"""Small real datasets shipped with stratax, for examples and ``stratax train`` (no download)."""

from stratax._src.datasets import load_digits

__all__ = ["load_digits"]
