#!/usr/bin/env python3
"""Publish the built variants of fused-mlp to the Hugging Face Kernel Hub.

What it does (huggingface_hub >= 2, which knows repositories of type ``kernel``):

1. creates the kernel repository (``[general.hub] repo-id`` of build.toml, or ``--repo-id``)
   when it does not exist yet;
2. creates the branch ``v{version}`` (``[general] version`` of build.toml) when needed;
3. makes ONE commit on that branch with
   - ``build/<variant>/**`` of every selected variant (all built ones by default),
   - deletions of the files under ``build/<variant>/`` of those variants that are on the
     branch but no longer in the local build (other variants on the branch are untouched),
   - ``benchmarks/*.py`` (``kernels benchmark`` runs ``benchmarks/benchmark*.py`` of the
     revision it downloads) and ``benchmarks/results/*.json``;
4. commits the kernel card (usage, variants, benchmarks) as ``README.md`` on ``main``.

Before anything is sent, every selected variant is checked: ``metadata.json`` is read by
``kernels._rust.Metadata`` and its ``version`` must equal build.toml's; ``__init__.py`` and
``_ops.py`` must be there; a compiled variant must hold ``<metadata id>.abi3.so`` and no
other extension. Any problem refuses the whole upload.

Usage:
    python tools/publish.py --dry-run                  # print every operation, no network
    python tools/publish.py                            # all built variants
    python tools/publish.py --variant torch213-cxx11-cpu-x86_64-linux
    python tools/publish.py --endpoint http://127.0.0.1:8080   # or HF_ENDPOINT=...

The token comes from HF_TOKEN or the login cache (``hf auth login``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels_compat  # noqa: E402  (where kernels keeps its variant rules, by release)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
REPO_TYPE = "kernel"
CARD_BRANCH = "main"
# Folders of build/ that are not variants (tools/build_variant.py's scratch, build_matrix logs).
NOT_VARIANTS = {"_work", "matrix-logs"}


class Refused(Exception):
    """The upload cannot go ahead; the message says why."""


@dataclass
class LocalFile:
    path_in_repo: str
    local: Path
    size: int
    sha256: str


@dataclass
class Variant:
    name: str
    path: Path
    metadata: dict
    compiled: bool
    files: list[LocalFile] = field(default_factory=list)


@dataclass
class Plan:
    repo_id: str
    version: int
    branch: str
    variants: list[Variant]
    benchmark_files: list[LocalFile]
    card: bytes
    endpoint: str | None

    @property
    def files(self) -> list[LocalFile]:
        return [f for v in self.variants for f in v.files] + self.benchmark_files


def log(msg: str) -> None:
    print(f"[publish] {msg}", flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def local_file(path: Path, path_in_repo: str) -> LocalFile:
    return LocalFile(path_in_repo=path_in_repo, local=path, size=path.stat().st_size, sha256=sha256_of(path))


def read_build_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


# --------------------------------------------------------------------------------------
# local checks


def variant_files(vdir: Path, name: str) -> list[LocalFile]:
    out = []
    for p in sorted(vdir.rglob("*")):
        rel = p.relative_to(vdir)
        if not p.is_file() or "__pycache__" in rel.parts or p.suffix == ".pyc":
            continue
        out.append(local_file(p, f"build/{name}/{rel.as_posix()}"))
    return out


def check_variant(vdir: Path, version: int, pkg_name: str) -> Variant:
    """Validate one build/<variant> folder; raise Refused with every problem found."""
    from kernels._rust import Metadata

    rules = kernels_compat.variants()
    ArchVariant, parse_variant = rules.ArchVariant, rules.parse_variant

    name = vdir.name
    problems: list[str] = []
    try:
        parsed = parse_variant(name)
    except ValueError as e:
        raise Refused(f"build/{name}: not a variant name the loader accepts ({e})")
    compiled = isinstance(parsed, ArchVariant)

    for f in ("__init__.py", "_ops.py"):
        if not (vdir / f).is_file():
            problems.append(f"missing {f}")
    meta: dict = {}
    mpath = vdir / "metadata.json"
    if not mpath.is_file():
        problems.append("missing metadata.json")
    else:
        try:
            meta = json.loads(mpath.read_text())
            Metadata.read_from_file(mpath)
        except Exception as e:  # noqa: BLE001 - anything the loader would reject
            problems.append(f"metadata.json is not accepted by kernels._rust.Metadata: {e}")
        if meta:
            if meta.get("version") != version:
                problems.append(
                    f"metadata.json version {meta.get('version')!r} does not match build.toml version {version} "
                    "(rebuild the variant, or fix build.toml)"
                )
            if meta.get("name") != pkg_name:
                problems.append(f"metadata.json name {meta.get('name')!r} is not build.toml's {pkg_name!r}")
            btype = (meta.get("backend") or {}).get("type")
            if compiled:
                want = kernels_compat.backend_of(parsed).name
                if btype != want:
                    problems.append(f"metadata.json backend type {btype!r} does not match the variant's {want!r}")

    sos = sorted(p.name for p in vdir.glob("*.so"))
    if compiled:
        if not sos:
            problems.append("compiled variant without its extension (.so)")
        elif meta.get("id"):
            want = f"{meta['id']}.abi3.so"
            if want not in sos:
                problems.append(f"metadata id {meta['id']!r} does not match the extension {sos} (expected {want})")
            others = [s for s in sos if s != want]
            if others and want in sos:
                problems.append(f"extensions other than {want}: {others} (stale build?)")
    if problems:
        raise Refused(f"build/{name} is not a complete variant: " + "; ".join(problems))
    return Variant(name=name, path=vdir, metadata=meta, compiled=compiled, files=variant_files(vdir, name))


def collect_variants(build_dir: Path, only: list[str] | None, version: int, pkg_name: str) -> list[Variant]:
    if not build_dir.is_dir():
        raise Refused(f"{build_dir} does not exist: build first (tools/build_variant.py or tools/build_matrix.py)")
    candidates = sorted(d for d in build_dir.iterdir() if d.is_dir() and d.name not in NOT_VARIANTS
                        and not d.name.startswith((".", "_")))
    if not candidates:
        raise Refused(f"{build_dir} holds no built variant: build first (tools/build_variant.py)")
    if only:
        names = {d.name for d in candidates}
        missing = [v for v in only if v not in names]
        if missing:
            raise Refused(f"not built in {build_dir}: {missing} (built: {sorted(names)})")
        candidates = [d for d in candidates if d.name in only]
    variants = []
    problems = []
    for d in candidates:
        try:
            variants.append(check_variant(d, version, pkg_name))
        except Refused as e:
            problems.append(str(e))
    if problems:
        raise Refused("\n  ".join(["refusing to publish:"] + problems))
    return variants


def collect_benchmarks(bench_dir: Path) -> list[LocalFile]:
    """benchmarks/*.py (scripts and their helpers) and benchmarks/results/*.json."""
    if not bench_dir.is_dir():
        return []
    files = [local_file(p, f"benchmarks/{p.name}") for p in sorted(bench_dir.glob("*.py"))]
    res = bench_dir / "results"
    if res.is_dir():
        files += [local_file(p, f"benchmarks/results/{p.name}") for p in sorted(res.glob("*.json"))]
    return files


# --------------------------------------------------------------------------------------
# kernel card


def _variant_row(v: Variant) -> str:
    p = kernels_compat.variants().parse_variant(v.name)
    be = kernels_compat.backend_of(p)
    backend = v.metadata.get("backend", {})
    if v.compiled:
        torch_v = f"{p.framework.version}"
        be_s = f"CUDA {be.version}" if be.name == "cuda" else be.name.upper() if be.name == "cpu" else be.variant_str
    else:
        torch_v, be_s = "any", be.variant_str
    archs = ", ".join(backend.get("archs", [])) or "-"
    return f"| `{v.name}` | {torch_v} | {be_s} | {archs} | `{v.metadata.get('id', '')}` |"


def _runner_output(f: LocalFile) -> Optional[dict]:
    """The payload of a `kernels benchmark --output` file (results[], machineInfo), else None
    (the project's own bench_*.py results, or an unreadable file)."""
    try:
        data = json.loads(f.local.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        return data
    return None


def _result_files(bench_files: list[LocalFile]) -> list[LocalFile]:
    return [f for f in bench_files if f.path_in_repo.startswith("benchmarks/results/")]


def benchmark_tables(bench_files: list[LocalFile]) -> list[str]:
    """Rows from `kernels benchmark --output` payloads; other result files give no row."""
    lines: list[str] = []
    for f in _result_files(bench_files):
        data = _runner_output(f)
        if data is None:
            continue
        mi = data.get("machineInfo", {})
        for r in data["results"]:
            t = r.get("timingResults", {})
            ver = {True: "yes", False: "no"}.get(r.get("verified"), "-")
            mean = t.get("mean_ms")
            std = t.get("std_ms")
            lines.append(
                f"| {r.get('workload', '?')} | {mi.get('gpu', '?')} | {mi.get('backend', '?')} "
                f"| {mi.get('pytorchVersion', '?')} | {mean if mean is not None else '-'} "
                f"| {std if std is not None else '-'} | {ver} |"
            )
    return lines


def kernel_card(conf: dict, repo_id: str, variants: list[Variant], bench_files: list[LocalFile]) -> bytes:
    g = conf["general"]
    version = g["version"]
    name = g["name"]
    lines = [
        "---",
        f"license: {g.get('license', 'other').lower()}",
        "tags:",
        "- kernels",
        "---",
        "",
        f"# {name}",
        "",
        "Fused feed-forward (MLP) blocks for transformer models: activation-and-multiply "
        "ops and gated MLPs for the CUDA and CPU backends, usable directly or through "
        "`kernels.kernelize`.",
        "",
        "## Usage",
        "",
        "```python",
        "import torch",
        "from kernels import get_kernel",
        "",
        f'fused_mlp = get_kernel("{repo_id}", version={version})',
        "",
        "x = torch.randn(8, 2 * 4096, device=\"cuda\", dtype=torch.float16)",
        "out = torch.empty(8, 4096, device=\"cuda\", dtype=torch.float16)",
        "fused_mlp.silu_and_mul(out, x)  # out = silu(x[..., :d]) * x[..., d:]",
        "```",
        "",
        f"`version={version}` follows the branch `v{version}`: it receives compatible fixes and "
        "additions; an incompatible change of the public API gets a new version and branch.",
        "",
        "## Variants",
        "",
        f"Branch `v{version}` holds these builds (`build/<variant>/`); `get_kernel` picks the one "
        "that matches the installed torch and backend.",
        "",
        "| Variant | Torch | Backend | CUDA capabilities | Op namespace |",
        "|---|---|---|---|---|",
        *[_variant_row(v) for v in variants],
        "",
    ]
    rows = benchmark_tables(bench_files)
    if rows:
        lines += [
            "## Benchmarks",
            "",
            "From `benchmarks/results/*.json` (`kernels benchmark` output); scripts in `benchmarks/`.",
            "",
            "| Workload | GPU | Backend | PyTorch | Mean (ms) | Std (ms) | Verified |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    elif any(f.path_in_repo.startswith("benchmarks/") for f in bench_files):
        lines += ["## Benchmarks", "",
                  f"Run them with `kernels benchmark {repo_id} --version {version}`.", ""]
    own = [f.path_in_repo for f in _result_files(bench_files) if _runner_output(f) is None]
    if own:
        lines += ["## Measurements against other implementations", "",
                  "Written by the project's own scripts (`benchmarks/bench_*.py`: fused-mlp against "
                  "eager PyTorch, torch.compile and Liger in the same process; the build matrix report "
                  "of `tools/build_matrix.py`), each with its date, machine and versions:", "",
                  *[f"- `{name}`" for name in own], ""]
    lines += [
        "## License",
        "",
        f"{g.get('license', 'see repository')}",
        "",
    ]
    return "\n".join(lines).encode()


# --------------------------------------------------------------------------------------
# plan, dry run, upload


def make_plan(a) -> Plan:
    conf = read_build_toml(a.build_toml)
    g = conf["general"]
    version = g["version"]
    if not isinstance(version, int):
        raise Refused(f"build.toml [general] version must be an integer, got {version!r}")
    repo_id = a.repo_id or conf.get("general", {}).get("hub", {}).get("repo-id")
    if not repo_id or repo_id.count("/") != 1:
        raise Refused(f"no repo id (build.toml [general.hub] repo-id, or --repo-id): got {repo_id!r}")
    variants = collect_variants(a.build_dir, a.variant, version, g["name"])
    bench = collect_benchmarks(a.benchmarks_dir)
    card = kernel_card(conf, repo_id, variants, bench)
    return Plan(repo_id=repo_id, version=version, branch=f"v{version}", variants=variants,
                benchmark_files=bench, card=card, endpoint=a.endpoint)


def print_plan(plan: Plan, endpoint: str) -> None:
    print(f"[dry-run] endpoint {endpoint}")
    print(f"[dry-run] create repo {plan.repo_id} (repo_type={REPO_TYPE!r}) if it does not exist")
    print(f"[dry-run] create branch {plan.branch} of {plan.repo_id} if it does not exist")
    print(f"[dry-run] one commit on {plan.branch}: {len(plan.files)} file(s)")
    for f in plan.files:
        print(f"[dry-run]   add {f.path_in_repo}  {f.size} bytes  sha256 {f.sha256}")
    for v in plan.variants:
        print(f"[dry-run]   delete files under build/{v.name}/ on {plan.branch} that are not in the local build "
              "(listed at upload time; the dry run makes no network call)")
    sha = hashlib.sha256(plan.card).hexdigest()
    print(f"[dry-run] one commit on {CARD_BRANCH}: add README.md  {len(plan.card)} bytes  sha256 {sha}")
    print("[dry-run] nothing was sent")


def get_token_or_refuse() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise Refused("no Hugging Face token: set HF_TOKEN or run `hf auth login` (a token with write access "
                      "to the repository's organization)")
    return token


def remote_files(api, plan: Plan, token: str) -> list[str] | None:
    """Files on the version branch; None when the branch does not exist."""
    from huggingface_hub.errors import RemoteEntryNotFoundError, RevisionNotFoundError

    try:
        return api.list_repo_files(plan.repo_id, repo_type=REPO_TYPE, revision=plan.branch, token=token)
    except (RevisionNotFoundError, RemoteEntryNotFoundError):
        return None


def upload(plan: Plan, token: str, message: str | None, private: bool | None) -> dict:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    api = HfApi(endpoint=plan.endpoint, token=token)
    url = api.create_repo(plan.repo_id, repo_type=REPO_TYPE, exist_ok=True, private=private, token=token)
    log(f"repository {url}")

    try:
        existing = remote_files(api, plan, token)
    except RepositoryNotFoundError:
        existing = None
    if existing is None:
        log(f"creating branch {plan.branch}")
        api.create_branch(plan.repo_id, branch=plan.branch, repo_type=REPO_TYPE, exist_ok=True, token=token)
        existing = []

    local_paths = {f.path_in_repo for f in plan.files}
    deletes = sorted(
        p for p in existing
        if any(p.startswith(f"build/{v.name}/") for v in plan.variants) and p not in local_paths
    )
    ops = [CommitOperationAdd(path_in_repo=f.path_in_repo, path_or_fileobj=str(f.local)) for f in plan.files]
    ops += [CommitOperationDelete(path_in_repo=p) for p in deletes]
    for p in deletes:
        log(f"deleting stale {p}")
    names = ", ".join(v.name for v in plan.variants)
    info = api.create_commit(
        plan.repo_id, ops, repo_type=REPO_TYPE, revision=plan.branch, token=token,
        commit_message=message or f"Upload {plan.branch}: {names}",
        commit_description=f"{len(plan.files)} file(s) added or updated, {len(deletes)} deleted.",
    )
    log(f"committed {len(plan.files)} file(s), {len(deletes)} deletion(s) to {plan.branch}: {info.oid}")

    card = api.create_commit(
        plan.repo_id, [CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=plan.card)],
        repo_type=REPO_TYPE, revision=CARD_BRANCH, token=token,
        commit_message=f"Kernel card for {plan.branch}",
    )
    log(f"kernel card committed to {CARD_BRANCH}: {card.oid}")
    return {"commit": info.oid, "card_commit": card.oid, "deleted": deletes}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", help="publish only these variants (repeatable; default: all built)")
    p.add_argument("--build-dir", type=Path, default=ROOT / "build")
    p.add_argument("--benchmarks-dir", type=Path, default=ROOT / "benchmarks")
    p.add_argument("--build-toml", type=Path, default=ROOT / "build.toml")
    p.add_argument("--repo-id", default=None, help="default: build.toml [general.hub] repo-id")
    p.add_argument("--endpoint", default=None, help="Hub endpoint (default: HF_ENDPOINT, else huggingface.co)")
    p.add_argument("--dry-run", action="store_true", help="print every operation; no network, no token needed")
    p.add_argument("--print-card", action="store_true", help="also print the generated README.md")
    p.add_argument("--private", action="store_true", default=None, help="create the repository private")
    p.add_argument("-m", "--message", default=None, help="commit message of the variants commit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        plan = make_plan(a)
        if a.print_card:
            sys.stdout.write(plan.card.decode() + "\n")
        if a.dry_run:
            endpoint = a.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
            print_plan(plan, endpoint)
            return 0
        token = get_token_or_refuse()
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            raise Refused("HF_HUB_OFFLINE is set: unset it (HF_HUB_OFFLINE=0) to publish")
        res = upload(plan, token, a.message, a.private)
        print(json.dumps({"repo_id": plan.repo_id, "branch": plan.branch,
                          "variants": [v.name for v in plan.variants], **res}))
        return 0
    except Refused as e:
        print(f"[publish] {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a Hub/HTTP error: say what failed, without a traceback
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(e, HfHubHTTPError):
            print(f"[publish] the Hub refused a request: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
