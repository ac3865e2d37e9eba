"""The PyTorch peer of a benchmark repetition: the same MLP, data, weights and timing rule.

Runs inside the PyTorch virtual environment (``benchmarks/.venvs/torch-cpu``), called by
``benchmarks.harness.child`` for the ``torch`` family. PyTorch's ``DistributedDataParallel`` over
gloo is what users know for multi-process data parallelism on CPU; it buckets gradients (25 MiB by
default) and overlaps their all-reduce with the backward pass, the two things issue 12 asks of
stratax. The step is eager: ``steps_per_execution`` does not apply, so a row for spe 1 and one
for spe 32 run the same program.

Matched to the Keras children: weights from ``workloads.initial_weights`` (Keras' kernel layout
transposed to ``nn.Linear``'s), zero biases, Adam(1e-3, epsilon 1e-7 as Keras), mean cross
entropy over the global batch (DDP averages the per-process means, equal for equal shards),
no shuffling, one warm-up epoch then the timed epochs, throughput over the timed window.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import time
from typing import Any

import numpy as np

from benchmarks.harness.configs import GLOBAL_BATCH, SYSTEMS, WARMUP_EPOCHS, WORKLOADS
from benchmarks.harness.timing import timed_result
from benchmarks.workloads.models import initial_weights

HIDDEN = {"mlp": (128,), "wide_mlp": (1024, 1024)}


def _model(torch: Any, workload: str) -> tuple[Any, float]:
    """The workload's MLP with the harness's initial weights, and their checksum."""
    if workload not in HIDDEN:
        raise ValueError(f"The PyTorch peer has no {workload!r} model; it runs "
                         f"{', '.join(HIDDEN)} (the multiworker benchmark's workloads).")
    nn = torch.nn
    dims = (int(np.prod(WORKLOADS[workload].input_shape)), *HIDDEN[workload],
            WORKLOADS[workload].num_classes)
    linears = [nn.Linear(a, b) for a, b in itertools.pairwise(dims)]
    shapes = [shape for a, b in itertools.pairwise(dims) for shape in ((a, b), (b,))]
    weights = initial_weights(shapes, [np.zeros(s, np.float32) for s in shapes])
    with torch.no_grad():
        for layer, kernel, bias in zip(linears, weights[::2], weights[1::2], strict=True):
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            layer.bias.copy_(torch.from_numpy(bias))
    stack: list[Any] = []
    for layer in linears:
        stack += [layer, nn.ReLU()]
    checksum = float(sum(float(np.abs(w).sum()) for w in weights))
    return nn.Sequential(*stack[:-1]), checksum


def train(spec: dict[str, Any]) -> dict[str, Any]:
    """One repetition of a ``torch`` system; returns ``benchmarks.harness.child``'s result
    fields."""
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist

    system = SYSTEMS[spec["system"]]
    steps_per_epoch, timed_epochs = spec["steps_per_epoch"], spec["timed_epochs"]
    torch.manual_seed(0)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    processes, rank = system.processes, spec["task_index"]
    if processes > 1:
        chief = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0]
        dist.init_process_group("gloo", init_method=f"tcp://{chief}", rank=rank,
                                world_size=processes, timeout=datetime.timedelta(seconds=120))
    t_import = time.perf_counter()
    model, checksum = _model(torch, spec["workload"])
    if processes > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(np.load(spec["x_path"]).reshape(-1, 784))  # both MLPs read 784 inputs
    y = torch.from_numpy(np.load(spec["y_path"]).astype(np.int64))
    local = GLOBAL_BATCH // processes
    begins, ends, losses, first_done = [], [], [], None
    t_fit = time.perf_counter()
    for _ in range(WARMUP_EPOCHS + timed_epochs):
        begins.append(time.perf_counter())
        total = torch.zeros(())
        for step in range(steps_per_epoch):
            lo = step * GLOBAL_BATCH + rank * local
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[lo:lo + local]), y[lo:lo + local])
            loss.backward()
            optimizer.step()
            total += loss.detach()
            if first_done is None:
                first_done = time.perf_counter()
        if processes > 1:  # the epoch's loss over the global batches, as Keras reports it
            dist.all_reduce(total)
            total /= processes
        losses.append(float(total) / steps_per_epoch)
        ends.append(time.perf_counter())
    t_done = time.perf_counter()
    if processes > 1:
        dist.destroy_process_group()
    return {
        **timed_result(begins, ends, (t_fit, first_done, t_done), steps_per_epoch, timed_epochs),
        "losses": losses,
        "final_loss": losses[-1],
        "init_checksum": checksum,
        "import_s": t_import - t0,
        "build_s": t_fit - t_import,
        "replicas": processes,
        "devices": [f"cpu (process {rank} of {processes})"],
        "versions": {"torch": torch.__version__, "numpy": np.__version__},
    }
