"""One repetition of one configuration, in a fresh interpreter: ``python -m benchmarks.harness.child
SPEC``.

The parent writes a JSON spec, sets the environment (XLA_FLAGS, KERAS_BACKEND, TF_CONFIG) and
starts this module; it writes a JSON result, ``status`` "ok" or "failed" with a one-line
reason, and exits 0 either way (a crash or a kill is seen by the parent instead). PyTorch
systems train in ``benchmarks.peers.torch_train`` (same data, weights, timing rule and result).

Timing: ``model.fit`` runs one warm-up epoch then the timed epochs. A callback records wall
time at each epoch's start and end; Keras waits for the epoch's results before
``on_epoch_end``. Throughput is the samples of the timed epochs over the time from the start of
the first timed epoch to the end of the last one. The callback has no ``on_train_batch_end``,
so Keras keeps its asynchronous dispatch; its ``on_train_batch_begin`` waits for the devices
once, at the second execution, to time the first execution (``benchmarks.harness.timing``).
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()


def one_line_reason(exc: BaseException) -> str:
    """``Type: message`` on one line; a vague first line gets the telling detail line added.

    TensorFlow's errors start with "Graph execution error:" and say what went wrong many lines
    later (``INVALID_ARGUMENT: You must feed a value ...``); that line is the useful one.
    """
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    rest = [ln for ln in lines[1:] if not ln.startswith(("File ", "[[", "Detected at node"))]
    if rest and (head.endswith(":") or len(head) < 40):
        status = [ln for ln in rest if re.search(r"\b[A-Z][A-Z_]{5,}:\s", ln)]
        head = f"{head} {(status or rest)[0]}"
    elif rest and head.endswith(("{", "(", "[")):  # a value dump follows: keep its last line
        head = f"{head} ... {rest[-1]}"
    return " ".join(f"{type(exc).__name__}: {head}".split())[:300]


def _pin(core: int | None) -> list[int]:
    if core is not None:
        os.sched_setaffinity(0, {core})
    return sorted(os.sched_getaffinity(0))


def _train(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from benchmarks.harness.configs import GLOBAL_BATCH, SYSTEMS, WARMUP_EPOCHS, WORKLOADS
    from benchmarks.harness.timing import epoch_timer, timed_result
    from benchmarks.peers.sessions import open_session
    from benchmarks.workloads.models import build_model, initial_weights

    system, workload = SYSTEMS[spec["system"]], WORKLOADS[spec["workload"]]
    steps_per_epoch, timed_epochs = spec["steps_per_epoch"], spec["timed_epochs"]
    session = open_session(system, spec["device"])
    t_import = time.perf_counter()
    x, y = np.load(spec["x_path"]), np.load(spec["y_path"])
    with session.scope:
        model = build_model(session.keras, workload)
        model.compile(optimizer=session.keras.optimizers.Adam(learning_rate=1e-3),
                      loss=session.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spec["spe"])
        current = model.get_weights()
        weights = initial_weights([tuple(w.shape) for w in current], current)
        model.set_weights(weights)
    checksum = float(sum(float(np.abs(w).sum()) for w in weights))
    timer = epoch_timer(session.keras, session.sync)
    t_fit = time.perf_counter()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=WARMUP_EPOCHS + timed_epochs,
                        shuffle=False, verbose=0, callbacks=[timer, *session.callbacks])
    t_done = time.perf_counter()
    if timer.first_done is None:
        raise RuntimeError("fit ran a single execution; the harness needs at least two to time "
                           "the first one (check steps per epoch and epochs).")
    return {
        **timed_result(timer.begins, timer.ends, (t_fit, timer.first_done, t_done),
                       steps_per_epoch, timed_epochs),
        "losses": (losses := [float(v) for v in history.history["loss"]]),
        "final_loss": losses[-1],
        "init_checksum": checksum,
        "import_s": t_import - _T0,
        "build_s": t_fit - t_import,
        "replicas": session.replicas,
        "devices": session.devices,
        "versions": session.versions,
    }


def main(argv: list[str]) -> int:
    """Run the spec at ``argv[1]`` and write its result file; see the module docstring."""
    spec = json.loads(Path(argv[1]).read_text())
    affinity = _pin(spec.get("pin_core"))
    try:
        from benchmarks.harness.configs import SYSTEMS

        if SYSTEMS[spec["system"]].family == "torch":
            from benchmarks.peers.torch_train import train
        else:
            train = _train
        result = train(spec)
    except BaseException as exc:  # every failure becomes a one-line reason
        traceback.print_exc()
        result = {"status": "failed", "reason": one_line_reason(exc)}
    result["affinity"] = affinity
    result["python"] = sys.version.split()[0]
    result["child_wall_s"] = time.perf_counter() - _T0
    result["peak_rss_mib_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = Path(spec["result_path"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (framework thread pools can hang or crash at exit).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
