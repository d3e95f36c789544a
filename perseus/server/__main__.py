"""``python -m perseus.server``: the same as ``perseus serve``, started by
:mod:`perseus.server.startup` (the command line calls the same functions)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from perseus.server.startup import run_serve, serve_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``perseus serve``'s flags and run the server until interrupted.

    Returns:
        The exit status: 0 after a clean shutdown, 2 when it cannot start (one line says why).
    """
    args = serve_parser().parse_args(argv)
    try:
        return run_serve(args)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] == "perseus":
            raise
        print(
            f"python -m perseus.server: the planner server is not installed ({err}); "
            "pip install 'perseus-planner[server]' (from a checkout: pip install '.[server]')",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
