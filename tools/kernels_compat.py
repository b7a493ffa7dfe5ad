"""Where the parts of `kernels` that the tools and tests use lie, by release.

`requirements.txt` admits kernels 0.17.2 (the GPU machine's wheel) up to 0.19.x (PyPI's newest,
which transformers 5.25 requires for `use_kernels`). kernels 0.19 moved its modules under
`kernels._internals` and made `Metadata` public; the public API fused-mlp itself calls
(get_kernel, kernelize, Mode, LayerRepository, ...) did not move. The build and publish tools
and some tests also check our build against the loader's own rules, with modules that did move:
this module finds them in either place. The package (torch-ext/fused_mlp) needs none of it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def _first(*names: str) -> ModuleType:
    err: ImportError | None = None
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:  # the other release's layout
            err = e
    raise ImportError(f"none of {names} imports with this kernels") from err


def variants() -> ModuleType:
    """The loader's variant-name rules (parse_variant, ArchVariant, ...)."""
    return _first("kernels._internals.variants", "kernels.variants")


def layer_module() -> ModuleType:
    """kernelize's layer checks (_validate_layer)."""
    return _first("kernels._internals.layer.layer", "kernels.layer.layer")


def benchmark_runner_path():
    """The file of the `kernels benchmark` command's runner."""
    from pathlib import Path

    import kernels

    root = Path(kernels.__file__).parent
    for rel in ("_internals/cli/benchmark.py", "cli/benchmark.py"):
        if (root / rel).is_file():
            return root / rel
    raise SystemExit(f"this kernels ({kernels.__version__}) has no benchmark runner under {root}")


def backend_of(parsed):
    """A parsed variant's backend part (`.name`, `.variant_str`; CUDA's also `.version`):
    kernels 0.19 keeps it in `.backend`; earlier releases in `.arch.backend` (arch variants)
    or `.arch` itself (noarch variants)."""
    if hasattr(parsed, "backend"):
        return parsed.backend
    return getattr(parsed.arch, "backend", parsed.arch)
