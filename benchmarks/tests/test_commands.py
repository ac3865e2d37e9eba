"""Every ``python -m benchmarks.<module>`` command written in the pages, the summaries, the raw
results and the benchmarks' own code names a module that exists (the benchmarks moved into
subfolders once; a page that still names an old path would send a reader to nothing)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python3? -m (benchmarks(?:\.\w+)*)")


def _texts() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "ARCHITECTURE.md",
             *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").glob("*.md"),
             *(ROOT / "benchmarks" / "summaries").glob("*.md"),
             *(ROOT / "benchmarks" / "results").glob("*.md"),
             *(ROOT / "benchmarks").glob("*.sh")]
    code = [p for p in (ROOT / "benchmarks").rglob("*.py")
            if ".venvs" not in p.parts and "tests" not in p.parts]
    return pages + code


def test_every_benchmark_command_names_a_module_that_exists():
    commands, missing = 0, []
    for path in _texts():
        for module in COMMAND.findall(path.read_text()):
            commands += 1
            if importlib.util.find_spec(module) is None:
                missing.append(f"{path.relative_to(ROOT)}: python -m {module}")
    assert commands > 100  # the scan reads the pages
    assert not missing, missing


def test_a_command_naming_a_moved_module_is_caught():
    assert COMMAND.findall("run `python -m benchmarks.ps --reps 3`") == ["benchmarks.ps"]
    assert importlib.util.find_spec("benchmarks.ps") is None
