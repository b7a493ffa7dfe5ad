"""Kernelize the MLP blocks of transformers models with fused-mlp's layers.

transformers 5.x tags no MLP class for the Kernel Hub, so this module does it:
it finds the model's MLP classes, tags them for `kernels.kernelize`, and builds the
kernel mapping that points each tag at a layer of this repository.

One call, any device `kernels` knows (CPU included)::

    from kernels import Mode, get_kernel
    fused_mlp = get_kernel("org/fused-mlp", version=1)
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cuda")

or in steps::

    tagged = fused_mlp.mapping.patch(model)        # {"LlamaMLP": "GatedMLP"}
    with kernels.use_kernel_mapping(fused_mlp.mapping.kernel_mapping()):
        kernels.kernelize(model, mode=Mode.INFERENCE, device="cuda")

The transformers route (transformers 5.24; GPU only: KernelConfig accepts the devices
"cuda", "rocm", "xpu", "npu", "neuron", "tpu", "mps" and rejects "cpu")::

    from transformers import AutoModelForCausalLM, KernelConfig
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda")
    tagged = fused_mlp.mapping.patch(model)        # tag the classes first: KernelConfig
                                                   # refuses names no module carries
    config = KernelConfig({layer: f"org/fused-mlp:{layer}" for layer in set(tagged.values())})
    model.set_use_kernels(True, config)            # kernelizes now, in the model's mode

transformers only uses `kernels` in a version range it pins (5.24: >= 0.18.2, < 0.19; 5.25
requires >= 0.19.1, < 0.20 and turns use_kernels on by default in from_pretrained;
`transformers.utils.import_utils.is_kernels_available()`); with another version it treats
kernels as absent and refuses use_kernels. Outside that range (kernels 0.17.2 on the GPU
machine, say) use `fused_mlp.mapping.kernelize`, which drives kernels directly.

`set_use_kernels(True, ...)` also registers transformers' default mapping (kernels-community
RMSNorm, activations, ...) and kernelizes those layers too; offline, with those repos not in
the cache, resolving them fails: pass `KernelConfig(..., inherit_mapping=False)` to use
only fused-mlp's layers.

Each value may also be ("org/fused-mlp:GatedMLP", {"version": 1, "trust_remote_code": True});
a plain string means version 1 and no trust for an org that is not a trusted publisher
(online), which `kernels` refuses; offline (HF_HUB_OFFLINE=1) the check is skipped.
transformers builds that mapping for one device (the model's) and one mode (TRAINING if
`model.training` else INFERENCE) and re-kernelizes on `model.train()` / `model.eval()`
with the mapping it built first, so a mode switch falls back to the original forwards;
`from_pretrained(..., use_kernels=True, kernel_config=config)` works too once the classes
are tagged before loading (`patch_class(LlamaMLP)`).

Which classes are handled (`layer_for_class`):

* a reviewed table (`LAYER_FOR_CLASS`) of transformers class names, and
* a structural match for any other class: its `forward` source, normalized (docstring,
  annotations and single-assignment temporaries removed, local names renamed, the
  operands of `*` ordered), must equal one of the layer's templates (`TEMPLATES`), the
  forward formula the layer implements. So a new family with a Llama-style MLP works
  with no code change, and a look-alike with one more scale, clamp, norm or cast is not
  taken for one. Table entries are checked against the templates too when their
  source can be read (a table entry whose forward changed is not tagged).

Per instance, at kernelize time, `kernel_condition` also requires the submodules the
fused path needs (plain nn.Linear / Conv1D projections, an activation fused-mlp computes
exactly); an instance that fails keeps its original forward. The layers themselves fall
back to the original computation per call (dtype, device, dropout, hooks); under
torch.autocast they stay fused, in autocast's dtype.

BERT's MLP is split across BertIntermediate (dense + activation) and BertOutput (dense +
dropout + residual LayerNorm). BertIntermediate (and the classes with its forward:
RoBERTa's, ELECTRA's, ... found by the structural match) gets the `BertIntermediate`
layer: one GEMM with the bias and the activation in its epilogue (`linear_act`).
BertOutput is left as it is (its dropout, residual and LayerNorm are not fused-mlp's).
`NOT_HANDLED` lists classes refused by name.

This module imports neither transformers nor kernels at import time.
"""

