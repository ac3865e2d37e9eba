"""Runs every variant of ``input_matrix`` on the workers of a MultiWorkerMirroredStrategy.

Usage: python mwms_inputs_program.py OUT_DIR [VARIANT ...] (default: ``VARIANTS``). Writes
OUT_DIR/<variant>_<worker>.npz and prints "done <worker>".
"""

import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import numpy as np  # noqa: E402
from input_matrix import VARIANTS, run_variant  # noqa: E402

out_dir = sys.argv[1]
for variant in sys.argv[2:] or VARIANTS:
    result = run_variant(strategy, variant)
    np.savez(os.path.join(out_dir, f"{variant}_{strategy.worker_index}.npz"), **result)
print("done", strategy.worker_index, flush=True)
