"""``python -m perseus.server``: the same as ``perseus serve``."""

from __future__ import annotations

import argparse

from perseus.server.cli import add_serve_arguments, run_serve


def main() -> int:
    parser = argparse.ArgumentParser(prog="perseus serve", description="Run the planner server.")
    add_serve_arguments(parser)
    return run_serve(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