from __future__ import annotations

import ast
import copy
import inspect
import logging
import sys
import textwrap
from pathlib import Path
from typing import Iterable, Optional, Union

import torch
from torch import nn

from . import layers as _layers

logger = logging.getLogger(__name__)

DEFAULT_REPO_ID = "org/fused-mlp"

# ----------------------------------------------------------------------------- templates
# The forward each MLP layer implements, as transformers writes it. `F`, `nn` and
# `torch` stand for torch.nn.functional, torch.nn and torch (checked in the class's module).

TEMPLATES: dict[str, tuple[str, ...]] = {
    "GatedMLP": (
        "def forward(self, x):\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    ),
    "PackedGatedMLP": (
        "def forward(self, x):\n"
        "    up_states = self.gate_up_proj(x)\n"
        "    gate, up_states = up_states.chunk(2, dim=-1)\n"
        "    return self.down_proj(up_states * self.activation_fn(gate))",
    ),
    "Lfm2MLP": ("def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))",),
    "Llama4TextMLP": (
        "def forward(self, x):\n    return self.down_proj(self.activation_fn(self.gate_proj(x)) * self.up_proj(x))",
    ),
    "SeedOssMLP": (
        "def forward(self, x):\n"
        "    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n"
        "    return nn.functional.dropout(down_proj, p=self.residual_dropout, training=self.training)",
    ),
    "GraniteMoeSharedMLP": (
        "def forward(self, x):\n"
        "    h = self.input_linear(x).chunk(2, dim=-1)\n"
        "    return self.output_linear(self.activation(h[0]) * h[1])",
    ),
    "Qwen3VLVisionMLP": ("def forward(self, x):\n    return self.linear_fc2(self.act_fn(self.linear_fc1(x)))",),
    "UpDownMLP": ("def forward(self, x):\n    return self.down_proj(self.act_fn(self.up_proj(x)))",),
    "Fc1Fc2MLP": ("def forward(self, x):\n    return self.fc2(self.activation_fn(self.fc1(x)))",),
    "GPTNeoXMLP": ("def forward(self, x):\n    return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))",),
    "GPT2MLP": ("def forward(self, x):\n    return self.dropout(self.c_proj(self.act(self.c_fc(x))))",),
    "GPTJMLP": ("def forward(self, x):\n    return self.dropout(self.fc_out(self.act(self.fc_in(x))))",),
    "Starcoder2MLP": (
        "def forward(self, x):\n"
        "    return nn.functional.dropout(self.c_proj(self.act(self.c_fc(x))), p=self.residual_dropout,"
        " training=self.training)",
    ),
    "BertIntermediate": ("def forward(self, x):\n    return self.intermediate_act_fn(self.dense(x))",),
}

# Reviewed transformers classes (5.24) and their layer. Anything else is matched by structure.
LAYER_FOR_CLASS: dict[str, str] = {
    **dict.fromkeys(
        [
            "LlamaMLP", "MistralMLP", "MinistralMLP", "Qwen2MLP", "Qwen3MLP", "Qwen2MoeMLP", "Qwen3MoeMLP",
            "Qwen3NextMLP", "Qwen3_5MLP", "Qwen2_5_VLMLP", "Qwen3VLTextMLP", "GemmaMLP", "Gemma2MLP",
            "Gemma3MLP", "Gemma4TextMLP", "OlmoMLP", "Olmo2MLP", "Olmo3MLP", "OlmoeMLP", "GraniteMLP",
            "SmolLM3MLP", "CohereMLP", "Cohere2MLP", "HeliumMLP", "DeepseekV2MLP", "DeepseekV3MLP",
            "Glm4MoeMLP", "Ernie4_5MLP", "HunYuanDenseV1MLP", "Exaone4MLP", "StableLmMLP",
            "MllamaTextMLP", "PixtralMLP", "JambaMLP", "BambaMLP", "ZambaMLP", "DiffLlamaMLP",
        ],
        "GatedMLP",
    ),
    **dict.fromkeys(["Phi3MLP", "Phi4MultimodalMLP", "GlmMLP", "Glm4MLP", "DiaMLP"], "PackedGatedMLP"),
    **dict.fromkeys(["Lfm2MLP", "Lfm2MoeMLP"], "Lfm2MLP"),
    "Llama4TextMLP": "Llama4TextMLP",
    "SeedOssMLP": "SeedOssMLP",
    **dict.fromkeys(["GraniteMoeSharedMLP", "GraniteMoeHybridMLP"], "GraniteMoeSharedMLP"),
    **dict.fromkeys(["NemotronMLP", "NemotronHMLP", "ArceeMLP", "ApertusMLP"], "UpDownMLP"),
    **dict.fromkeys(
        ["CLIPMLP", "SiglipMLP", "Siglip2MLP", "PhiMLP", "Idefics2VisionMLP", "Llama4VisionMLP", "ViTMLP"],
        "Fc1Fc2MLP",
    ),
    **dict.fromkeys(["Qwen3VLVisionMLP", "Qwen3_5VisionMLP", "Qwen3VLMoeVisionMLP"], "Qwen3VLVisionMLP"),
    **dict.fromkeys(["GPTNeoXMLP", "FalconMLP", "PersimmonMLP"], "GPTNeoXMLP"),
    **dict.fromkeys(["GPT2MLP", "GPTBigCodeMLP", "GPTNeoMLP", "ImageGPTMLP", "MLP"], "GPT2MLP"),
    **dict.fromkeys(["GPTJMLP", "CodeGenMLP"], "GPTJMLP"),
    "Starcoder2MLP": "Starcoder2MLP",
}

# Classes refused by name (with the reason), whatever their forward matches. None at present.
NOT_HANDLED: dict[str, str] = {}

MLP_LAYERS: tuple[str, ...] = _layers.MLP_LAYERS
ACTIVATION_LAYERS: tuple[str, ...] = _layers.ACTIVATION_LAYERS
LAYERS: tuple[str, ...] = MLP_LAYERS + ACTIVATION_LAYERS

# Names a template may use besides `self` and the input, and what they must be bound to.
_GLOBALS = {"F": torch.nn.functional, "nn": torch.nn, "torch": torch}

# ----------------------------------------------------------------------------- normalizer


class _Subst(ast.NodeTransformer):
    def __init__(self, env: dict):
        self.env = env

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.env:
            return self.env[node.id]
        return node


class _Canon(ast.NodeTransformer):
    """nn.functional.x / torch.nn.functional.x -> F.x; operands of `*` in a fixed order."""

    def visit_Attribute(self, node):
        self.generic_visit(node)
        v = node.value
        if isinstance(v, ast.Attribute) and v.attr == "functional":
            base = v.value
            if (isinstance(base, ast.Name) and base.id == "nn") or (
                isinstance(base, ast.Attribute) and base.attr == "nn"
                and isinstance(base.value, ast.Name) and base.value.id == "torch"
            ):
                return ast.Attribute(value=ast.Name(id="F", ctx=ast.Load()), attr=node.attr, ctx=node.ctx)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Mult):
            a, b = ast.dump(node.left), ast.dump(node.right)
            if b < a:
                node.left, node.right = node.right, node.left
        return node


