"""Seeing a distributed run: metrics intake, launcher events, TensorBoard and the live dashboard.

Layout of a run directory (every writer appends, every reader tails; nothing is rewritten)::

    <run_dir>/metrics/<task>.jsonl   one JSON object per line per report of that process
    <run_dir>/events.jsonl           the launcher's starts, failures (root cause), restarts, end

Modules and their layer: ``run_dir``, ``record``, ``events``, ``reader``, ``server`` and
``arguments`` are pure Python (standard library, ``stratax._src.core`` only), so any layer, the
launcher and the parameter-server processes included, can report or serve without importing JAX
or Keras. The Keras callbacks that feed them (``WorkerMetrics``, ``TensorBoard``) live in
``stratax._src.keras``.
This ``__init__`` imports nothing, so importing a pure module stays light.
"""
