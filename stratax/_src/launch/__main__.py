"""``python -m stratax._src.launch [flags] program [args...]``: the launcher without the CLI."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from stratax._src.launch.arguments import build_parser, run_launch


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` (default: ``sys.argv[1:]``) and runs the launch; returns the exit code."""
    parser = build_parser(prog="python -m stratax._src.launch")
    return run_launch(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
