#!/usr/bin/env bash
# Developers' end check: run CI (`bash .ci/run`) and the demo (`bash tools/demo.sh`) the way a
# new user would, each in its own fresh clone of this checkout at REV (default HEAD), then
# delete the clone. Logs go to LOG_DIR (default /tmp/fused-mlp-check-logs) and outlive it.
# Each clone holds 2-7.5 GiB of venvs; in session 60 ten such clones left in /tmp filled the
# disk and CI's own `pip install torch` failed for want of space, hence the deletion.
#   bash tools/clean_clone_check.sh [REV] [ci|demo|both]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${1:-HEAD}"
WHAT="${2:-both}"
LOG_DIR="${LOG_DIR:-/tmp/fused-mlp-check-logs}"
mkdir -p "$LOG_DIR"
sha="$(git -C "$ROOT" rev-parse --short "$REV")"

CLONE=""
trap '[ -z "$CLONE" ] || rm -rf "$CLONE"' EXIT

run_in_clone() {  # name, command...
  local name="$1"; shift
  local log start rc
  CLONE="$(mktemp -d /tmp/fused-mlp-check.XXXXXX)"
  log="$LOG_DIR/${name}_${sha}.log"
  git clone -q "$ROOT" "$CLONE/fused-mlp"
  git -C "$CLONE/fused-mlp" checkout -q "$sha"
  start=$(date +%s)
  set +e
  (cd "$CLONE/fused-mlp" && "$@") >"$log" 2>&1
  rc=$?
  set -e
  rm -rf "$CLONE"
  CLONE=""
  echo "[check] $name at $sha: rc $rc in $(( $(date +%s) - start )) s; log $log"
  tail -n 3 "$log"
  return "$rc"
}

case "$WHAT" in
  ci|demo|both) ;;
  *) echo "usage: $0 [REV] [ci|demo|both]" >&2; exit 2 ;;
esac
status=0
if [ "$WHAT" != demo ]; then run_in_clone ci bash .ci/run || status=1; fi
if [ "$WHAT" != ci ]; then run_in_clone demo bash tools/demo.sh || status=1; fi
exit "$status"
