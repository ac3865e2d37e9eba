"""Interpreters for the systems, the TensorFlow virtual environment, versions and machine facts.

TensorFlow and PyTorch are peers, not dependencies of stratax: the harness installs each into
its own virtual environment under ``benchmarks/.venvs/`` once and reuses it (a marker file records
what was installed). Keras-on-JAX and stratax run in the project's own interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import venv
from pathlib import Path

from benchmarks import VENV_DIR
from benchmarks.harness.configs import Device

# ``tensorflow`` (not ``tensorflow-cpu``) because ``tf-keras`` depends on it by that name;
# tf-keras (Keras 2) is what TF's multi-worker guide needs: Keras 3 cannot fit under
# MultiWorkerMirroredStrategy (keras-team/keras#20585).
TF_REQUIREMENTS = {"cpu": ("tensorflow>=2.16,<3", "tf-keras"),
                   "gpu": ("tensorflow[and-cuda]>=2.16,<3", "tf-keras")}
# The CPU build of PyTorch (~190 MB; PyPI's default wheel needs ~5 GB of CUDA libraries).
TORCH_REQUIREMENTS = ("torch==2.13.0+cpu", "numpy")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INSTALL_TIMEOUT_S = 1800
# What the parent process imports beyond stratax's own dependencies (numpy, which it also
# uses, is one of those), with the pip name that provides it; declared in the benchmarks' own
# benchmarks/pyproject.toml: ``python -m pip install -e . -e ./benchmarks``.
HARNESS_MODULES = {"matplotlib": "matplotlib"}
VERSION_PACKAGES = ("stratax", "jax", "jaxlib", "keras", "numpy", "tensorflow", "tf-keras", "torch",
                    "ml_dtypes", "optree", "protobuf", "h5py", "matplotlib", "jax-cuda12-plugin")
THREAD_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "TF_ENABLE_ONEDNN_OPTS",
              "XLA_FLAGS", "JAX_PLATFORMS")


@dataclasses.dataclass
class Interpreter:
    """A Python able to run a family of systems, or the reason there is none."""

    python: str | None
    reason: str = ""


def missing_harness_modules() -> list[str]:
    """The pip names of the harness's own dependencies this interpreter lacks (empty: none).

    Checked before any run, so a missing plotting library stops the harness at its start
    rather than after every configuration has run.
    """
    return [pip for module, pip in HARNESS_MODULES.items()
            if importlib.util.find_spec(module) is None]


def project_interpreter() -> Interpreter:
    """The project's own interpreter (runs Keras-on-JAX and stratax)."""
    return Interpreter(sys.executable)


def _venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def tf_interpreter(device: Device, install: bool = True, say=print) -> Interpreter:
    """Return the TF virtual environment's interpreter, creating it once if ``install``.

    Args:
        device: "cpu" installs ``tensorflow``, "gpu" installs ``tensorflow[and-cuda]`` (both
            with ``tf-keras``).
        install: when False (dry run), only report whether it exists.
        say: progress printer (creating the environment takes minutes).
    """
    return _peer_interpreter(f"tf-{device}", TF_REQUIREMENTS[device], "tensorflow, tf_keras",
                             install, say)


def torch_interpreter(device: Device, install: bool = True, say=print) -> Interpreter:
    """Return the PyTorch virtual environment's interpreter (CPU wheel), creating it once.

    PyPI's default ``torch`` wheel pulls gigabytes of CUDA libraries; the CPU build comes from
    a local wheel directory when pip is configured with one (``find-links``), else from
    PyTorch's CPU index. GPU rows use the GPU machine's own torch (``benchmarks/gpu.sh``).
    """
    if device != "cpu":
        return Interpreter(None, "the PyTorch peer rows run on CPU here; on the GPU machine "
                                 "benchmarks/gpu.sh uses its installed torch")
    return _peer_interpreter("torch-cpu", TORCH_REQUIREMENTS, "torch", install, say,
                             fallback_index=TORCH_CPU_INDEX)


def _peer_interpreter(name: str, requirements: tuple[str, ...], imports: str, install: bool,
                      say, fallback_index: str | None = None) -> Interpreter:
    """A virtual environment under ``VENV_DIR/name`` with ``requirements``, created once."""
    root = VENV_DIR / name
    marker = root / ".bench-ready"
    requirement = " ".join(requirements)
    python = _venv_python(root)
    if marker.exists() and marker.read_text().strip() == requirement and python.exists():
        return Interpreter(str(python))
    if not install:
        return Interpreter(None, f"{root} not created yet (the harness creates it on `run`)")
    log = VENV_DIR / f"{name}-install.log"
    VENV_DIR.mkdir(parents=True, exist_ok=True)
    say(f"[env] creating {root} and installing {requirement!r} (once; takes minutes; log: {log})")
    pip = [str(python), "-m", "pip", "install", *requirements]
    try:
        # A stale environment (other requirements) is rebuilt from scratch.
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        with open(log, "ab") as fh:
            done = subprocess.run(pip, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=INSTALL_TIMEOUT_S, check=fallback_index is None)
            if done.returncode:
                subprocess.run([*pip, "--extra-index-url", fallback_index], stdout=fh,
                               stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=True)
            subprocess.run([str(python), "-c", f"import {imports}"], stdout=fh,
                           stderr=subprocess.STDOUT, timeout=300, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        tail = ""
        if log.exists():
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            tail = lines[-1][:200] if lines else ""
        return Interpreter(None, f"pip install {requirement} failed ({type(exc).__name__}): {tail}")
    marker.write_text(requirement + "\n")
    say(f"[env] {root} ready")
    return Interpreter(str(python))


def package_versions(python: str) -> dict[str, str]:
    """Installed versions of the packages that matter, as seen by ``python``."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {'python': sys.version.split()[0]}\n"
            f"for name in {list(VERSION_PACKAGES)!r}:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))\n")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                              check=True)
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def machine_info() -> dict[str, object]:
    """Cores, CPU model, memory, kernel and the thread-related environment of this machine."""
    model, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags.split()]
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_simd": simd,
        "mem_total_gib": mem_gib,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
    }