def _forward_def(source: str) -> Optional[ast.FunctionDef]:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            return node
    return None


def normalize_forward(fn: ast.FunctionDef) -> Optional[str]:
    """A canonical text of `fn`'s computation, or None if it is not a straight-line
    forward(self, x) (branches, loops, extra arguments, unused assignments: no match)."""
    fn = copy.deepcopy(fn)  # substitution below edits the tree in place
    if fn.decorator_list:
        return None  # the class attribute would be the decorator's wrapper, not this code
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or len(a.args) != 2 or a.defaults:
        return None
    self_name, x_name = a.args[0].arg, a.args[1].arg
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    env: dict[str, ast.expr] = {x_name: ast.Name(id="X", ctx=ast.Load())}
    assigned: set[str] = set()
    out: list[ast.stmt] = []
    fresh = 0

    def subst(e):
        return _Subst(dict(env)).visit(e)

    for st in body:
        if isinstance(st, ast.AnnAssign):
            if st.value is None or not isinstance(st.target, ast.Name):
                return None
            st = ast.Assign(targets=[st.target], value=st.value)
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            tgt = st.targets[0]
            value = subst(st.value)
            if isinstance(tgt, ast.Name):
                if isinstance(value, ast.Name):
                    return None  # plain aliases: not in any template
                # Mark the bound expression, to check below that it reaches the output.
                key = f"{tgt.id}#{len(assigned)}"
                assigned.add(key)
                value._fused_key = key  # type: ignore[attr-defined]
                env[tgt.id] = value
                continue
            if isinstance(tgt, ast.Tuple) and all(isinstance(e, ast.Name) for e in tgt.elts):
                names = []
                for e in tgt.elts:
                    names.append(f"T{fresh}")
                    fresh += 1
                out.append(ast.Assign(
                    targets=[ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store()) for n in names], ctx=ast.Store())],
                    value=value,
                ))
                for e, n in zip(tgt.elts, names):
                    env[e.id] = ast.Name(id=n, ctx=ast.Load())
                continue
            return None
        if isinstance(st, ast.Return) and st.value is not None:
            out.append(ast.Return(value=subst(st.value)))
            break
        return None
    else:
        return None
    # Every local assignment must be used (a dropped statement could be a side effect).
    keys_used = set()
    for node in out:
        for n in ast.walk(node):
            k = getattr(n, "_fused_key", None)
            if k is not None:
                keys_used.add(k)
    if keys_used != assigned:
        return None
    canon = [_Canon().visit(s) for s in out]
    mod = ast.Module(body=canon, type_ignores=[])
    text = ast.unparse(ast.fix_missing_locations(mod))
    if self_name != "self":
        text = _rename(text, self_name, "self")
    return text


