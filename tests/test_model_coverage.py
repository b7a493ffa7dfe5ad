"""Model coverage: tiny random models of each supported family kernelized end to end, and
every *MLP class of the installed transformers checked against the mapping.

Families (CPU, fp32): kernelize(mode=INFERENCE, device="cpu") must replace the forward of
every MLP module, the fused path must run in each, and the logits must match the
unpatched model. The same on CUDA in bf16 (marked gpu).

Coverage: the source of every transformers modeling file is parsed (ast, no import: fast)
and each class whose name ends in "MLP" is run through mapping.layer_for_forward. The test
fails if a class that this test recognizes on its own as a known-compatible form is not
handled, if a known look-alike is handled, or if the reviewed table names a class that
does not exist or does not match its layer.
"""

from __future__ import annotations

import ast
import collections
import copy
import re
from pathlib import Path

import pytest
import torch

from conftest import HAS_CUDA, rel_err

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
GPT = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)
NO_SPECIAL_TOKENS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)

# family -> (config class name, kwargs, expected layer)
FAMILIES = {
    "llama": ("LlamaConfig", TINY, "GatedMLP"),
    "mistral": ("MistralConfig", TINY, "GatedMLP"),
    "qwen2": ("Qwen2Config", TINY, "GatedMLP"),
    "qwen3": ("Qwen3Config", {**TINY, "head_dim": 16}, "GatedMLP"),
    "gemma": ("GemmaConfig", {**TINY, "head_dim": 16}, "GatedMLP"),
    "gemma2": ("Gemma2Config", {**TINY, "head_dim": 16}, "GatedMLP"),
    "gemma3": ("Gemma3TextConfig", {**TINY, "head_dim": 16}, "GatedMLP"),
    "olmo2": ("Olmo2Config", {**TINY, **NO_SPECIAL_TOKENS}, "GatedMLP"),
    "granite": ("GraniteConfig", TINY, "GatedMLP"),
    "smollm3": ("SmolLM3Config", {**TINY, **NO_SPECIAL_TOKENS}, "GatedMLP"),
    "cohere": ("CohereConfig", {**TINY, **NO_SPECIAL_TOKENS}, "GatedMLP"),
    "llama_mlp_bias": ("LlamaConfig", {**TINY, "mlp_bias": True}, "GatedMLP"),
    "phi3": ("Phi3Config", {**TINY, **NO_SPECIAL_TOKENS}, "PackedGatedMLP"),
    "glm": ("GlmConfig", {**TINY, "head_dim": 16, **NO_SPECIAL_TOKENS}, "PackedGatedMLP"),
    "lfm2": ("Lfm2Config", {**TINY, "layer_types": ["conv", "full_attention"]}, "Lfm2MLP"),
    "starcoder2": ("Starcoder2Config", {**TINY, **NO_SPECIAL_TOKENS}, "Starcoder2MLP"),
    "gpt_neox": ("GPTNeoXConfig", {k: v for k, v in TINY.items() if k != "num_key_value_heads"}, "GPTNeoXMLP"),
    "falcon": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                    **NO_SPECIAL_TOKENS), "GPTNeoXMLP"),
    "nemotron": ("NemotronConfig", {**TINY, **NO_SPECIAL_TOKENS}, "UpDownMLP"),
    "arcee": ("ArceeConfig", TINY, "UpDownMLP"),
    "phi": ("PhiConfig", {**TINY, **NO_SPECIAL_TOKENS}, "Fc1Fc2MLP"),
    "gpt2": ("GPT2Config", GPT, "GPT2MLP"),
    "gpt_bigcode": ("GPTBigCodeConfig", GPT, "GPT2MLP"),
    "gptj": ("GPTJConfig", {**GPT, "rotary_dim": 8}, "GPTJMLP"),
    # BERT's MLP is BertIntermediate + BertOutput: the first half (dense + activation) is fused.
    "bert": ("BertConfig", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                vocab_size=128), "BertIntermediate"),
}
# fp32 on CPU: the fused op and the module compute the same sums, possibly in another
# order (and tanh-GELU as F.gelu instead of its written-out formula): ~1e-7 relative per
# layer. 1e-5 leaves margin; a wrong activation or a dropped bias is off by >1e-3.
FP32_BOUND = 1e-5


@pytest.fixture(autouse=True)
def _clean(fused_mlp):
    fused_mlp.layers.reset_counters()
    yield
    fused_mlp.mapping.unpatch()


def build(family, device="cpu", dtype=torch.float32):
    import transformers

    cfg_name, kwargs, _ = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(0)
    auto = transformers.AutoModelForMaskedLM if family == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(cfg, attn_implementation="eager")
    return model.to(device, dtype).eval()


def inputs(device="cpu"):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 128, (2, 9), generator=g).to(device)


