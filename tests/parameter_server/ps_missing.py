"""A chief whose parameter server never starts: the strategy must name it within 2 s."""

import sys
import time

import stratax as sx

start = time.monotonic()
try:
    sx.ParameterServerStrategy(timeout_seconds=2)
except sx.WorkerUnavailableError as err:
    print(f"ERROR after {time.monotonic() - start:.1f} s: {err}", flush=True)
    sys.exit(3)
sys.exit(0)