def _rename(text: str, old: str, new: str) -> str:
    tree = ast.parse(text)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == old:
            n.id = new
    return ast.unparse(tree)


_TEMPLATE_TEXT: dict[str, str] = {}
for _layer, _sources in TEMPLATES.items():
    for _src in _sources:
        _TEMPLATE_TEXT[normalize_forward(_forward_def(_src))] = _layer  # type: ignore[arg-type]


def _free_names(fn: ast.FunctionDef) -> set[str]:
    """Names `fn` reads that it does not bind (its arguments and assignments excluded)."""
    bound = {a.arg for a in fn.args.args}
    loads = set()
    nodes = []
    for st in fn.body:  # annotations do not run: only statements and values count
        if isinstance(st, ast.AnnAssign):
            nodes += [st.target] + ([st.value] if st.value is not None else [])
        else:
            nodes.append(st)
    for n in (sub for node in nodes for sub in ast.walk(node)):
        if isinstance(n, ast.Name):
            if isinstance(n.ctx, ast.Store):
                bound.add(n.id)
            else:
                loads.add(n.id)
    return loads - bound


def layer_for_forward(fn: ast.FunctionDef) -> Optional[str]:
    """The layer whose template `fn` (a forward's AST) matches, or None."""
    text = normalize_forward(fn)
    return None if text is None else _TEMPLATE_TEXT.get(text)


def layer_for_source(source: str) -> Optional[str]:
    fn = _forward_def(source)
    return None if fn is None else layer_for_forward(fn)


_CLASS_CACHE: dict[type, Optional[str]] = {}


def _forward_source(cls) -> Optional[str]:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None


def layer_for_class(cls: type) -> Optional[str]:
    """The fused-mlp layer for MLP class `cls`, or None. Table entries are trusted when
    the source cannot be read; otherwise the forward must match the layer's template
    and the names it uses (F, nn, torch) must be torch's in the class's module."""
    if cls in _CLASS_CACHE:
        return _CLASS_CACHE[cls]
    result = _layer_for_class(cls)
    _CLASS_CACHE[cls] = result
    return result


def _layer_for_class(cls: type) -> Optional[str]:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return None
    name = cls.__name__
    if name in NOT_HANDLED:
        return None
    table = LAYER_FOR_CLASS.get(name)
    if table is not None and not cls.__module__.startswith("transformers."):
        table = None  # a table entry names a transformers class, not a namesake
    src = _forward_source(cls)
    if src is None:
        return table
    fn = _forward_def(src)
    layer = layer_for_forward(fn) if fn is not None else None
    if layer is None:
        if table is not None:
            logger.warning("fused-mlp: %s is in the table as %s but its forward no longer matches; not tagged",
                           name, table)
        return None
    if table is not None and table != layer:
        logger.warning("fused-mlp: %s is in the table as %s but its forward matches %s", name, table, layer)
        return None
    fwd_module = sys.modules.get(getattr(cls.forward, "__module__", cls.__module__))
    g = vars(fwd_module) if fwd_module is not None else {}
    for root in _free_names(fn):
        if root not in _GLOBALS or g.get(root) is not _GLOBALS[root]:
            return None
    return layer


