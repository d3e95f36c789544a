"""``python -m perseus.cli``: the same as ``perseus``."""

from __future__ import annotations

import sys

from perseus.cli import main

if __name__ == "__main__":
    sys.exit(main())
