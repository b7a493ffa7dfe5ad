"""The Kernel Hub package itself: build.toml, the built variant, the staged cache."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_variant  # noqa: E402
from conftest import submodule  # noqa: E402


def test_build_toml_validates_with_kernel_builders_parser():
    from kernels._rust import Backend, Build

    build = Build.open(ROOT)  # raises ValueError on anything kernel-builder would reject
    assert set(build.general.backends) == {Backend.CUDA, Backend.CPU}
    conf = tomllib.loads((ROOT / "build.toml").read_text())
    general = conf["general"]
    assert (general["name"], general["version"], general["edition"], general["license"]) == (
        "fused-mlp", 1, 5, "Apache-2.0")
    assert general["hub"]["repo-id"] == "org/fused-mlp"
    cuda = [k for k in conf["kernel"].values() if k["backend"] == "cuda"]
    caps = {c for k in cuda for c in k["cuda-capabilities"]}
    assert {"8.0", "9.0"} <= caps
    for k in conf["kernel"].values():  # every listed source exists, under kernel_src/
        for src in k["src"]:
            assert src.startswith("kernel_src/") and (ROOT / src).is_file(), src
    for src in conf["torch"]["src"]:
        assert (ROOT / src).is_file(), src


def test_build_toml_rejects_unknown_keys(tmp_path):
    # The validator is strict: a typo in build.toml would be caught by the test above.
    from kernels._rust import Build

    bad = (ROOT / "build.toml").read_text().replace("[general.hub]", "[general.hub]\nrepo_id_typo = 1")
    (tmp_path / "build.toml").write_text(bad)
    with pytest.raises(ValueError):
        Build.open(tmp_path)


def test_flake_uses_kernel_builder():
    text = (ROOT / "flake.nix").read_text()
    assert "github:huggingface/kernels" in text and "genKernelFlakeOutputs" in text
    assert "path = ./.;" in text


def test_variant_name_follows_the_loaders_rules():
    name = build_variant.variant_name("cpu")
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    assert name.startswith(f"torch{major}{minor}-cxx11-cpu-")
    import kernels_compat  # tools/ is on sys.path (above)

    assert kernels_compat.variants().parse_variant(name).variant_str == name


@pytest.mark.parametrize("name, backend", [("torch211-cxx11-cu130-x86_64-linux", "cu130"),
                                           ("torch213-cxx11-cpu-x86_64-linux", "cpu"),
                                           ("torch-universal", "universal")])
def test_backend_of_a_parsed_variant(name, backend):
    """kernels_compat.backend_of reads the backend part of an arch and a noarch variant in
    the installed release's layout (0.19: `.backend`; 0.17: `.arch.backend` / `.arch`); CI runs
    this under both releases."""
    import kernels_compat

    assert kernels_compat.backend_of(kernels_compat.variants().parse_variant(name)).variant_str == backend


def test_built_variant_is_what_the_loader_expects(fused_mlp):
    from kernels._rust import Metadata

    variant_dir = Path(fused_mlp.__file__).parent
    meta = Metadata.read_from_file(variant_dir / "metadata.json")
    raw = json.loads((variant_dir / "metadata.json").read_text())
    assert meta.id == fused_mlp.__name__ == raw["id"]
    assert raw["id"].startswith(f"_fused_mlp_{raw['backend']['type']}_")
    assert (variant_dir / f"{raw['id']}.abi3.so").is_file()
    # The op namespace baked into the extension is the one _ops.py binds.
    ops_py = (variant_dir / "_ops.py").read_text()
    assert f"torch.ops.{raw['id']}" in ops_py
    assert hasattr(torch.ops, raw["id"]) and hasattr(getattr(torch.ops, raw["id"]), "act_and_mul")
    # Staged like a download: refs/v1 names the snapshot that holds this variant.
    snapshot = variant_dir.parent.parent
    refs = snapshot.parent.parent / "refs" / "v1"
    assert refs.read_text().strip() == snapshot.name
    assert set(fused_mlp.__all__) >= {"gated_mlp", "gated_mlp_packed", "mlp", "silu_and_mul", "layers", "mapping"}


def test_capabilities_per_kernel_table():
    """The sm_90a table is built for exactly 9.0a (no PTX: architecture-specific code runs
    nowhere else), kept by --archs 9.0 and left out by --archs 8.0; the other tables get
    --archs as given, or their list plus the newer architectures."""
    conf = tomllib.loads((ROOT / "build.toml").read_text())
    sm90 = conf["kernel"]["fused_mlp_sm90"]
    portable = conf["kernel"]["fused_mlp_cuda"]
    assert build_variant.table_archs(sm90, (13, 0), None) == ["9.0a"]
    assert build_variant.table_archs(sm90, (13, 0), "8.0,9.0") == ["9.0a"]
    assert build_variant.table_archs(sm90, (13, 0), "8.0") == []
    assert build_variant.table_archs(portable, (13, 0), "9.0") == ["9.0"]
    assert build_variant.table_archs(portable, (13, 0), None) == ["8.0", "8.9", "9.0", "10.0", "12.0"]
    assert build_variant.table_archs(portable, (12, 6), None) == ["8.0", "8.9", "9.0"]
    assert build_variant.cuda_archs(conf, (13, 0), "9.0") == ["9.0", "9.0a"]
    assert build_variant.gencode_flags(["9.0a"]) == ["-gencode=arch=compute_90a,code=sm_90a"]
    flags = build_variant.gencode_flags(["8.0", "9.0", "9.0a"])
    assert flags[-1] == "-gencode=arch=compute_90,code=compute_90"
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags


def test_sm90_kernel_is_not_used_off_the_gpu(fused_mlp, monkeypatch):
    """sm90.usable says no for CPU tensors and for fp32; its switches (read before anything
    touches the device): FUSED_MLP_SM90=0 for every activation, FUSED_MLP_FAST_TANH=0 for
    the tanh.approx ones only (the GPU tests cover the yes side)."""
    sm90 = submodule(fused_mlp, "sm90")
    ids = fused_mlp.activations.ACTIVATION_IDS
    x, w, out = torch.zeros(16, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16), \
        torch.zeros(16, 64, dtype=torch.bfloat16)
    assert not sm90.usable(x, w, w, None, None, out, None, 1)
    assert not sm90.usable(x.float(), w.float(), w.float(), None, None, out.float(), None, 1)
    pre = torch.zeros(16, 128, dtype=torch.bfloat16)
    assert not sm90.dact_usable(x, w, True, pre, pre, 1, True)
    monkeypatch.delenv("FUSED_MLP_SM90", raising=False)
    monkeypatch.delenv("FUSED_MLP_FAST_TANH", raising=False)
    assert not any(sm90.switched_off(i) for i in ids.values())
    monkeypatch.setenv("FUSED_MLP_FAST_TANH", "0")
    assert {a for a, i in ids.items() if sm90.switched_off(i)} == {"silu", "gelu_tanh", "quick_gelu"}
    monkeypatch.delenv("FUSED_MLP_FAST_TANH")
    monkeypatch.setenv("FUSED_MLP_SM90", "0")
    assert all(sm90.switched_off(i) for i in ids.values())


def test_stage_without_a_build_says_so(tmp_path):
    # tools/gpu_session.sh's "stage" step on a machine where build/ was not carried: a clear
    # message and a failing exit, not a traceback.
    import stage_cache

    with pytest.raises(SystemExit, match="no built variant in"):
        stage_cache.variant_dirs(tmp_path / "build", None)


def test_restaging_removes_only_superseded_staged_snapshots(tmp_path):
    # tools/prepare.sh restages build/ before every test run; each change of the sources is a
    # new snapshot, and the ones no ref names any more go. A snapshot another ref names, or one
    # huggingface_hub downloaded (links into blobs/), stays.
    import stage_cache

    variant = tmp_path / "build" / "torch-cpu"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text("{}")
    (variant / "ops.py").write_text("a = 1\n")
    repo = tmp_path / "cache" / "kernels--org--fused-mlp"
    first = stage_cache.stage(tmp_path / "build", tmp_path / "cache", "org/fused-mlp", 1, None)
    other = repo / "snapshots" / ("1" * 40)  # a snapshot another ref names
    shutil.copytree(first, other)
    (repo / "refs" / "main").write_text(other.name)
    blob = repo / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_text("x")
    downloaded = repo / "snapshots" / ("2" * 40)  # as huggingface_hub lays out a download
    downloaded.mkdir()
    (downloaded / "ops.py").symlink_to(blob)

    assert stage_cache.stage(tmp_path / "build", tmp_path / "cache", "org/fused-mlp", 1, None) == first
    (variant / "ops.py").write_text("a = 2\n")
    second = stage_cache.stage(tmp_path / "build", tmp_path / "cache", "org/fused-mlp", 1, None)
    assert second != first and (repo / "refs" / "v1").read_text() == second.name
    assert sorted(p.name for p in (repo / "snapshots").iterdir()) == sorted(
        [second.name, other.name, downloaded.name])
    assert (second / "build" / "torch-cpu" / "ops.py").read_text() == "a = 2\n"


def test_python_refresh_checks_the_carried_extension(fused_mlp, tmp_path):
    # `build_variant.py --python-only` (gpu_session.sh's "stage" of a carried build/) recopies
    # the Python files only where the extension is the one these sources would compile: the
    # staged build (made from this tree just before the tests) passes and gets this tree's
    # Python back; the same build under another id is refused, its files left as they were.
    # The staged build's own backend, as its metadata records it: a CUDA torch builds the CUDA
    # variant, GPU or not.
    pkg_meta = json.loads((Path(fused_mlp.__file__).parent / "metadata.json").read_text())
    backend = pkg_meta["backend"]["type"]
    variant = build_variant.variant_name(backend)
    dst = tmp_path / variant
    shutil.copytree(Path(fused_mlp.__file__).parent, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "reference.py").write_text("# an older tree's file\n")
    build_variant.refresh_python(backend, tmp_path)
    assert (dst / "reference.py").read_text() == (build_variant.PACKAGE_DIR / "reference.py").read_text()

    meta = json.loads((dst / "metadata.json").read_text())
    meta["id"] = f"_fused_mlp_{backend}_0123456789"
    (dst / "metadata.json").write_text(json.dumps(meta))
    (dst / "reference.py").write_text("# an older tree's file\n")
    with pytest.raises(SystemExit, match=f"{variant} is stale: it was built as _fused_mlp_{backend}_0123456789"):
        build_variant.refresh_python(backend, tmp_path)
    assert (dst / "reference.py").read_text() == "# an older tree's file\n"

    (dst / "metadata.json").unlink()
    with pytest.raises(SystemExit, match="gives no build id"):
        build_variant.refresh_python(backend, tmp_path)