# ----------------------------------------------------------------------------- tagging


def kernel_condition(module: nn.Module) -> bool:
    """kernelize's per-instance check: the instance's own class matches the layer it is
    tagged with (a subclass inherits the tag, not necessarily the forward) and the
    instance has what the layer's fused path needs."""
    cls = type(module)
    layer = layer_for_class(cls)
    return layer is not None and layer == getattr(cls, "kernel_layer_name", None) and _layers.supports(module, layer)


def find_mlps(model: nn.Module) -> dict[type, str]:
    """{class: layer} for the MLP classes in `model` that fused-mlp handles."""
    found: dict[type, str] = {}
    seen: set[type] = set()
    for m in model.modules():
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        layer = layer_for_class(cls)
        if layer is not None:
            found[cls] = layer
    return found


def explain(model: nn.Module) -> dict[str, str]:
    """For every module class of `model` that is handled, or whose name ends in MLP, or
    is in NOT_HANDLED: the layer it gets, or why not."""
    report: dict[str, str] = {}
    for m in model.modules():
        cls = type(m)
        name = cls.__name__
        if name in report or not (name.endswith("MLP") or name in NOT_HANDLED or layer_for_class(cls)):
            continue
        if name in NOT_HANDLED:
            report[name] = f"not handled: {NOT_HANDLED[name]}"
            continue
        layer = layer_for_class(cls)
        if layer is None:
            report[name] = "not handled: forward matches no fused-mlp layer"
        elif not _layers.supports(m, layer):
            report[name] = f"{layer}, but this instance lacks plain projections or a supported activation"
        else:
            report[name] = layer
    return report


_TAGGED: set[type] = set()


def _ours(cls: type) -> bool:
    """Whether `cls` carries a tag set by fused-mlp (by this or another load of it)."""
    cond = cls.__dict__.get("kernel_condition")
    cond = getattr(cond, "__func__", cond)
    return (
        cls.__dict__.get("kernel_layer_name") in LAYERS
        and getattr(cond, "__name__", None) == "kernel_condition"
        and str(getattr(cond, "__module__", "")).endswith("mapping")
    )


def patch_class(cls: type, *, force: bool = False) -> Optional[str]:
    """Tag `cls` for kernelize with its fused-mlp layer (kernels.replace_kernel_forward_from_hub),
    e.g. before `from_pretrained(..., use_kernels=True, kernel_config=...)`. Returns the
    layer name, or None when the class is not handled or already carries another
    library's tag (unless force=True)."""
    from kernels import replace_kernel_forward_from_hub

    layer = layer_for_class(cls)
    if layer is None:
        return None
    existing = getattr(cls, "kernel_layer_name", None)
    if existing is not None and not _ours(cls) and not force:
        logger.warning("fused-mlp: %s is already tagged %r for kernelize; left as it is (force=True overrides)",
                       cls.__name__, existing)
        return None
    replace_kernel_forward_from_hub(cls, layer, condition=kernel_condition)
    _TAGGED.add(cls)
    return layer


def patch(model: nn.Module, *, force: bool = False) -> dict[str, str]:
    """Tag the MLP classes of `model` for kernelize. Returns {class name: layer name}.
    Tags live on the classes, so every instance of them (in any model) is affected
    by a later kernelize; `unpatch` removes them."""
    tagged = {}
    for cls, layer in find_mlps(model).items():
        if patch_class(cls, force=force) is not None:
            tagged[cls.__name__] = layer
    return tagged


