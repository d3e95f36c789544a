"""``python -m perseus.server``: the same as ``perseus serve`` (:mod:`perseus.cli.serve`).

A program, not a module the server imports: it sits with ``perseus`` at the top of the import
graph, so naming the command line here adds no arrow from the server to it.
"""

from __future__ import annotations

import sys

from perseus.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
