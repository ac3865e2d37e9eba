"""Compiling the shared-memory all-reduce (``csrc/shm_allreduce.cc``) on first use.

Like ``torch.utils.cpp_extension.load``: the C++ source ships in the package and is compiled
with the system compiler (``$CXX``, else ``g++``/``c++``) against the XLA FFI headers that jaxlib
ships (``jax.ffi.include_dir()``) into a cache directory keyed by the source's hash and the
jaxlib version, so a rebuild happens only when either changes. One process per machine builds:
the others wait on a file lock beside the library and then load what it built. The library is
compiled into a private temporary file and renamed into place (atomic), so no process ever
loads a half-written library. Every way the build can fail (no compiler, a cache directory that
cannot be written, a compiler error, a lock held too long) is an :class:`ExtensionBuildError`,
which ``shm_collectives.setup`` turns into gloo (``auto``) or an error (``shm``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from stratax._src.core import env
from stratax._src.core.config import config

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "shm_allreduce.cc"
# What a build takes, for the message users see while it runs: 6-9 s with g++ 12 -O3 on the
# shared 2-core test machine, about 3 s of it CPU (`STRATAX_EXTENSION_CACHE=$(mktemp -d)
# python -c "from stratax._src.runtime import shm_build; shm_build.library_path()"`).
TYPICAL_BUILD_SECONDS = 6
COMPILE_TIMEOUT_SECONDS = 300.0
# A process that finds another building waits this long for it before giving up (the lock is
# released when the builder exits, so only a builder that hangs can hold it this long).
LOCK_TIMEOUT_SECONDS = COMPILE_TIMEOUT_SECONDS + 60.0


class ExtensionBuildError(RuntimeError):
    """The shared-memory all-reduce library could not be built or cached.

    The first line of the message says why in one line (``shm_collectives`` logs it when it
    falls back to gloo); further lines, if any, quote the compiler.
    """


def cache_dir() -> Path:
    """Option ``extension_cache`` (``STRATAX_EXTENSION_CACHE``), else
    ``$XDG_CACHE_HOME/stratax/ext`` (``~/.cache``)."""
    explicit = config.extension_cache
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


def library_file() -> Path:
    """Where the library for this source and this jaxlib is cached (it may not exist yet)."""
    import jaxlib

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return cache_dir() / f"shm_allreduce-{digest}-jaxlib{jaxlib.__version__}.so"


def library_path(lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> Path:
    """The compiled library, built now (once per machine) if the cache has none for this
    source and jaxlib.

    Args:
        lock_timeout: seconds to wait for another process that is building the same library.

    Raises:
        ExtensionBuildError: no C++ compiler, the cache directory cannot be written, compiling
            failed (the message quotes the compiler), or another process held the build lock
            for longer than ``lock_timeout``.
    """
    target = library_file()
    if target.exists():
        return target
    cxx = compiler()
    if cxx is None:
        raise ExtensionBuildError(
            "no C++ compiler to build it once (none found: set CXX, or install g++, e.g. "
            "`apt-get install g++`)")
    with _build_lock(target, lock_timeout):
        if not target.exists():  # else another process built it while this one waited
            _compile(cxx, target)
    return target


def _unwritable(directory: Path, error: OSError) -> ExtensionBuildError:
    return ExtensionBuildError(
        f"cannot write its cache directory {directory} ({error.strerror or error}); set "
        f"{env.STRATAX_EXTENSION_CACHE} to a writable directory")


@contextlib.contextmanager
def _build_lock(target: Path, timeout: float) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``<target>.lock`` (created in the cache directory).

    The kernel releases the lock when its holder exits, even on ``kill -9``, so a lock file left
    behind never blocks a later build. The holder writes its pid into the file, for the error
    of a process that waited too long.
    """
    import fcntl  # POSIX only: shm_collectives checks for Linux before building

    lock = target.with_suffix(".lock")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _unwritable(target.parent, error) from error
    try:
        deadline = time.monotonic() + timeout
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    raise ExtensionBuildError(
                        f"process {holder} has been building the library for more than "
                        f"{timeout:g} s (it holds {lock}); check that process, or set "
                        f"{env.STRATAX_EXTENSION_CACHE} to another directory") from None
                if not waiting:
                    logger.info("waiting for process %s, which builds the shared-memory "
                                "all-reduce (lock %s)", holder, lock)
                    waiting = True
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _compile(cxx: str, target: Path) -> None:
    """Compiles :data:`SOURCE` with ``cxx`` into ``target`` (via a temporary file, renamed)."""
    import jax

    try:
        fd, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
    except OSError as error:
        raise _unwritable(target.parent, error) from error
    os.close(fd)
    command = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
               f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", temporary, "-lrt"]
    # At the default log level too: the first multi-process job on a machine pauses here.
    logger.warning("building the shared-memory all-reduce (one time, ~%d s) into %s",
                   TYPICAL_BUILD_SECONDS, target.parent)
    logger.debug("compiling: %s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        os.unlink(temporary)
        raise ExtensionBuildError(f"running the compiler {cxx} failed: {error}") from error
    if done.returncode != 0:
        os.unlink(temporary)
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        first_error = next((line for line in said if "error" in line), said[-1] if said else "")
        raise ExtensionBuildError(
            f"compiling {SOURCE.name} with {cxx} failed (exit {done.returncode})"
            + (f": {first_error}\n{done.stderr[-4000:]}" if said else ""))
    os.replace(temporary, target)
