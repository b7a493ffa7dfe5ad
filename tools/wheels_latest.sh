#!/usr/bin/env bash
# Fill .wheels-latest/ (ignored) with the wheels that lay the newest transformers, kernels and
# huggingface_hub over the GPU machine's image (which has transformers 5.17 and no kernels): the
# three packages and the modules they import that the image lacks or has too old. A device call
# carries the folder and installs it `--no-deps` into a folder first on PYTHONPATH:
#   pip install -q --no-index --no-deps --target /tmp/site .wheels-latest/*.whl
#   export PYTHONPATH=/tmp/site
# Versions: the pins below, or FUSED_MLP_WHEELS_PINS="transformers==X kernels==Y ...".
# The destination's old wheels are replaced only once every wanted wheel was downloaded.
# Needs network; the wheels are for this machine's Python (3.11, the device's too).
#   bash tools/wheels_latest.sh [destination; default .wheels-latest]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.wheels-latest}"
read -r -a PINS <<<"${FUSED_MLP_WHEELS_PINS:-transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1}"
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
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
for name in $KEEP; do
  cp "$TMP/$name"-[0-9]*.whl "$DEST/"
done
echo "[wheels_latest] $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST:"
ls "$DEST"
