"""The container recipes of ``examples/deploy/`` build, in principle (no docker here).

Each Dockerfile is read instruction by instruction: its base image's Python satisfies
``requires-python``; every ``COPY`` source exists in the build context (the repository root);
the files copied before ``pip install .`` are enough to build the project: they are copied
into an empty folder as the Dockerfile lays them out and a wheel is built from that folder
alone; the extra requirements the ``pip install`` line adds agree with ``pyproject.toml``; and
every program the manifests, the Slurm script and ``CMD`` run from the image is in it.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from render import DEPLOY, ROOT, manifests, pods_of

DOCKERFILES = sorted(DEPLOY.glob("Dockerfile*"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def image_files(path: Path, until_pip: bool = False) -> dict[str, Path]:
    """Image path -> context path of every file the COPY lines put in the image."""
    files: dict[str, Path] = {}
    workdir = "/"
    for word, args in instructions(path):
        if word == "WORKDIR":
            workdir = args if args.startswith("/") else f"{workdir.rstrip('/')}/{args}"
        elif word == "COPY":
            *sources, dest = shlex.split(args)
            assert not any(s.startswith("--") for s in sources), "flags are not checked here"
            target = posixpath.normpath(dest if dest.startswith("/")
                                        else f"{workdir.rstrip('/')}/{dest}")
            for source in sources:
                local = (ROOT / source).resolve()
                assert local.exists(), f"{path.name}: COPY {source}: not in the build context"
                assert local.is_relative_to(ROOT), f"{path.name}: COPY {source}: outside it"
                if local.is_dir():
                    for file in local.rglob("*"):
                        if file.is_file() and "__pycache__" not in file.parts:
                            rel = file.relative_to(local).as_posix()
                            files[f"{target.rstrip('/')}/{rel}"] = file
                else:
                    into = dest.endswith("/") or len(sources) > 1
                    files[f"{target.rstrip('/')}/{local.name}" if into else target] = local
        elif word == "RUN" and until_pip and "pip install" in args:
            break
    return files


def pip_install(path: Path) -> list[str]:
    (line,) = [args for word, args in instructions(path) if word == "RUN" and "pip install" in args]
    words = shlex.split(line)
    return words[words.index("install") + 1:]


def workdir(path: Path) -> str:
    (directory,) = [args for word, args in instructions(path) if word == "WORKDIR"]
    return directory


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_python_satisfies_requires_python(path: Path) -> None:
    (base,) = [args for word, args in instructions(path) if word == "FROM"]
    match = re.fullmatch(r"python:(\d+\.\d+)(-slim)?", base)
    assert match, f"{path.name}: base image {base!r} is not an official python image"
    assert Version(match.group(1)) in SpecifierSet(PYPROJECT["project"]["requires-python"])


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_pip_installs_this_project_with_pyprojects_ranges(path: Path) -> None:
    args = pip_install(path)
    assert args[0] == ".", f"{path.name} must install the copied project first: {args}"
    ours = {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in args[1:]:
        requirement = Requirement(extra)
        assert requirement.name in ours, f"{extra} is not a dependency of stratax"
        assert requirement.specifier == ours[requirement.name].specifier, (
            f"{path.name} pins {extra}, pyproject.toml says {ours[requirement.name]}")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_files_build_the_project(path: Path, tmp_path: Path) -> None:
    """Lays out what the Dockerfile copies before ``pip install .`` and builds a wheel from
    that alone (no network, no build isolation: the test environment's setuptools)."""
    root = workdir(path)
    context = tmp_path / "image"
    for image_path, source in image_files(path, until_pip=True).items():
        assert image_path.startswith(root + "/")
        target = context / image_path[len(root) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path / "wheel"), str(context)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("stratax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "stratax").rglob("*.py")}
    assert package_files <= names, sorted(package_files - names)[:5]
    assert {"stratax-keras-backend.pth", "_stratax_keras_backend.py",
            "stratax/_src/datasets/digits.npz"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "stratax = stratax._src.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def _programs() -> set[str]:
    """Files run from the image: manifests' commands, the Slurm script's srun line."""
    programs = {arg for path in manifests() for pod in pods_of(path) for arg in pod.argv
                if arg.endswith(".py")}
    sbatch = (DEPLOY / "slurm" / "train.sbatch").read_text()
    programs |= set(re.findall(r"srun [^\n]*?(\S+\.py)", sbatch))
    return programs


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_what_the_deployments_run_is_in_the_image(path: Path) -> None:
    files = image_files(path)
    root = workdir(path)
    programs = _programs()
    assert "examples/deploy/train.py" in programs
    (cmd,) = [args for word, args in instructions(path) if word == "CMD"]
    programs |= {a for a in shlex.split(cmd.strip("[]").replace(",", " ")) if a.endswith(".py")}
    for program in programs:
        assert f"{root}/{program}" in files, f"{path.name}: {program} is not in the image"
    # `stratax server` (the TFJob's ps and workers) is the console script pip installs.
    assert any(pod.argv[:2] == ["stratax", "server"] for p in manifests() for pod in pods_of(p))


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_the_user_it_creates(path: Path) -> None:
    steps = instructions(path)
    (user,) = [args for word, args in steps if word == "USER"]
    created = [i for i, (word, args) in enumerate(steps) if word == "RUN" and "useradd" in args
               and args.split()[-1] == user]
    assert created and created[0] < steps.index(("USER", user))