def mlp_paths(model):
    """The modules a family's layer replaces: its *MLP modules (BERT: its BertIntermediate)."""
    return {p for p, m in model.named_modules()
            if type(m).__name__.endswith("MLP") or type(m).__name__ == "BertIntermediate"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_cpu(fused_mlp, family):
    from kernels import Mode

    expected = FAMILIES[family][2]
    model = build(family)
    x = inputs()
    with torch.no_grad():
        ref = model(x).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    replaced = fused_mlp.mapping.kernelized_modules(model)
    with torch.no_grad():
        out = model(x).logits
    paths = mlp_paths(model)
    assert len(paths) == 2
    assert replaced == {p: expected for p in paths}
    assert fused_mlp.layers.FUSED_CALLS == {expected: len(paths)}
    assert fused_mlp.layers.ORIGINAL_CALLS == {}
    assert rel_err(out, ref) < FP32_BOUND


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", [f for f, v in FAMILIES.items() if v[2] is not None])
def test_family_cuda_bf16(fused_mlp, family):
    from kernels import Mode

    expected = FAMILIES[family][2]
    model = build(family, "cuda", torch.bfloat16)
    x = inputs("cuda")
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x).logits
        eager = model(x).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cuda")
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    with torch.no_grad():
        out = model(x).logits
    assert fused_mlp.layers.FUSED_CALLS == {expected: 2}
    # bf16: against the same (bf16) weights in float64, no less accurate than eager bf16
    # up to 2x (the fused kernel may keep the hidden activations in fp32 or round them).
    assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-3


# ----------------------------------------------------------------------------- coverage


def _transformers_models_dir() -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models"


def _inline(fn: ast.FunctionDef):
    """This test's own (deliberately simple) reading of a forward: the returned expression
    with single-name assignments substituted, x renamed X; None for anything else."""
    args = [a.arg for a in fn.args.args]
    if len(args) != 2 or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        return None
    env = {args[1]: "X"}
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]

    def text(e):
        class Sub(ast.NodeTransformer):
            def visit_Name(self, n):
                return ast.Name(id=env[n.id], ctx=n.ctx) if n.id in env else n
        return ast.unparse(Sub().visit(copy.deepcopy(e)))

    for s in body:
        if isinstance(s, (ast.Assign, ast.AnnAssign)):
            tgt = s.targets[0] if isinstance(s, ast.Assign) else s.target
            if not isinstance(tgt, ast.Name) or s.value is None:
                return None
            env[tgt.id] = f"({text(s.value)})"
        elif isinstance(s, ast.Return):
            return ast.unparse(ast.parse(text(s.value), mode="eval"))
        else:
            return None
    return None


# Forms this test knows to be exactly a fused-mlp layer's function (with the attributes
# the forward names, assigned in __init__), and the layer.
KNOWN_COMPATIBLE = {
    "self.down_proj(self.act_fn(self.gate_proj(X)) * self.up_proj(X))": "GatedMLP",
    "self.down_proj(self.act_fn(self.up_proj(X)))": "UpDownMLP",
    "self.fc2(self.activation_fn(self.fc1(X)))": "Fc1Fc2MLP",
    "self.linear_fc2(self.act_fn(self.linear_fc1(X)))": "Qwen3VLVisionMLP",
    "self.dense_4h_to_h(self.act(self.dense_h_to_4h(X)))": "GPTNeoXMLP",
    "self.dropout(self.c_proj(self.act(self.c_fc(X))))": "GPT2MLP",
    "self.dropout(self.fc_out(self.act(self.fc_in(X))))": "GPTJMLP",
    "self.w2(F.silu(self.w1(X)) * self.w3(X))": "Lfm2MLP",
    "self.down_proj(self.activation_fn(self.gate_proj(X)) * self.up_proj(X))": "Llama4TextMLP",
}
PACKED_PHI3_BODY = [
    "up_states = self.gate_up_proj(hidden_states)",
    "gate, up_states = up_states.chunk(2, dim=-1)",
    "up_states = up_states * self.activation_fn(gate)",
    "return self.down_proj(up_states)",
]
# Look-alikes: one more op than the layer computes. Handling any of them would be a bug.
MUST_NOT_HANDLE = {
    "BitNetMLP",  # ffn_sub_norm between the halves
    "FalconH1MLP",  # gate / down multipliers
    "DeepseekV4MLP",  # clamps
    "Step3p7MLP",  # clamps
    "Glm5NextTextMLP",  # clamps
    "BeamMLP",  # float32 casts
    "InklingMLP",  # global scale
    "DoryMLP",  # extra scales and a norm
    "MoonshineDecoderMLP",  # packed with the gate in the second half
    "Gemma3nTextMLP",  # activation sparsity branch
    "T5GemmaMLP",  # dropout between the halves
    "MptMLP",  # residual inside, extra argument
    "EsmFoldResidueMLP",  # residual
    "TimesFmMLP",  # norm, padding, residual
    "BloomMLP",  # residual and dropout-add, extra argument
}


