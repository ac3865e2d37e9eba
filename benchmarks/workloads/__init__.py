"""What is measured: one module per benchmark (``python -m benchmarks.workloads.<name>``), and the
models and data they train."""
