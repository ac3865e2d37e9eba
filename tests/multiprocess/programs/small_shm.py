"""Runs a Python program with a 1 MiB /dev/shm of its own (a private mount namespace).

Usage: python small_shm.py PROGRAM [ARGS...]. Needs root (CAP_SYS_ADMIN); exits 77 when the
namespace or the mount cannot be made, so the test can skip.
"""

import ctypes
import os
import subprocess
import sys

CLONE_NEWNS = 0x00020000

libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(CLONE_NEWNS) != 0:
    print(f"unshare(CLONE_NEWNS) failed: {os.strerror(ctypes.get_errno())}", flush=True)
    sys.exit(77)
for command in (["mount", "--make-rprivate", "/"],
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"]):
    if subprocess.run(command, capture_output=True).returncode != 0:
        print(f"{' '.join(command)} failed", flush=True)
        sys.exit(77)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
