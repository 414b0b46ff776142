#!/usr/bin/env bash
# Create (or reuse) .venv and install ctrcal with its dev tools.
#
# torch is installed before the package so that pip never resolves a plain `torch`
# requirement on its own (that pulls a multi-GB CUDA build from the registry):
#   * a torch that is already importable in the venv is kept untouched (e.g. a CUDA build);
#   * otherwise the CPU build CTRCAL_TORCH_SPEC (default torch==2.13.0) is installed;
#   * the installed torch version is then pinned as a constraint, so no dependency can
#     upgrade it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${CTRCAL_TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.ctrcal-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "installing $TORCH_SPEC (CPU build) into $VENV" >&2
  "$VENV/bin/pip" install -q "$TORCH_SPEC"
fi
torch_version=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# A local version label (+cpu, +cu124) cannot be matched by '==X.Y.Z'; '==X.Y.Z.*' keeps it.
echo "torch==${torch_version}.*" > "$constraints"
"$VENV/bin/pip" install -q -c "$constraints" -e ".[dev]"
touch "$stamp"
