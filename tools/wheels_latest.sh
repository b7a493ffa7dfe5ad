#!/usr/bin/env bash
# Fill .wheels-latest/ (ignored) with the wheels that lay the newest transformers, kernels and
# huggingface_hub over the GPU machine's image (which has transformers 5.17 and no kernels): the
# three packages and the modules they import that the image lacks or has too old. Pure-Python
# wheels go to .wheels-latest/any/, the compiled ones (kernels, regex) to one folder per Python
# (.wheels-latest/cp311/, cp312/): the device's images have differed (sessions 62-66: the H100
# image ran Python 3.11; session 75: the H200 image 3.12; session 76: the H100 image's python3,
# which runs torch and tools/gpu_session.sh, 3.12), and both sets with the build are over what a
# call carries. A device call carries any/ and its Python's folder and installs them `--no-deps`
# into a folder first on PYTHONPATH, the tag read from python3, the interpreter the tools run
# (where that folder was not carried, its glob stays unexpanded and pip installs nothing at all):
#   py=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels-latest/any/*.whl .wheels-latest/$py/*.whl
#   export PYTHONPATH=/tmp/site
# Versions: the pins below, or FUSED_MLP_WHEELS_PINS="transformers==X kernels==Y ...";
# Pythons: FUSED_MLP_WHEELS_PYTHONS (default "3.11 3.12").
# The destination's old wheels are replaced only once every wanted wheel was downloaded.
# Needs network.
#   bash tools/wheels_latest.sh [destination; default .wheels-latest]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.wheels-latest}"
read -r -a PINS <<<"${FUSED_MLP_WHEELS_PINS:-transformers==5.25.0 huggingface_hub==2.5.0 kernels==0.19.1}"
# What the image lacks or has too old: the pinned packages and the modules they need at the
# versions they ask for (huggingface_hub 2.x's HTTP stack and CLI among them). torch, numpy,
# safetensors, tokenizers, PyYAML, packaging, filelock, fsspec, tqdm, hf-xet come from the image.
KEEP="transformers kernels huggingface_hub httpx2 httpcore2 truststore click regex anyio idna h11
typing_extensions annotated_doc tomlkit"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# --only-binary: wheels only (the device has no network to build an sdist); PIP_CONSTRAINT is
# cleared so a constraint file set for this machine's venv does not hold the pins back.
PIP_CONSTRAINT=/dev/null python -m pip download -q --only-binary=:all: -d "$TMP" "${PINS[@]}"
for name in $KEEP; do
  found=("$TMP/$name"-[0-9]*.whl)
  if [ ! -e "${found[0]}" ]; then
    echo "[wheels_latest] no wheel for $name among the downloads; $DEST left as it was" >&2
    exit 1
  fi
done
# Pure-Python wheels to any/; the compiled ones again for each Python the device may run, at the
# versions just resolved.
read -r -a PYTHONS <<<"${FUSED_MLP_WHEELS_PYTHONS:-3.11 3.12}"
mkdir -p "$TMP/any"
compiled=()
for name in $KEEP; do
  for w in "$TMP/$name"-[0-9]*.whl; do
    case "$w" in
      *-none-any.whl) mv "$w" "$TMP/any/" ;;
      *) v="${w#"$TMP/$name"-}"; compiled+=("$name==${v%%-*}") ;;
    esac
  done
done
for py in "${PYTHONS[@]}"; do
  mkdir -p "$TMP/cp${py/./}"
  if [ ${#compiled[@]} -gt 0 ]; then
    PIP_CONSTRAINT=/dev/null python -m pip download -q --only-binary=:all: --no-deps \
      --python-version "$py" -d "$TMP/cp${py/./}" "${compiled[@]}"
  fi
done
mkdir -p "$DEST"
rm -rf "$DEST"/*.whl "$DEST"/any "$DEST"/cp3*
cp -r "$TMP/any" "$DEST/"
for py in "${PYTHONS[@]}"; do
  cp -r "$TMP/cp${py/./}" "$DEST/"
done
echo "[wheels_latest] $(find "$DEST" -name '*.whl' | wc -l) wheels in $DEST:"
du -sh "$DEST"/*
find "$DEST" -name '*.whl' | sort
