#!/usr/bin/env bash
# The Megatron tests (tests/e2e/test_megatron.py) under Python 3.12 with megatron-core 0.19, in a
# venv of their own (removed at exit); .ci/run covers Python 3.11 with megatron-core 0.16.
# PyPI's torch for Python 3.12 is the CUDA build: torch and its nvidia-* wheels are about 4.7 GB
# installed; this script took 10 min 17 s on the (loaded, 2-core) development machine with pip's
# cache warm, 25 s of it the tests (-m "not slow"). .ci/run calls it with one end-to-end run;
# by hand:
#
#     bash .ci/megatron-py312.sh          # PYTHON312=/path/to/python3.12 to pick the interpreter
set -euo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

python=${PYTHON312:-}
if [ -z "$python" ]; then
    # pyenv's shim exists even where 3.12 is not the active version: try each one
    for candidate in python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null
        then
            python=$candidate
            break
        fi
    done
fi
if [ -z "$python" ]; then
    echo ".ci/megatron-py312.sh: no python3.12 (set PYTHON312=...)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip install --quiet --upgrade pip
pip install --quiet -e '.[server,megatron]' 'torch==2.13.0' 'megatron-core>=0.19,<0.20' \
    'pytest>=8' 'hypothesis>=6.100'
python -c 'import megatron.core, sys; print("python", sys.version.split()[0], "megatron-core", megatron.core.__version__)'
PYTHONWARNINGS=ignore python -m pytest tests/e2e/test_megatron.py "$@"
