"""The peers stratax is measured against: TensorFlow and PyTorch programs and sessions, run from
their own virtual environments (``benchmarks/.venvs/``)."""
