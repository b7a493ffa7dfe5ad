#!/usr/bin/env bash
# Run pytest with other releases of some packages laid over .venv's: they are installed without
# their dependencies into .venvs/overlay-<name>/ and put first on PYTHONPATH, so imports and
# importlib.metadata (transformers' check of the kernels version) see them; all else is .venv's.
# Run `bash tools/test.sh` first (it creates .venv and stages the build into .hub-cache).
# CI runs it with the GPU machine's kernels 0.17.2 and the newest transformers that takes it,
# while tools/test.sh gets the newest releases requirements.txt admits.
#   bash tools/test_overlay.sh "kernels==0.17.2 transformers==5.24.0" [pytest args; default: tests]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPECS="${1:?usage: $0 \"PKG==VERSION ...\" [pytest args]}"
shift
read -r -a PKGS <<<"$SPECS"
PY="${FUSED_MLP_VENV:-$ROOT/.venv}/bin/python"
DIR="$ROOT/.venvs/overlay-$(echo "$SPECS" | tr -c 'A-Za-z0-9.\n' '_')"
if [ ! -x "$PY" ] || [ ! -d "$ROOT/.hub-cache" ]; then
  echo "[overlay] no .venv or .hub-cache: run bash tools/test.sh first" >&2
  exit 1
fi
if [ ! -f "$DIR/.complete" ]; then
  FIND_LINKS=()
  [ -d "$ROOT/.wheels" ] && FIND_LINKS=(--find-links "$ROOT/.wheels")
  rm -rf "$DIR"
  "$PY" -m pip install -q --no-cache-dir --no-deps "${FIND_LINKS[@]}" --target "$DIR" "${PKGS[@]}"
  touch "$DIR/.complete"
fi
export PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}"
"$PY" "$ROOT/tools/requirements_check.py" "${PKGS[@]}"  # the overlay is what was asked for
[ $# -gt 0 ] || set -- tests
KERNELS_CACHE="$ROOT/.hub-cache" HF_HUB_OFFLINE=1 exec "$PY" -m pytest -q "$@"
