"""Command-line side of the dashboard: ``--dashboard`` flags and ``stratax dashboard RUN_DIR``.

``stratax launch`` and ``stratax train`` add the flags with :func:`add_dashboard_arguments` and
wrap their run in :func:`dashboard_from_args`; the ``dashboard`` sub-command serves a saved (or
live) run directory until interrupted. Standard library only: the CLI stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from stratax._src.observe.run_dir import default_run_dir
from stratax._src.observe.server import DashboardServer

EXIT_USAGE = 2
KEEP_SERVING_S = 10.0


def add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--dashboard``, ``--run-dir``, ``--dashboard-host`` and ``--dashboard-port``."""
    group = parser.add_argument_group("dashboard")
    group.add_argument("--dashboard", action="store_true",
                       help="serve a live web dashboard of the run (per-worker speed, loss, "
                            "all-reduce share, failures); prints its URL")
    group.add_argument("--run-dir", default=None, metavar="DIR",
                       help="where metrics and events of the run are kept (default with "
                            "--dashboard: stratax_runs/run-<time>); view it later with "
                            "`stratax dashboard DIR`")
    group.add_argument("--dashboard-host", default="127.0.0.1", metavar="HOST",
                       help="address the dashboard binds (default 127.0.0.1; any other "
                            "address requires a token, printed in the URL)")
    group.add_argument("--dashboard-port", type=int, default=0, metavar="PORT",
                       help="dashboard port (default: a free one)")
    group.add_argument("--keep-serving", type=float, default=KEEP_SERVING_S, metavar="SECONDS",
                       help="after the run, keep serving until an open page has shown how it "
                            f"ended, at most SECONDS (default {KEEP_SERVING_S:g}); "
                            "`stratax dashboard DIR` serves it again any time")


def run_dir_from_args(args: argparse.Namespace) -> Path | None:
    """The run directory the flags ask for: ``--run-dir``, a new one with ``--dashboard``, or
    ``None`` when neither is given."""
    if args.run_dir:
        return Path(args.run_dir)
    return default_run_dir() if args.dashboard else None


@contextlib.contextmanager
def dashboard_from_args(args: argparse.Namespace, prog: str) -> Iterator[Path | None]:
    """Yields the run directory (created) and, with ``--dashboard``, serves it meanwhile.

    Prints the URL (and at the end how to view the saved run) on stderr, prefixed by ``prog``.

    Raises:
        ValueError: a bad host or port, or the port cannot be bound (named in the message).
    """
    run_dir = run_dir_from_args(args)
    if run_dir is None:
        yield None
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    server = _start(run_dir, args.dashboard_host, args.dashboard_port) if args.dashboard else None
    if server is not None:
        _say(prog, f"dashboard: {server.url} (run directory {run_dir})")
    try:
        yield run_dir
    finally:
        if server is not None:
            server.serve_until_seen(args.keep_serving)
            server.close()
        _say(prog, f"run saved in {run_dir}; view it with: stratax dashboard {run_dir}")


def _start(run_dir: Path, host: str, port: int) -> DashboardServer:
    try:
        return DashboardServer(run_dir, host=host, port=port)
    except OSError as err:
        raise ValueError(f"Cannot serve the dashboard on {host}:{port} ({err}); pick another "
                         f"--dashboard-port, or 0 for a free one.") from None


def add_dashboard_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds ``stratax dashboard RUN_DIR`` to a sub-parser set."""
    parser = commands.add_parser(
        "dashboard", help="serve the dashboard of a run directory (live or saved)",
        description="Serve the web dashboard of a run directory written by `stratax launch "
                    "--dashboard`, `stratax train --dashboard` or sx.observe, until Ctrl-C.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; any other needs a token)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.set_defaults(handler=run_dashboard)


def run_dashboard(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """Serves ``args.run_dir`` until Ctrl-C (or ``stop`` is set); returns the exit code."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        _say("stratax dashboard", f"error: run directory {str(run_dir)!r} does not exist; pass "
                                  "the directory printed by `stratax launch --dashboard`.")
        return EXIT_USAGE
    try:
        server = _start(run_dir, args.host, args.port)
    except ValueError as err:
        _say("stratax dashboard", f"error: {err}")
        return EXIT_USAGE
    _say("stratax dashboard", f"serving {run_dir} at {server.url} (Ctrl-C to stop)")
    stop = stop or threading.Event()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _say(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