def unpatch(model_or_classes: Union[nn.Module, Iterable[type], None] = None) -> list[str]:
    """Remove fused-mlp's tags from the classes of a model, from the given classes, or
    (no argument) from every class this module tagged. Forwards already replaced on
    instances stay replaced: kernelize again (tags gone: nothing swaps them) or rebuild."""
    if model_or_classes is None:
        classes = set(_TAGGED)
    elif isinstance(model_or_classes, nn.Module):
        classes = {type(m) for m in model_or_classes.modules()}
    else:
        classes = set(model_or_classes)
    removed = []
    for cls in classes:
        if _ours(cls):
            del cls.kernel_layer_name
            del cls.kernel_condition
            removed.append(cls.__name__)
        _TAGGED.discard(cls)
    return sorted(removed)


# ----------------------------------------------------------------------------- mapping


def default_modes():
    from kernels import Mode

    return (
        Mode.INFERENCE,
        Mode.TRAINING,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
    )


def kernel_mapping(
    repo_id: str = DEFAULT_REPO_ID,
    version: Optional[int] = 1,
    *,
    revision: Optional[str] = None,
    local_path: Union[str, Path, None] = None,
    devices: Iterable[str] = ("cuda", "cpu"),
    modes=None,
    layers: Optional[Iterable[str]] = None,
    trust_remote_code: bool = False,
) -> dict:
    """The mapping for kernels.use_kernel_mapping / register_kernel_mapping:
    {layer: {device: {mode: repository}}} for every fused-mlp layer (or `layers`).

    Every layer is registered for each of `modes` (default: INFERENCE, TRAINING and both
    with TORCH_COMPILE: all layers have a backward and compile); kernelize picks by its
    own mode. `local_path` (a build directory, or a variant directory in it) gives
    LocalLayerRepository instead of the Hub repository; do not load one build both ways
    in one process (both would register the same op namespace). A "cuda" entry is only
    resolved when kernelizing for CUDA (it reads the GPU's compute capability).
    """
    from kernels import LayerRepository, LocalLayerRepository

    if modes is None:
        modes = default_modes()
    if local_path is None and revision is not None:
        version = None
    names = tuple(layers) if layers is not None else LAYERS
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise ValueError(f"unknown fused-mlp layers {unknown}; known: {list(LAYERS)}")
    mapping: dict = {}
    for name in names:
        if local_path is not None:
            repo = LocalLayerRepository(repo_path=Path(local_path), layer_name=name)
        else:
            repo = LayerRepository(
                repo_id, layer_name=name, version=version, revision=revision,
                trust_remote_code=trust_remote_code,
            )
        mapping[name] = {device: {mode: repo for mode in modes} for device in devices}
    return mapping


def kernelize(
    model: nn.Module,
    *,
    mode,
    device: Union[str, torch.device, None] = None,
    repo_id: str = DEFAULT_REPO_ID,
    version: Optional[int] = 1,
    revision: Optional[str] = None,
    local_path: Union[str, Path, None] = None,
    use_fallback=True,
    trust_remote_code: bool = False,
    inherit_mapping: bool = True,
) -> nn.Module:
    """patch(model), then kernels.kernelize(model, mode=..., device=...) with
    kernel_mapping(...) in scope. Returns the model.

    Like kernels.kernelize, this sets the forward of every tagged module of the model
    (fused-mlp's and any other library's, e.g. transformers' RMSNorm) from the mapping in
    scope: with inherit_mapping=True (default) fused-mlp's entries are added to the
    registered mapping, so other layers keep theirs; inherit_mapping=False uses only
    fused-mlp's (other tagged layers get their original forward).
    """
    import kernels

    patch(model)
    dev = device if device is None or isinstance(device, str) else torch.device(device).type
    mapping = kernel_mapping(
        repo_id, version, revision=revision, local_path=local_path,
        devices=(dev,) if dev is not None else ("cuda", "cpu"),
        trust_remote_code=trust_remote_code,
    )
    with kernels.use_kernel_mapping(mapping, inherit_mapping=inherit_mapping):
        kernels.kernelize(model, mode=mode, device=device, use_fallback=use_fallback)
    return model


def kernelized_modules(model: nn.Module) -> dict[str, str]:
    """{module path: layer name} for the modules whose forward is now a fused-mlp layer's."""
    out = {}
    for path, m in model.named_modules():
        fwd = m.__dict__.get("forward")
        func = getattr(fwd, "__func__", None)
        if func is None:
            continue
        owner = func.__qualname__.split(".")[0]
        if func.__module__ == _layers.__name__ and owner in LAYERS:
            out[path] = owner
    return out
