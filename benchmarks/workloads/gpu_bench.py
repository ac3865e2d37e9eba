"""One GPU: stratax and Keras ``fit`` against a hand-written ``jax.jit`` loop and PyTorch.

Made for the GPU machine as it is (no TensorFlow, no network, Keras carried as wheels; see
``gpu.sh``). Every (system, workload) repetition runs in a fresh process; JAX processes share
a persistent compilation cache, so only the first repetition of a JAX system compiles.

Systems, all on one device, global batch 256, Adam (lr 1e-3), bf16 compute on GPU
(``mixed_bfloat16`` for Keras, ``torch.autocast(bfloat16)`` for PyTorch), float32 on CPU:

- ``kjax-fit``: Keras 3 on JAX, ``model.fit`` on numpy arrays, ``steps_per_execution`` 32;
- ``sx-fit``: the same under ``sx.MirroredStrategy()`` (one GPU);
- ``jax-jit``: the same Keras model trained by a hand-written ``jax.jit`` step
  (``model.stateless_call``, cross-entropy, Adam written out), batches already on the device;
- ``torch``: PyTorch, the same architecture (``torchvision.models.resnet50(num_classes=10)``
  for ResNet-50: the same ImageNet stem and bottlenecks as ``keras.applications.ResNet50``),
  a plain training loop, batches already on the device;
- ``tf``: TensorFlow, when importable; else "not available on this machine".

samples/s: steps of the timed epochs x 256 / their wall time, after one warm-up epoch
(median over repetitions, min-max). MFU: the model FLOPs of one training step, from XLA's cost
analysis of the ``jax-jit`` step (the same arithmetic for every system), times steps/s, over the
device's bf16 dense peak (H200: ~790 TFLOP/s, per the device notes; ``--peak-tflops``).

Run: ``python -m benchmarks.workloads.gpu_bench`` (GPU) or ``--cpu-smoke`` (seconds, on CPU: every
code path, tiny sizes). Writes ``benchmarks/results/gpu_bench[_smoke].{json,md}``.
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
from pathlib import Path
from typing import Any

from benchmarks import REPO_ROOT, RESULTS_DIR
from benchmarks.harness.configs import WORKLOADS

RESULTS = RESULTS_DIR
SYSTEMS = ("kjax-fit", "sx-fit", "jax-jit", "torch", "tf")
LABELS = {
    "kjax-fit": "Keras 3 JAX, model.fit",
    "sx-fit": "stratax MirroredStrategy (1 GPU), model.fit",
    "jax-jit": "hand-written jax.jit step, same Keras model",
    "torch": "PyTorch, plain loop",
    "tf": "TensorFlow / tf.keras",
}
BATCH = 256
SPE = 32


def _sizes(smoke: bool, workload: str) -> tuple[int, int, int]:
    """(batch, steps per epoch, timed epochs)."""
    if smoke:
        return 16, 4, 1
    return BATCH, SPE * 2, 3 if workload == "resnet50" else 4


# ------------------------------------------------------------------------- children


def _data(workload: Any, n: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, *workload.input_shape), dtype=np.float32)
    y = rng.integers(0, workload.num_classes, n).astype(np.int32)
    return x, y


def _keras_model(workload: Any, gpu: bool) -> Any:
    """The workload's Keras model with the suite's seeded initial weights."""
    import keras

    from benchmarks.workloads.models import build_model, initial_weights

    if gpu:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = build_model(keras, workload)
    current = model.get_weights()
    model.set_weights(initial_weights([tuple(w.shape) for w in current], current))
    return model


def _fit_child(system: str, workload: Any, smoke: bool, gpu: bool) -> dict[str, Any]:
    import jax
    import keras

    from benchmarks.harness.timing import epoch_timer

    batch, steps, epochs = _sizes(smoke, workload.name)
    scope: Any
    if system == "sx-fit":
        import stratax as sx

        scope = sx.MirroredStrategy().scope()
    else:
        import contextlib

        scope = contextlib.nullcontext()
    x, y = _data(workload, batch * steps)
    with scope:
        model = _keras_model(workload, gpu)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=min(SPE, steps))
    timer = epoch_timer(keras, lambda: jax.block_until_ready(jax.live_arrays()))
    history = model.fit(x, y, batch_size=batch, epochs=1 + epochs, shuffle=False, verbose=0,
                        callbacks=[timer])
    window = timer.ends[-1] - timer.begins[1]
    return {"samples_per_s": epochs * steps * batch / window,
            "final_loss": float(history.history["loss"][-1])}


def _jit_step(workload: Any, batch: int, gpu: bool) -> tuple[Any, tuple[Any, ...]]:
    """The hand-written ``jax.jit`` training step of ``workload``'s Keras model and its first
    arguments (params, state, Adam moments, step count, one batch)."""
    import jax
    import jax.numpy as jnp

    model = _keras_model(workload, gpu)
    params = [v.value for v in model.trainable_variables]
    state = [v.value for v in model.non_trainable_variables]
    moments = ([jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params])

    def loss_fn(params: Any, state: Any, x: Any, y: Any) -> Any:
        logits, state = model.stateless_call(params, state, x, training=True)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean(), state

    def step(params: Any, state: Any, moments: Any, t: Any, x: Any, y: Any) -> Any:
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y)
        t = t + 1
        m = [0.9 * a + 0.1 * g for a, g in zip(moments[0], grads, strict=True)]
        v = [0.999 * a + 0.001 * g * g for a, g in zip(moments[1], grads, strict=True)]
        lr = 1e-3 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        params = [p - lr * a / (jnp.sqrt(b) + 1e-7) for p, a, b in zip(params, m, v, strict=True)]
        return params, state, (m, v), t, loss

    x, y = _data(workload, batch)
    t = jnp.zeros((), jnp.float32)
    return jax.jit(step, donate_argnums=(0, 1, 2)), (params, state, moments, t, x, y)


def _jit_child(workload: Any, smoke: bool, gpu: bool) -> dict[str, Any]:
    import jax

    batch, steps, epochs = _sizes(smoke, workload.name)
    jitted, (params, state, moments, t, _, _) = _jit_step(workload, batch, gpu)
    x, y = _data(workload, batch * steps)
    xs = jax.device_put(x.reshape(steps, batch, *x.shape[1:]))
    ys = jax.device_put(y.reshape(steps, batch))
    flops = _step_flops(jitted, params, state, moments, t, xs[0], ys[0])
    times = []
    for _ in range(1 + epochs):
        start = time.perf_counter()
        for i in range(steps):
            params, state, moments, t, loss = jitted(params, state, moments, t, xs[i], ys[i])
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    return {"samples_per_s": epochs * steps * batch / sum(times[1:]),
            "final_loss": float(loss), "flops_per_step": flops}


def _step_flops(jitted: Any, *args: Any) -> float:
    """Model FLOPs of one step: XLA's cost analysis of the step lowered for CPU.

    Lowered for CPU because the GPU backend's analysis counts no FLOPs for convolutions
    (they become cuDNN custom calls); the HLO's dots and convolutions are the same arithmetic
    whichever device runs them. 0.0 when the analysis reports none.
    """
    costs = jitted.trace(*args).lower(lowering_platforms=("cpu",)).cost_analysis()
    if isinstance(costs, list):  # older JAX: one dict per computation
        costs = costs[0] if costs else {}
    return float((costs or {}).get("flops", 0.0))


def _recount(path: Path, workloads: list[str]) -> None:
    """Puts CPU-lowered FLOPs per step (global batch 256) into a results JSON and its table.

    For results whose ``jax-jit`` rows were measured before the FLOPs came from CPU lowering.
    """
    import jax

    data = json.loads(path.read_text())
    counted = {}
    for workload in workloads:
        jitted, args = _jit_step(WORKLOADS[workload], BATCH, gpu=False)
        counted[workload] = _step_flops(jitted, *args)
        for run in data["results"][workload].get("jax-jit", []):
            run["flops_per_step"] = counted[workload]
    data["meta"]["flops_recounted_on"] = f"cpu, jax {jax.__version__}"
    path.write_text(json.dumps(data, indent=1))
    table = _table(data["results"], data["meta"]["peak_tflops"])
    md = path.with_suffix(".md")
    header = md.read_text().split("\n\n")[0]
    md.write_text(header + "\n\nFLOPs per step (XLA cost analysis, lowered for CPU): "
                  + ", ".join(f"{w} {f / 1e9:.2f} GFLOP" for w, f in counted.items())
                  + ".\n\n" + table)
    print(md.read_text())


def _torch_child(workload: Any, smoke: bool, gpu: bool) -> dict[str, Any]:
    import torch

    batch, steps, epochs = _sizes(smoke, workload.name)
    device = "cuda" if gpu else "cpu"
    if workload.name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(num_classes=workload.num_classes)
        model = model.to(device, memory_format=torch.channels_last)
    elif workload.name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).to(device)
    else:
        raise ValueError(f"no PyTorch model for workload {workload.name!r}; use mlp or resnet50")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = _data(workload, batch * steps)
    if x.ndim == 4:  # NHWC numpy -> NCHW tensors (channels_last memory)
        x = x.transpose(0, 3, 1, 2)
    xs = torch.from_numpy(x.copy()).to(device).reshape(steps, batch, *x.shape[1:])
    ys = torch.from_numpy(y.astype("int64")).to(device).reshape(steps, batch)
    times = []
    for _ in range(1 + epochs):
        start = time.perf_counter()
        for i in range(steps):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
                loss = loss_fn(model(xs[i]), ys[i])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"samples_per_s": epochs * steps * batch / sum(times[1:]),
            "final_loss": float(loss.detach())}


def _child(system: str, workload_name: str, smoke: bool) -> None:
    workload = WORKLOADS[workload_name]
    gpu = not smoke
    if system == "torch":
        result = _torch_child(workload, smoke, gpu)
    else:
        import jax

        platforms = {d.platform for d in jax.devices()}
        if gpu and "gpu" not in platforms:
            raise SystemExit(f"JAX sees {sorted(platforms)}, no GPU; use --cpu-smoke on CPU.")
        if system == "jax-jit":
            result = _jit_child(workload, smoke, gpu)
        else:
            result = _fit_child(system, workload, smoke, gpu)
        result["device"] = jax.devices()[0].device_kind
    print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------------- parent


def _available(system: str) -> str | None:
    """None if ``system`` can run here, else why not."""
    import importlib.util

    needs = {"torch": ["torch"], "tf": ["tensorflow"]}.get(system, ["jax", "keras"])
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if system == "tf" and missing:
        return "not available on this machine (no TensorFlow in its image, no network)"
    return f"not installed: {', '.join(missing)}" if missing else None


def _run_child(system: str, workload: str, smoke: bool, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1",
               JAX_COMPILATION_CACHE_DIR=os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                                         "/tmp/stratax-jax-cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.workloads.gpu_bench", "--child", system, workload]
            + (["--cpu-smoke"] if smoke else []), env=env, capture_output=True, text=True,
            timeout=timeout, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return {"status": "failed", "reason": " | ".join(tail)[-400:]}
    out = json.loads(lines[0][len("RESULT "):])
    out.update(status="ok", process_s=time.perf_counter() - start)
    return out


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _table(results: dict[str, dict[str, list[dict[str, Any]]]], peak: float) -> str:
    lines = ["| workload | system | samples/s median (min-max) | x jax-jit | MFU (bf16 peak) | "
             "final loss | note |", "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for workload, by_system in results.items():
        jit_ok = [r for r in by_system.get("jax-jit", []) if r.get("status") == "ok"]
        flops = jit_ok[0].get("flops_per_step", 0.0) if jit_ok else 0.0
        jit_rate = statistics.median(r["samples_per_s"] for r in jit_ok) if jit_ok else None
        for system, runs in by_system.items():
            ok = [r for r in runs if r.get("status") == "ok"]
            if not ok:
                reason = runs[0].get("reason", "failed") if runs else "not run"
                lines.append(f"| {workload} | {LABELS[system]} | - | - | - | - | {reason} |")
                continue
            rates = [r["samples_per_s"] for r in ok]
            rate = statistics.median(rates)
            mfu = (f"{flops * rate / BATCH / (peak * 1e12) * 100:.2f}%"
                   if flops and peak else "-")
            ratio = f"{rate / jit_rate:.2f}" if jit_rate else "-"
            lines.append(f"| {workload} | {LABELS[system]} | {_fmt(rates)} | {ratio} | {mfu} | "
                         f"{statistics.median(r['final_loss'] for r in ok):.4f} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny sizes on CPU, one repetition: checks every code path")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workloads", default="resnet50")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--peak-tflops", type=float, default=790.0,
                        help="device bf16 dense peak for MFU (H200: ~790 per the device notes)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per process")
    parser.add_argument("--budget", type=float, default=400.0,
                        help="start no process after this many seconds (rows say so)")
    parser.add_argument("--recount", type=Path, default=None, metavar="RESULTS_JSON",
                        help="put CPU-lowered FLOPs per step into an existing results file")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recount:
        _recount(args.recount, args.workloads.split(","))
        return
    if args.child:
        _child(args.child[0], args.child[1], args.cpu_smoke)
        return
    smoke = args.cpu_smoke
    reps = 1 if smoke else args.reps
    workloads = ["mlp"] if smoke else args.workloads.split(",")
    systems = args.systems.split(",")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {s: [] for s in systems} for w in workloads}
    started = time.perf_counter()
    for rep in range(reps):  # rep-major: drift spreads over every system
        for workload in workloads:
            for system in systems:
                why = _available(system)
                if why:
                    if rep == 0:
                        results[workload][system].append({"status": "skipped", "reason": why})
                    continue
                if rep and not any(r.get("status") == "ok" for r in results[workload][system]):
                    continue  # failed once: do not repeat
                if time.perf_counter() - started > args.budget:
                    print(f"gpu_bench: time budget of {args.budget:.0f} s spent; rep {rep + 1} "
                          f"of {workload} {system} not run", flush=True)
                    continue
                out = _run_child(system, workload, smoke, args.timeout)
                print(f"gpu_bench: rep {rep + 1} {workload} {system}: "
                      f"{out.get('samples_per_s', out.get('reason'))}", flush=True)
                results[workload][system].append(out)
    peak = 0.0 if smoke else args.peak_tflops
    table = _table(results, peak)
    stem = "gpu_bench_smoke" if smoke else "gpu_bench"
    RESULTS.mkdir(exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": reps,
            "python": platform.python_version(), "batch": BATCH, "peak_tflops": peak,
            "smoke": smoke, "versions": _versions()}
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results},
                                                     indent=1))
    device = "CPU smoke test: sizes too small to mean anything" if smoke else "GPU"
    header = (f"One device ({device}), {reps} repetition(s), fresh process each; {meta['date']}; "
              f"versions {meta['versions']}.\n\n")
    (RESULTS / f"{stem}.md").write_text(header + table)
    print(header + table)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("jax", "jaxlib", "keras", "torch", "torchvision", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    main()
