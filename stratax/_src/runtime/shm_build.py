"""Compiling the shared-memory all-reduce (``csrc/shm_allreduce.cc``) on first use.

Like ``torch.utils.cpp_extension.load``: the C++ source ships in the package and is compiled
with the system compiler (``$CXX``, else ``g++``/``c++``) against the XLA FFI headers that jaxlib
ships (``jax.ffi.include_dir()``) into a cache directory keyed by the source's hash and the
jaxlib version, so a rebuild happens only when either changes. Concurrent processes build into
a private temporary file and rename it into place (atomic), so two workers starting together
never load a half-written library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from stratax._src.core import env

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "shm_allreduce.cc"


class ExtensionBuildError(RuntimeError):
    """The shared-memory all-reduce library could not be compiled (no compiler, or it failed)."""


def cache_dir() -> Path:
    """``STRATAX_EXTENSION_CACHE``, else ``$XDG_CACHE_HOME/stratax/ext`` (``~/.cache``)."""
    explicit = os.environ.get(env.STRATAX_EXTENSION_CACHE)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stratax" / "ext"


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX`` if set, else ``g++`` or ``c++`` on ``PATH``."""
    explicit = os.environ.get("CXX")
    if explicit:
        return explicit
    return shutil.which("g++") or shutil.which("c++")


def library_path() -> Path:
    """The compiled library, built now if the cache has none for this source and jaxlib.

    Raises:
        ExtensionBuildError: no C++ compiler, or compiling failed (the message quotes it).
    """
    import jax
    import jaxlib

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = cache_dir() / f"shm_allreduce-{digest}-jaxlib{jaxlib.__version__}.so"
    if target.exists():
        return target
    cxx = compiler()
    if cxx is None:
        raise ExtensionBuildError(
            "STRATAX_CPU_COLLECTIVES=shm needs a C++ compiler to build its shared-memory "
            "all-reduce once (none found: set CXX or install g++, e.g. `apt-get install g++`), "
            "or unset STRATAX_CPU_COLLECTIVES to use gloo.")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
               f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", temporary, "-lrt"]
    logger.info("building the shared-memory all-reduce: %s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        os.unlink(temporary)
        raise ExtensionBuildError(f"Running {cxx} failed: {error}") from error
    if done.returncode != 0:
        os.unlink(temporary)
        raise ExtensionBuildError(
            f"Compiling {SOURCE.name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}\n"
            "Unset STRATAX_CPU_COLLECTIVES to use gloo.")
    os.replace(temporary, target)
    return target
