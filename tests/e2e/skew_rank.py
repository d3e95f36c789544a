"""One rank of a one-stage 1F1B job, through perseus's public API only, so that any version
of perseus runs it (tests/e2e/test_version_skew.py runs it with an earlier commit's
``perseus`` first on ``PYTHONPATH``).

Settings come from the ``PERSEUS_*`` variables (a saved profile, the fake GPU, a clock log).
It trains until ``argv[1]`` iterations ran under a plan or ``argv[2]`` seconds passed, then
prints ``planned=N failure=...`` and exits 0 (1 when it ran no planned iteration).
"""

from __future__ import annotations

import sys
import time

import perseus.client

ORDER = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]
INSTRUCTION_S = 0.002  # a little host time per instruction, as a training loop has


def main() -> int:
    wanted, limit_s = int(sys.argv[1]), float(sys.argv[2])
    rank = perseus.client.connect(install_signal_handlers=False)
    planned = 0
    deadline = time.monotonic() + limit_s
    try:
        while planned < wanted and time.monotonic() < deadline:
            with rank.iteration():
                for kind, microbatch in ORDER:
                    with rank.instruction(kind, microbatch):
                        time.sleep(INSTRUCTION_S)
            planned += rank.plan_version is not None
    finally:
        rank.close()
    print(f"planned={planned} failure={rank.failure}", flush=True)
    return 0 if planned else 1


if __name__ == "__main__":
    sys.exit(main())
