"""Command line: ``python -m benchmarks run [--quick] [--only NAME] [--reps N] [--dry-run]``.

Also ``python -m benchmarks list`` to see the named benchmarks and their configurations.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import RESULTS_DIR
from benchmarks.harness.configs import BENCHMARKS, SYSTEMS, WORKLOADS, Mode
from benchmarks.harness.envs import missing_harness_modules, tf_interpreter, torch_interpreter
from benchmarks.harness.report import write_summary
from benchmarks.harness.suite import Suite, select, stratax_importable, validate

MIN_REPS = 3
INSTALL_HINT = "python -m pip install -e . -e ./benchmarks"


def _reps(text: str) -> int:
    value = int(text)
    if value < MIN_REPS:
        raise argparse.ArgumentTypeError(
            f"--reps {value}: need at least {MIN_REPS} repetitions for a median with min/max; "
            f"use --reps {MIN_REPS} or more (--quick shortens runs, not repetitions).")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run benchmarks and write benchmarks/results/")
    run.add_argument("--quick", action="store_true", help="short runs (still >= 3 reps)")
    run.add_argument("--only", action="append", metavar="NAME",
                     help=f"benchmark(s) to run, repeatable or comma-separated: "
                          f"{', '.join(BENCHMARKS)}")
    run.add_argument("--reps", type=_reps, default=MIN_REPS, help="repetitions (default 3)")
    run.add_argument("--dry-run", action="store_true",
                     help="validate the plan and show it; start nothing, install nothing")
    sub.add_parser("list", help="list benchmarks, systems and workloads")
    return parser


def _list() -> int:
    for b in BENCHMARKS.values():
        tag = "" if b.default else " (not in the default set)"
        print(f"{b.name}{tag}: {b.title}; device {b.device}; baseline {b.baseline}")
        print(f"    systems: {', '.join(b.systems)}")
        print(f"    workloads: {', '.join(b.workloads)}; steps_per_execution: {b.spes}")
    print("\nsystems:")
    for s in SYSTEMS.values():
        print(f"  {s.name:18} {s.label}")
    print("\nworkloads:")
    for w in WORKLOADS.values():
        print(f"  {w.name:10} {w.title}; (steps/epoch, timed epochs) full {w.full}, "
              f"quick {w.quick}")
    return 0


def _missing_deps_problem() -> list[str]:
    missing = missing_harness_modules()
    if not missing:
        return []
    return [f"the harness needs {', '.join(missing)} (not importable by {sys.executable}); "
            f"install its dependencies from the repository root: {INSTALL_HINT}"]


def _dry_run(names: list[str] | None, mode: Mode, reps: int) -> int:
    benches = select(names)
    problems = validate(benches, mode) + _missing_deps_problem()
    seen: set[str] = set()
    runs = 0
    for b in benches:
        new = [c for c in b.configs(mode) if c.key not in seen]
        seen.update(c.key for c in new)
        runs += len(new) * reps
        print(f"{b.name}: {len(b.configs(mode))} configurations ({len(new)} new), "
              f"baseline {b.baseline}, device {b.device}")
        for c in new:
            print(f"    {c.key}")
        for env, name, find in (("tf", "TF", tf_interpreter), ("torch", "PyTorch",
                                                                  torch_interpreter)):
            if any(SYSTEMS[s].env == env for s in b.systems):
                peer = find(b.device, install=False)
                print(f"    {name} interpreter: {peer.python or peer.reason}")
    print(f"stratax importable in this interpreter: {stratax_importable()}")
    print(f"plan: {len(seen)} configurations, {runs} child runs ({reps} reps, {mode} mode)")
    for p in problems:
        print(f"PROBLEM: {p}")
    print("dry run: OK" if not problems else f"dry run: {len(problems)} problem(s)")
    return 0 if not problems else 1


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        return _list()
    names = [n.strip() for item in (args.only or []) for n in item.split(",") if n.strip()]
    mode: Mode = "quick" if args.quick else "full"
    try:
        benches = select(names or None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(names or None, mode, args.reps)
    problems = validate(benches, mode) + _missing_deps_problem()
    if problems:
        print("error: invalid plan:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    started = time.monotonic()
    suite = Suite(mode=mode, reps=args.reps, say=lambda s: print(s, flush=True),
                  results_dir=RESULTS_DIR)
    for bench in benches:
        suite.run_benchmark(bench)
    summary = write_summary(suite.results_dir, list(BENCHMARKS))
    failed = sum(o.status != "ok" for o in suite.done.values())
    print(f"\nDone in {(time.monotonic() - started) / 60:.1f} min: {len(suite.done)} "
          f"configurations, {failed} failed or not installed. Results in {RESULTS_DIR}/ "
          f"(all tables: {summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
