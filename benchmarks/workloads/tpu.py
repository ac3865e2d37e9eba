"""TPUStrategy on emulated cores: the on-device step loop, and model vs data parallelism.

Two tables, every configuration in a fresh process (CPU devices forced before JAX starts),
repetitions rep-major, median with min-max:

1. **Step loop** (``--devices 2``, MLP 784-128-10, global batch 256, ``steps_per_execution``
   32): ``TPURunner`` (one XLA program scans 32 steps) vs stratax ``MirroredStrategy`` on the
   same devices, which runs Keras' own ``steps_per_execution`` loop (32 host dispatches of
   Keras' jitted step), vs Keras on one device.
2. **Model vs data parallelism at 8 emulated cores** (MLP 784-1024-1024-10, batch 256):
   8 replicas x 1 core (data parallel) vs 4 x 2 and 2 x 4 with a ``LayoutMap`` splitting the
   Dense kernels over the cores; parameter+optimizer bytes held per device (from the
   variables' shardings) and samples/s.

``model.fit`` under ``TPUStrategy`` runs ``TPURunner``; ``MirroredStrategy`` on the same
devices is the public way to run the same model through Keras' own loop. Run
``python -m benchmarks.workloads.tpu [--quick] [--reps 3]``; writes
``benchmarks/results/tpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks import REPO_ROOT, RESULTS_DIR

ROOT = REPO_ROOT
RESULTS = RESULTS_DIR
BATCH = 256
LOOP_CONFIGS = (("tpu-runner", 2), ("mirrored", 2), ("one-device", 1))
PARALLEL_CONFIGS = (("tpu-runner", 8, 1), ("tpu-runner", 8, 2), ("tpu-runner", 8, 4))


def _megatron_layout(keras):
    """Hidden kernels split by columns over the cores, the output kernel by rows."""
    layout_map = keras.distribution.LayoutMap(None)
    layout_map[".*dense(_1)?/kernel"] = (None, "core")
    layout_map[".*dense_2/kernel"] = ("core", None)
    return layout_map


def _child(spec: dict) -> dict:
    if spec.get("platform", "cpu") == "cpu":
        os.environ["STRATAX_CPU_DEVICES"] = str(spec["devices"])
    import stratax as sx  # first: selects Keras' JAX backend  # isort: skip
    import jax
    import keras
    import numpy as np

    system, cores = spec["system"], spec.get("cores", 1)
    layout_map = None
    if system.startswith("tpu"):
        resolver = sx.cluster_resolver.TPUClusterResolver(emulation_cores=spec["devices"])
        topology = sx.tpu.experimental.initialize_tpu_system(resolver)
        assignment = sx.tpu.experimental.DeviceAssignment.build(
            topology, computation_shape=[1, 1, 1, cores] if cores <= 2 else [cores // 2, 1, 1, 2],
            num_replicas=spec["devices"] // cores)
        if cores > 1:
            layout_map = _megatron_layout(keras)
        strategy = sx.TPUStrategy(resolver, experimental_device_assignment=assignment,
                                  layout_map=layout_map)
    elif system == "mirrored-mp":  # the same layouts on any devices: GPUs, or CPU devices here
        strategy = sx.MirroredStrategy(
            cores_per_replica=cores if cores > 1 else None,
            layout_map=_megatron_layout(keras) if cores > 1 else None)
    elif system == "mirrored":
        strategy = sx.MirroredStrategy()
    else:
        strategy = sx.OneDeviceStrategy("cpu:0")
    widths = spec["widths"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(spec["steps"] * BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((784,))]
                                 + [keras.layers.Dense(w, activation="relu") for w in widths]
                                 + [keras.layers.Dense(10)])
        model.compile(optimizer="adam", steps_per_execution=spec["spe"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.begins: list[float] = []
            self.ends: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.begins.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    timer = Timer()
    history = model.fit(x, y, batch_size=BATCH, epochs=1 + spec["epochs"], shuffle=False,
                        verbose=0, callbacks=[timer])
    window = timer.ends[-1] - timer.begins[1]
    device0 = strategy.devices[0]
    variables = list(model.variables) + list(model.optimizer.variables)
    per_device = sum(s.data.nbytes for v in variables for s in v.value.addressable_shards
                     if s.device == device0)
    return {"samples_per_s": spec["epochs"] * len(x) / window,
            "param_bytes_device0": per_device,
            "final_loss": float(history.history["loss"][-1]),
            "jax": jax.__version__, "keras": keras.__version__}


def _run(spec: dict, timeout: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.workloads.tpu",
                           "--child", json.dumps(spec)],
                          check=False,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"failed": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(lines[-1])


def _median_row(results: list[dict], key: str) -> str:
    values = [r[key] for r in results if key in r]
    if not values:
        return "failed: " + results[0].get("failed", "?")
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--model-parallel", action="store_true",
                        help="only the model- vs data-parallel comparison, under MirroredStrategy "
                             "(cores_per_replica + LayoutMap) on every device of --platform")
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--devices", type=int, default=8,
                        help="devices to use (on cpu: forced CPU devices)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    if args.model_parallel:
        _model_parallel(args)
        return
    steps, epochs = (32, 2) if args.quick else (64, 4)
    loop_specs = [{"system": s, "devices": d, "spe": 32, "widths": [128], "steps": steps,
                   "epochs": epochs} for s, d in LOOP_CONFIGS]
    parallel_specs = [{"system": s, "devices": d, "cores": c, "spe": 8, "widths": [1024, 1024],
                       "steps": 16 if args.quick else 32, "epochs": 2 if args.quick else 3}
                      for s, d, c in PARALLEL_CONFIGS]
    specs = loop_specs + parallel_specs
    results: list[list[dict]] = [[] for _ in specs]
    load_before = os.getloadavg()
    for rep in range(args.reps):
        for i, spec in enumerate(specs):
            results[i].append(_run(spec, timeout=900))
            print(f"rep {rep + 1}: {spec['system']} x{spec['devices']} "
                  f"cores={spec.get('cores', 1)}: {results[i][-1]}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tpu.json").write_text(json.dumps(
        {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                     "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
         "configs": [{"spec": s, "reps": r} for s, r in zip(specs, results, strict=True)]},
        indent=1))
    lines = [
        "# TPUStrategy (emulated on CPU devices): on-device step loop and model parallelism", "",
        f"Median [min-max] of {args.reps} fresh processes; {os.cpu_count()} CPU cores, load "
        f"average {load_before[0]:.1f} before and {os.getloadavg()[0]:.1f} after. "
        "`python -m benchmarks.workloads.tpu" + (" --quick" if args.quick else "") + "`.", "",
        "## Step loop: MLP 784-128-10, batch 256, steps_per_execution 32", "",
        "| system | devices | samples/s |", "| --- | ---: | ---: |",
    ]
    names = {"tpu-runner": "TPUStrategy + TPURunner (one scan program per 32 steps)",
             "mirrored": "stratax MirroredStrategy, Keras' own loop (32 dispatches)",
             "one-device": "stratax OneDeviceStrategy"}
    for spec, reps in zip(loop_specs, results[:len(loop_specs)], strict=True):
        lines.append(f"| {names[spec['system']]} | {spec['devices']} | "
                     f"{_median_row(reps, 'samples_per_s')} |")
    lines += ["", ("## Model vs data parallelism at 8 emulated cores: MLP 784-1024-1024-10, "
                   "batch 256, steps_per_execution 8"), "",
              "| replicas x cores | variables + Adam slots on device 0 (MiB) | samples/s |",
              "| --- | ---: | ---: |"]
    for spec, reps in zip(parallel_specs, results[len(loop_specs):], strict=True):
        ok = [r for r in reps if "param_bytes_device0" in r]
        mib = f"{ok[0]['param_bytes_device0'] / 2**20:.2f}" if ok else "-"
        lines.append(f"| {spec['devices'] // spec['cores']} x {spec['cores']} | {mib} | "
                     f"{_median_row(reps, 'samples_per_s')} |")
    (RESULTS / "tpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _model_parallel(args: argparse.Namespace) -> None:
    """``--model-parallel``: data parallel vs 2- and 4-way model parallel, one table."""
    if args.devices < 2:
        print(f"model parallelism needs 2 or more devices; --devices {args.devices}")
        return
    specs = [{"system": "mirrored-mp", "platform": args.platform, "devices": args.devices,
              "cores": cores, "spe": 8, "widths": [1024, 1024], "steps": 16 if args.quick else 32,
              "epochs": 2 if args.quick else 3}
             for cores in (1, 2, 4) if args.devices % cores == 0 and cores <= args.devices]
    results = [[_run(spec, timeout=900) for _ in range(args.reps)] for spec in specs]
    lines = [f"# Model vs data parallelism under MirroredStrategy, {args.devices} "
             f"{args.platform} devices: MLP 784-1024-1024-10, batch 256, steps_per_execution 8",
             "", f"Median [min-max] of {args.reps} fresh processes. "
             "`python -m benchmarks.workloads.tpu "
             f"--model-parallel --platform {args.platform} --devices {args.devices}`.", "",
             "| replicas x cores | variables + Adam slots on device 0 (MiB) | samples/s "
             "| final loss |",
             "| --- | ---: | ---: | ---: |"]
    for spec, reps in zip(specs, results, strict=True):
        ok = [r for r in reps if "param_bytes_device0" in r]
        mib = f"{ok[0]['param_bytes_device0'] / 2**20:.2f}" if ok else "-"
        loss = f"{ok[0]['final_loss']:.5f}" if ok else "-"
        lines.append(f"| {spec['devices'] // spec['cores']} x {spec['cores']} | {mib} | "
                     f"{_median_row(reps, 'samples_per_s')} | {loss} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"model_parallel_{args.platform}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
