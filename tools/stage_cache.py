#!/usr/bin/env python3
"""Stage build/ into a local Hub cache, as if `org/fused-mlp` had been downloaded.

After this, with HF_HUB_OFFLINE=1 (and KERNELS_CACHE pointing at the cache when it
is not the default one):

    from kernels import get_kernel
    fused_mlp = get_kernel("org/fused-mlp", version=1)

The layout is huggingface_hub's cache layout for a repo of type `kernel`:

    <cache>/kernels--org--fused-mlp/refs/v1                 -> <commit>
    <cache>/kernels--org--fused-mlp/snapshots/<commit>/build/<variant>/...

The commit is a hash of the staged files, so restaging the same build is a no-op.
Snapshots this script staged earlier that no ref points to any more are removed, so
that a cache restaged after every change does not grow by a build each time; a
snapshot huggingface_hub downloaded (its files are links into blobs/) is never touched.

Usage:
    python tools/stage_cache.py                       # cache from KERNELS_CACHE / HF_HUB_CACHE
    python tools/stage_cache.py --cache .hub-cache    # a cache of your own
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def default_cache() -> Path:
    env = os.environ.get("KERNELS_CACHE")
    if env:
        return Path(env)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def variant_dirs(build_dir: Path, only: list[str] | None) -> list[Path]:
    found = build_dir.iterdir() if build_dir.is_dir() else ()  # no build/ at all: the message below
    dirs = sorted(d for d in found if d.is_dir() and (d / "metadata.json").exists())
    if only:
        missing = set(only) - {d.name for d in dirs}
        if missing:
            raise SystemExit(f"[stage] not built: {sorted(missing)} (in {build_dir})")
        dirs = [d for d in dirs if d.name in only]
    if not dirs:
        raise SystemExit(f"[stage] no built variant in {build_dir}: run tools/build_variant.py first")
    return dirs


def snapshot_commit(dirs: list[Path]) -> str:
    h = hashlib.sha1()
    for d in dirs:
        for f in sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(f"{d.name}/{f.relative_to(d)}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def stage(build_dir: Path, cache: Path, repo_id: str, version: int, only: list[str] | None) -> Path:
    dirs = variant_dirs(build_dir, only)
    commit = snapshot_commit(dirs)
    org, name = repo_id.split("/")
    repo_dir = cache / f"kernels--{org}--{name}"
    snap = repo_dir / "snapshots" / commit
    if snap.exists():
        shutil.rmtree(snap)
    for d in dirs:
        shutil.copytree(d, snap / "build" / d.name, ignore=shutil.ignore_patterns("__pycache__"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / f"v{version}").write_text(commit)
    print(f"[stage] {repo_id} v{version} -> {snap} ({', '.join(d.name for d in dirs)})")
    prune(repo_dir)
    return snap


def prune(repo_dir: Path) -> None:
    """Remove the snapshots of repo_dir that no ref names and that hold no links (so were
    copied here by stage(), not downloaded)."""
    kept = {r.read_text().strip() for r in (repo_dir / "refs").rglob("*") if r.is_file()}
    removed = 0
    for snap in (repo_dir / "snapshots").iterdir():
        if snap.name in kept or not snap.is_dir() or any(p.is_symlink() for p in snap.rglob("*")):
            continue
        shutil.rmtree(snap)
        removed += 1
    if removed:
        print(f"[stage] removed {removed} superseded snapshot(s) of {repo_dir.name}")


def main() -> None:
    with open(ROOT / "build.toml", "rb") as f:
        conf = tomllib.load(f)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", type=Path, default=ROOT / "build")
    p.add_argument("--cache", type=Path, default=None, help="default: KERNELS_CACHE, else HF_HUB_CACHE")
    p.add_argument("--repo-id", default=conf["general"]["hub"]["repo-id"])
    p.add_argument("--variant", action="append", help="stage only these variants (repeatable)")
    a = p.parse_args()
    stage(a.build_dir, (a.cache or default_cache()).resolve(), a.repo_id, conf["general"]["version"], a.variant)


if __name__ == "__main__":
    main()
