"""Plan, validate and run a set of named benchmarks, then write their reports.

Repetitions run rep-major inside a benchmark (repetition 1 of every configuration, then
repetition 2, ...), so slow drift of the machine spreads over all systems instead of biasing
one. A configuration shared by two benchmarks (``mirrored`` and ``mlp``) runs once per
invocation and appears in both tables. A configuration that fails stops repeating and is
reported as failed with its reason; nothing is ever filled in.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import CACHE_DIR, RESULTS_DIR
from benchmarks.harness.configs import (
    BENCHMARKS,
    GLOBAL_BATCH,
    SYSTEMS,
    WORKLOADS,
    Benchmark,
    Config,
    Device,
    Mode,
)
from benchmarks.harness.envs import (
    Interpreter,
    machine_info,
    package_versions,
    project_interpreter,
    tf_interpreter,
    torch_interpreter,
)
from benchmarks.harness.report import write
from benchmarks.harness.runner import run_rep
from benchmarks.harness.stats import ConfigOutcome
from benchmarks.workloads.models import ensure_data

Say = Callable[[str], None]
_NOT_INSTALLED_PREFIX = "ModuleNotFoundError: No module named"


def select(only: list[str] | None) -> list[Benchmark]:
    """The benchmarks named in ``only`` (all default ones when empty), in definition order."""
    if not only:
        return [b for b in BENCHMARKS.values() if b.default]
    unknown = [n for n in only if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"Unknown benchmark(s) {unknown}; choose from {sorted(BENCHMARKS)}, "
                         "e.g. `python -m benchmarks run --only mirrored`.")
    return [b for b in BENCHMARKS.values() if b.name in only]


def validate(benches: list[Benchmark], mode: Mode) -> list[str]:
    """Return every problem of the plan (empty list: the plan is runnable as defined)."""
    problems = []
    for b in benches:
        for name in (b.baseline, *[s for pair in b.pairs for s in pair]):
            if name not in b.systems:
                problems.append(f"{b.name}: {name!r} (baseline or ratio pair) is not one of "
                                f"its systems {b.systems}")
        for c in b.configs(mode):
            system, workload = SYSTEMS.get(c.system), WORKLOADS.get(c.workload)
            if system is None or workload is None:
                problems.append(f"{b.name}: unknown system {c.system!r} or workload {c.workload!r}")
                continue
            per_epoch, timed = workload.steps(mode, c.spe)
            if per_epoch % c.spe:
                problems.append(f"{c.key}: steps per epoch {per_epoch} is not a multiple of "
                                f"steps_per_execution {c.spe}")
            if timed < 1:
                problems.append(f"{c.key}: needs at least one timed epoch, got {timed}")
            if GLOBAL_BATCH % system.replicas:
                problems.append(f"{c.key}: global batch {GLOBAL_BATCH} does not split over "
                                f"{system.replicas} replicas")
            if system.pin and system.processes > len(os.sched_getaffinity(0)):
                problems.append(f"{c.key}: pins {system.processes} processes to one core each "
                                f"but only {len(os.sched_getaffinity(0))} cores are usable")
    return problems


@dataclasses.dataclass
class Suite:
    """One invocation: its mode, repetitions, interpreters and finished outcomes."""

    mode: Mode
    reps: int
    say: Say = print
    results_dir: Path = RESULTS_DIR
    done: dict[str, ConfigOutcome] = dataclasses.field(default_factory=dict)
    interpreters: dict[tuple[str, Device], Interpreter] = dataclasses.field(default_factory=dict)
    versions: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def interpreter(self, family_env: str, device: Device) -> Interpreter:
        """Interpreter for "tf", "torch" or "project" on ``device``, created on first use."""
        key = (family_env, device)
        if key not in self.interpreters:
            if family_env == "tf":
                self.interpreters[key] = tf_interpreter(device, install=True, say=self.say)
            elif family_env == "torch":
                self.interpreters[key] = torch_interpreter(device, install=True, say=self.say)
            else:
                self.interpreters[key] = project_interpreter()
            python = self.interpreters[key].python
            if python:
                self.versions[f"{family_env}-{device}"] = package_versions(python)
        return self.interpreters[key]

    def run_benchmark(self, bench: Benchmark) -> list[ConfigOutcome]:
        """Run every not-yet-run configuration of ``bench`` and write its report."""
        configs = bench.configs(self.mode)
        pending = [c for c in configs if c.key not in self.done]
        self.say(f"\n== {bench.name}: {bench.title} ({len(pending)} new configurations x "
                 f"{self.reps} reps, {self.mode} mode)")
        partial: dict[str, ConfigOutcome] = {}
        for c in pending:
            partial[c.key] = self._start(c, bench)
        for rep in range(1, self.reps + 1):
            for c in pending:
                outcome = partial[c.key]
                if outcome.status != "ok":
                    continue
                self._rep(c, bench, outcome, rep)
        for c in pending:
            outcome = partial[c.key]
            if outcome.status == "ok" and not outcome.reps:
                outcome.status, outcome.reason = "failed", "no repetition ran"
            self.done[c.key] = outcome
        outcomes = [self.done[c.key] for c in configs]
        meta = {"mode": self.mode, "reps": self.reps, "device": bench.device,
                "global_batch": GLOBAL_BATCH, "machine": machine_info(),
                "versions_per_env": self.versions, "versions_used": self._used(outcomes),
                "workloads": {w: dataclasses.asdict(WORKLOADS[w]) for w in bench.workloads}}
        paths = write(bench, outcomes, meta, self.results_dir)
        self.say(f"== {bench.name}: wrote {', '.join(str(p) for p in paths.values())}")
        return outcomes

    def _start(self, c: Config, bench: Benchmark) -> ConfigOutcome:
        outcome = ConfigOutcome(c.key, c.system, c.workload, c.spe, "ok", "", [])
        interp = self.interpreter(SYSTEMS[c.system].env, bench.device)
        if interp.python is None:
            outcome.status, outcome.reason = "not installed", interp.reason
        return outcome

    def _rep(self, c: Config, bench: Benchmark, outcome: ConfigOutcome, rep: int) -> None:
        python = self.interpreter(SYSTEMS[c.system].env, bench.device).python
        data = ensure_data(CACHE_DIR, WORKLOADS[c.workload], self.mode, c.spe)
        started = time.monotonic()
        got = run_rep(c, rep, self.mode, bench.device, str(python), data,
                      CACHE_DIR / "runs" / self.mode)
        took = time.monotonic() - started
        if got.ok:
            outcome.reps.append(got.data)
            self.say(f"  {c.key} rep {rep}/{self.reps}: {got.data['samples_per_s']:,.0f} "
                     f"samples/s, loss {got.data['final_loss']:.4f} ({took:.1f} s)")
            return
        missing = got.reason.startswith((_NOT_INSTALLED_PREFIX, "not installed:"))
        status = "not installed" if missing else "failed"
        ok_before = len(outcome.reps)
        outcome.status = status
        outcome.reason = got.reason if not ok_before else (
            f"{got.reason} (rep {rep}; {ok_before} earlier reps ok)")
        outcome.reps.append(got.data)
        self.say(f"  {c.key} rep {rep}/{self.reps}: {status}: {got.reason} ({took:.1f} s)")

    def _used(self, outcomes: list[ConfigOutcome]) -> dict[str, str]:
        """Framework versions the children reported (what actually ran)."""
        out: dict[str, str] = {}
        for o in outcomes:
            for r in o.reps:
                for name, version in (r.get("versions") or {}).items():
                    out.setdefault(name, version)
        return out


def stratax_importable() -> bool:
    """Whether the project interpreter can find the ``stratax`` package at all."""
    return importlib.util.find_spec("stratax") is not None