def _init_attrs(cls: ast.ClassDef) -> set[str]:
    out = set()
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for n in ast.walk(item):
                if isinstance(n, (ast.Assign, ast.AnnAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            out.add(t.attr)
    return out


def _self_attrs(fn: ast.FunctionDef) -> set[str]:
    return {n.attr for n in ast.walk(fn)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == fn.args.args[0].arg}


_CLASS_LINE = re.compile(r"^class (\w+)\b", re.M)
_TOP_LEVEL_LINE = re.compile(r"\n(?=[^\s#)\]}])")


def _class_defs(text: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module source, parsing only the *MLP classes and the
    classes they may inherit from (whole-file parsing of ~540 files is the slow part);
    the whole file is parsed when a slice does not parse on its own."""
    starts = [(m.start(), m.group(1)) for m in _CLASS_LINE.finditer(text)]
    out = {}
    for i, (pos, name) in enumerate(starts):
        if not name.endswith("MLP") and f"({name})" not in text:
            continue
        nxt = _TOP_LEVEL_LINE.search(text, pos + 1)  # the next line at column 0 ends the class
        end = nxt.start() + 1 if nxt is not None else len(text)
        try:
            body = ast.parse(text[pos:end]).body
        except SyntaxError:
            body = []
        if len(body) != 1 or not isinstance(body[0], ast.ClassDef) or body[0].name != name:
            tree = ast.parse(text)
            return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        out[name] = body[0]
    return out


def _scan(mapping):
    rows = []  # (file, class, handled layer or None, known layer or None)
    for path in sorted(_transformers_models_dir().glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        if "MLP" not in text:
            continue
        classes = _class_defs(text)
        for name, node in classes.items():
            if not name.endswith("MLP"):
                continue
            cur, fwd, init = node, None, set()
            while cur is not None:  # follow same-file bases for an inherited forward
                init |= _init_attrs(cur)
                fwd = next((i for i in cur.body if isinstance(i, ast.FunctionDef) and i.name == "forward"), None)
                if fwd is not None:
                    break
                base = cur.bases[0] if cur.bases else None
                cur = classes.get(base.id) if isinstance(base, ast.Name) else None
            if fwd is None:
                rows.append((path.parent.name, name, None, None))
                continue
            known = KNOWN_COMPATIBLE.get(_inline(fwd))
            body = [ast.unparse(s) for s in fwd.body]
            if body == PACKED_PHI3_BODY:
                known = "PackedGatedMLP"
            if known is not None and not (_self_attrs(fwd) - {"dropout"}) <= init:
                known = None  # the projections come from elsewhere: not the plain form
            rows.append((path.parent.name, name, mapping.layer_for_forward(fwd), known))
    return rows


def test_transformers_mlp_coverage(fused_mlp):
    rows = _scan(fused_mlp.mapping)
    assert len(rows) > 100, "found too few *MLP classes: is transformers installed as expected?"
    handled = [r for r in rows if r[2] is not None]
    by_layer = collections.Counter(r[2] for r in handled)
    unhandled = sorted(r[1] for r in rows if r[2] is None)
    print(f"\ntransformers *MLP classes: {len(rows)}, handled: {len(handled)} "
          f"({100 * len(handled) / len(rows):.0f}%)")
    for layer, n in by_layer.most_common():
        print(f"  {layer:22s} {n}")
    print(f"  not handled ({len(unhandled)}): {', '.join(unhandled)}")

    missed = [(r[0], r[1], r[3]) for r in rows if r[3] is not None and r[2] != r[3]]
    assert not missed, f"known-compatible classes not handled (or handled as another layer): {missed}"

    names = {r[1]: r[2] for r in rows}
    wrongly = sorted(n for n in MUST_NOT_HANDLE if names.get(n) is not None)
    assert not wrongly, f"look-alikes handled as a fused layer: {wrongly}"
    assert MUST_NOT_HANDLE <= set(names), sorted(MUST_NOT_HANDLE - set(names))

    table = fused_mlp.mapping.LAYER_FOR_CLASS
    missing = sorted(n for n in table if n not in names)
    assert not missing, f"table entries that are not transformers *MLP classes: {missing}"
    mismatched = sorted((n, table[n], names[n]) for n in table if names[n] != table[n])
    assert not mismatched, f"table entries whose forward does not match their layer: {mismatched}"

    # The families of test_family_cpu, through the import path (inspect on the class).
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.gpt2.modeling_gpt2 as gpt2
    import transformers.models.phi3.modeling_phi3 as phi3

    assert fused_mlp.mapping.layer_for_class(llama.LlamaMLP) == "GatedMLP"
    assert fused_mlp.mapping.layer_for_class(gpt2.GPT2MLP) == "GPT2MLP"
    assert fused_mlp.mapping.layer_for_class(phi3.Phi3MLP) == "PackedGatedMLP"

    # BERT's first MLP half, and the encoders that copy its forward; not its second half.
    import transformers.models.bert.modeling_bert as bert
    import transformers.models.electra.modeling_electra as electra
    import transformers.models.roberta.modeling_roberta as roberta

    assert fused_mlp.mapping.layer_for_class(bert.BertIntermediate) == "BertIntermediate"
    assert fused_mlp.mapping.layer_for_class(roberta.RobertaIntermediate) == "BertIntermediate"
    assert fused_mlp.mapping.layer_for_class(electra.ElectraIntermediate) == "BertIntermediate"
    assert fused_mlp.mapping.layer_for_class(bert.BertOutput) is None
