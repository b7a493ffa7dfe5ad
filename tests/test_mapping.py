"""fused_mlp.mapping: which classes are handled, tagging, the kernel mapping, kernelize
(inference, training, torch.compile), and the transformers KernelConfig route (GPU).

The layers are loaded the way users load them: through kernels (LayerRepository
"org/fused-mlp" v1), which resolves to the same staged build as the `fused_mlp` fixture.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import HAS_CUDA, REPO_ID, package_op_calls, recording_backend, rel_err

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
# fp32 on CPU: the fused op and the module compute the same sums, possibly in another
# order: ~1e-7 relative per layer. 1e-5 leaves margin; a wrong activation is off by >1e-2.
FP32_BOUND = 1e-5


@pytest.fixture(autouse=True)
def _clean(fused_mlp):
    fused_mlp.layers.reset_counters()
    yield
    fused_mlp.mapping.unpatch()  # tags live on transformers' classes: leave none behind


def tiny_llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **kw})).eval()


def tiny_gpt2(**kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(GPT2Config(**{**cfg, **kw})).eval()


def ids(batch=2, seq=7):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 128, (batch, seq), generator=g)


def mlp_paths(model):
    return {p for p, m in model.named_modules() if type(m).__name__.endswith("MLP")}


# ----------------------------------------------------------------------------- import hygiene


def test_package_imports_neither_transformers_nor_kernels(fused_mlp):
    pkg = Path(fused_mlp.__file__).parent
    code = textwrap.dedent(f"""
        import importlib.util, sys
        name = {fused_mlp.__name__!r}
        spec = importlib.util.spec_from_file_location(
            name, {str(pkg / "__init__.py")!r}, submodule_search_locations=[{str(pkg)!r}])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        assert hasattr(mod.mapping, "kernelize") and hasattr(mod.layers, "GatedMLP")
        bad = [m for m in ("transformers", "kernels") if m in sys.modules]
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- matching

LLAMA_FORMS = [
    "def forward(self, x):\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    # temporaries, annotations, a docstring, other names, operands swapped
    '''def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        """doc"""
        gate: torch.Tensor = self.act_fn(self.gate_proj(hidden_state))
        up = self.up_proj(hidden_state)
        down_proj = self.down_proj(up * gate)
        return down_proj''',
    "def forward(me, x):\n    return me.down_proj(me.act_fn(me.gate_proj(x)) * me.up_proj(x))",
]

NOT_LLAMA = [
    # one more scale / clamp / cast / norm / branch / argument / side effect
    "def forward(self, x):\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * self.scale",
    "def forward(self, x):\n    return self.down_proj(self.act_fn(self.gate_proj(x).clamp(max=7)) * self.up_proj(x))",
    "def forward(self, x):\n    return self.down_proj((self.act_fn(self.gate_proj(x).float()) * self.up_proj(x).float()).to(x.dtype))",
    "def forward(self, x):\n    return self.down_proj(self.norm(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))",
    "def forward(self, x):\n    if self.flag:\n        x = x * 2\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    "def forward(self, x, scale):\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    "def forward(self, x):\n    self.log(x)\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    "def forward(self, x):\n    unused = self.cache(x)\n    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
    # gate and up swapped: act on the other projection
    "def forward(self, x):\n    return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))",
    "def forward(self, x):\n    return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))",
]


@pytest.mark.parametrize("src", LLAMA_FORMS)
def test_llama_forms_match(fused_mlp, src):
    assert fused_mlp.mapping.layer_for_source(src) == "GatedMLP"


@pytest.mark.parametrize("src", NOT_LLAMA)
def test_look_alikes_do_not_match(fused_mlp, src):
    assert fused_mlp.mapping.layer_for_source(src) is None


BERT_INTERMEDIATE_FORMS = [
    "def forward(self, x):\n    return self.intermediate_act_fn(self.dense(x))",
    # transformers' BertIntermediate writes it with one name reassigned
    '''def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states''',
]

NOT_BERT_INTERMEDIATE = [
    "def forward(self, x):\n    return self.dropout(self.intermediate_act_fn(self.dense(x)))",
    "def forward(self, x):\n    return self.intermediate_act_fn(self.dense(x)) + x",
    "def forward(self, x):\n    return self.LayerNorm(self.dropout(self.dense(x)) + x)",
]


@pytest.mark.parametrize("src", BERT_INTERMEDIATE_FORMS)
def test_bert_intermediate_forms_match(fused_mlp, src):
    assert fused_mlp.mapping.layer_for_source(src) == "BertIntermediate"


@pytest.mark.parametrize("src", NOT_BERT_INTERMEDIATE)
def test_bert_look_alikes_do_not_match(fused_mlp, src):
    assert fused_mlp.mapping.layer_for_source(src) is None


def test_packed_forms(fused_mlp):
    phi3 = '''def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)
        return self.down_proj(up_states)'''
    moonshine = '''def forward(self, hidden_states):
        hidden_states = self.gate_up_proj(hidden_states)
        hidden_states, gate = hidden_states.chunk(2, dim=-1)
        hidden_states = self.activation_fn(gate) * hidden_states
        return self.down_proj(hidden_states)'''  # gate is the second half: not Phi-3's layout
    assert fused_mlp.mapping.layer_for_source(phi3) == "PackedGatedMLP"
    assert fused_mlp.mapping.layer_for_source(moonshine) is None


def _load_module(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_layer_for_class_outside_transformers(fused_mlp, tmp_path):
    mod = _load_module(tmp_path, "my_models_for_fused_mlp_test", """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class MyFeedForward(nn.Module):          # a new family, Llama-style: matched by structure
            def forward(self, x):
                return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

        class LlamaMLP(nn.Module):               # a namesake of a table entry, another formula
            def forward(self, x):
                return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 2)

        class Lfm2Like(nn.Module):
            def forward(self, x):
                return self.w2(F.silu(self.w1(x)) * self.w3(x))
    """)
    other = _load_module(tmp_path, "my_models_other_f", """
        import types, torch
        from torch import nn
        F = types.SimpleNamespace(silu=torch.tanh)   # `F` is not torch.nn.functional here

        class Lfm2Like(nn.Module):
            def forward(self, x):
                return self.w2(F.silu(self.w1(x)) * self.w3(x))
    """)
    m = fused_mlp.mapping
    assert m.layer_for_class(mod.MyFeedForward) == "GatedMLP"
    assert m.layer_for_class(mod.LlamaMLP) is None
    assert m.layer_for_class(mod.Lfm2Like) == "Lfm2MLP"
    assert m.layer_for_class(other.Lfm2Like) is None


def test_subclass_with_other_forward_is_not_kernelized(fused_mlp):
    from kernels import Mode
    from transformers.models.llama.modeling_llama import LlamaMLP

    class ScaledMLP(LlamaMLP):  # inherits LlamaMLP's tag, not its forward
        def forward(self, x):
            return super().forward(x) * 0.5

    model = tiny_llama()
    model.model.layers[1].mlp = ScaledMLP(model.config)
    ref = model(ids()).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert fused_mlp.mapping.kernelized_modules(model) == {"model.layers.0.mlp": "GatedMLP"}
    assert not fused_mlp.mapping.kernel_condition(model.model.layers[1].mlp)
    assert rel_err(model(ids()).logits, ref) < FP32_BOUND


# ----------------------------------------------------------------------------- tagging


def test_patch_and_unpatch(fused_mlp):
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = tiny_llama()
    assert fused_mlp.mapping.patch(model) == {"LlamaMLP": "GatedMLP"}
    assert LlamaMLP.kernel_layer_name == "GatedMLP"
    assert fused_mlp.mapping.unpatch(model) == ["LlamaMLP"]
    assert not hasattr(LlamaMLP, "kernel_layer_name")


def test_patch_respects_other_tags(fused_mlp):
    from kernels import replace_kernel_forward_from_hub
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Config, Qwen2ForCausalLM, Qwen2MLP

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY))
    replace_kernel_forward_from_hub(Qwen2MLP, "SomeoneElsesMLP")
    try:
        assert fused_mlp.mapping.patch(model) == {}
        assert Qwen2MLP.kernel_layer_name == "SomeoneElsesMLP"
        assert fused_mlp.mapping.patch(model, force=True) == {"Qwen2MLP": "GatedMLP"}
    finally:
        fused_mlp.mapping.unpatch([Qwen2MLP])
        for attr in ("kernel_layer_name", "kernel_condition"):
            if attr in Qwen2MLP.__dict__:
                delattr(Qwen2MLP, attr)


# ----------------------------------------------------------------------------- mapping


def test_kernel_mapping_shape(fused_mlp):
    from kernels import LayerRepository, LocalLayerRepository, Mode

    m = fused_mlp.mapping
    mapping = m.kernel_mapping()
    assert set(mapping) == set(m.LAYERS)
    modes = {Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE}
    for name, per_device in mapping.items():
        assert set(per_device) == {"cuda", "cpu"}
        for per_mode in per_device.values():
            assert set(per_mode) == modes
            repo = next(iter(per_mode.values()))
            assert repo == LayerRepository(REPO_ID, layer_name=name, version=1)

    local = m.kernel_mapping(local_path="/some/build", devices=("cuda",), modes=(Mode.INFERENCE,), layers=["GatedMLP"])
    repo = local["GatedMLP"]["cuda"][Mode.INFERENCE]
    assert isinstance(repo, LocalLayerRepository) and repo.layer_name == "GatedMLP"
    assert repo == LocalLayerRepository(repo_path=Path("/some/build"), layer_name="GatedMLP")

    pinned = m.kernel_mapping(revision="abc123", layers=["GPT2MLP"])
    assert pinned["GPT2MLP"]["cpu"][Mode.INFERENCE] == LayerRepository(REPO_ID, layer_name="GPT2MLP", revision="abc123")
    with pytest.raises(ValueError, match="unknown fused-mlp layers"):
        m.kernel_mapping(layers=["NoSuchLayer"])


def test_layer_repository_resolves_to_the_fixture_build(fused_mlp):
    """LayerRepository("org/fused-mlp", version=1) goes through the same (offline) cache."""
    from kernels import LayerRepository

    for name in ("GatedMLP", "GPT2MLP", "SiluAndMul"):
        layer = LayerRepository(REPO_ID, layer_name=name, version=1).load()
        assert layer is getattr(fused_mlp.layers, name)


# ----------------------------------------------------------------------------- kernelize


def test_kernelize_inference_cpu(fused_mlp):
    from kernels import Mode

    model = tiny_llama()
    ref = model(ids()).logits
    out_model = fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert out_model is model
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    with torch.no_grad():
        out = model(ids()).logits
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert rel_err(out, ref) < FP32_BOUND


def test_kernelize_with_tagged_activation(fused_mlp):
    """The transformers releases that accept the installed kernels tag their activations
    (SiLUActivation is "SiLU"); kernelize, finding no kernel for them, binds each one's own
    class forward on the instance (kernels 0.19: leaves the class's). That is still the
    activation's function: the MLP fuses.
    (Found on the GPU with transformers 5.22.2: every MLP fell back to the original.)"""
    import kernels
    from kernels import Mode
    from transformers.activations import SiLUActivation

    model = tiny_llama()
    ref = model(ids()).logits
    had = "kernel_layer_name" in SiLUActivation.__dict__
    if not had:
        kernels.replace_kernel_forward_from_hub(SiLUActivation, "SiLU")
    try:
        fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    finally:
        if not had:  # leave the class as this transformers defines it
            for attr in ("kernel_layer_name", "kernel_condition"):
                if attr in SiLUActivation.__dict__:
                    delattr(SiLUActivation, attr)
    act = model.model.layers[0].mlp.act_fn
    # What kernelize did to the activation: kernels < 0.19 binds the class's forward on the
    # instance, 0.19 removes any forward from the instance. Either way the MLP fuses.
    from packaging.version import Version

    assert ("forward" in act.__dict__) == (Version(kernels.__version__) < Version("0.19"))
    with torch.no_grad():
        out = model(ids()).logits
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert rel_err(out, ref) < FP32_BOUND
    # Any other forward on the instance is not assumed to compute SiLU.
    for layer in model.model.layers:
        layer.mlp.act_fn.forward = lambda x: torch.nn.functional.gelu(x)
    fused_mlp.layers.reset_counters()
    with torch.no_grad():
        model(ids())
    assert fused_mlp.layers.FUSED_CALLS == {} and fused_mlp.layers.ORIGINAL_CALLS == {"GatedMLP": 2}


def test_kernelize_from_local_path(fused_mlp):
    """local_path: LocalLayerRepository on a variant directory (here the fixture's own)."""
    from kernels import Mode

    model = tiny_llama()
    ref = model(ids()).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu",
                                local_path=Path(fused_mlp.__file__).parent)
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    assert rel_err(model(ids()).logits, ref) < FP32_BOUND
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2}


def test_kernelize_with_kernels_directly(fused_mlp):
    """The two-step form: patch, then kernels.kernelize under the mapping."""
    import kernels

    model = tiny_gpt2()
    ref = model(ids()).logits
    assert fused_mlp.mapping.patch(model) == {"GPT2MLP": "GPT2MLP"}
    with kernels.use_kernel_mapping(fused_mlp.mapping.kernel_mapping(devices=("cpu",))):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    assert rel_err(model(ids()).logits, ref) < FP32_BOUND
    assert fused_mlp.layers.FUSED_CALLS == {"GPT2MLP": 2}


def test_unsupported_activation_keeps_original_forward(fused_mlp):
    from kernels import Mode

    model = tiny_llama(hidden_act="tanh")
    ref = model(ids()).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert fused_mlp.mapping.kernelized_modules(model) == {}
    torch.testing.assert_close(model(ids()).logits, ref, rtol=0, atol=0)
    assert fused_mlp.layers.FUSED_CALLS == {} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert "lacks plain projections or a supported activation" in fused_mlp.mapping.explain(model)["LlamaMLP"]


def test_custom_activation_module_keeps_original_forward(fused_mlp):
    from kernels import Mode

    class Swish2(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(2 * x)

    model = tiny_llama()
    model.model.layers[0].mlp.act_fn = Swish2()
    ref = model(ids()).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert fused_mlp.mapping.kernelized_modules(model) == {"model.layers.1.mlp": "GatedMLP"}
    assert rel_err(model(ids()).logits, ref) < FP32_BOUND
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}


def test_compile_fullgraph(fused_mlp):
    """torch.compile(fullgraph=True) traces the kernelized model with no graph break.
    aot_eager runs dynamo + AOTAutograd with fake tensors (what matters for the layers)
    without inductor's C++ build of the whole model; one MLP goes through inductor."""
    from kernels import Mode

    model = tiny_llama()
    ref = model(ids()).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, fullgraph=True, backend=recording_backend(graphs))
    with torch.no_grad():
        out = compiled(ids()).logits
        first = len(graphs)
        again = compiled(ids()).logits
    assert rel_err(out, ref) < FP32_BOUND and torch.equal(out, again)
    assert len(graphs) == first, "the second call of one shape compiled again"
    assert package_op_calls(fused_mlp, graphs) == {"gated_mlp": 2}

    mlp = model.model.layers[0].mlp
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        expect = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        got = torch.compile(mlp, fullgraph=True)(x)
    assert rel_err(got, expect) < FP32_BOUND


def test_inference_mode_and_dynamic_shapes(fused_mlp):
    """Under torch.inference_mode (inference tensors), and compiled with dynamic=True: one
    graph serves three sequence lengths, the fused path traced, the unpatched logits."""
    from kernels import Mode

    base = tiny_llama()
    model = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
    with torch.inference_mode():
        assert rel_err(model(ids()).logits, base(ids()).logits) < FP32_BOUND
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2}
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=recording_backend(graphs))
    with torch.no_grad():
        for seq in (5, 9, 13):
            x = ids(2, seq)
            assert rel_err(compiled(x).logits, base(x).logits) < FP32_BOUND, seq
            if seq == 5:
                first = len(graphs)  # what the first call made
    assert len(graphs) == first, f"{len(graphs) - first} more graphs for two more sequence lengths"
    assert package_op_calls(fused_mlp, graphs) == {"gated_mlp": 2}


@pytest.mark.parametrize("strict", [False, True])
def test_export(fused_mlp, strict):
    """torch.export of a kernelized MLP, non-strict (the default: fake tensors without
    dynamo) and strict: the exported program calls the fused op and computes the original."""
    from kernels import Mode
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=96, hidden_act="silu")).eval()
    original = copy.deepcopy(mlp)
    fused_mlp.mapping.kernelize(mlp, mode=Mode.INFERENCE, device="cpu")
    with torch.no_grad():
        program = torch.export.export(mlp, (torch.randn(2, 5, 64),), strict=strict)
        x = torch.randn(2, 5, 64)
        assert rel_err(program.module()(x), original(x)) < FP32_BOUND
    calls = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert calls == [f"{fused_mlp.ops.name}.gated_mlp.default"], calls


def test_gradient_checkpointing(fused_mlp):
    """Mode.TRAINING with transformers' gradient checkpointing (reentrant: the layers run
    again in the backward): fused both times, the unpatched model's gradients."""
    from kernels import Mode

    base = tiny_llama().train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cpu")
    for m in (base, patched):
        if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5.24's name
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        else:  # the older name, deprecated since (removed in v6)
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        m.enable_input_require_grads()
    _, g_ref = _train_step(base, ids())
    _, g = _train_step(patched, ids())
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 4} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        assert rel_err(g[name], g_ref[name]) < 1e-4, name


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _train_step(model, inputs):
    model.zero_grad()
    loss = model(inputs, labels=inputs).loss
    loss.backward()
    return loss.detach(), _grads(model)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_training_backward_matches(fused_mlp, family):
    """Mode.TRAINING: a backward step through the layers gives the unpatched model's gradients."""
    from kernels import Mode

    # GPT-2 with its dropouts at 0 so that the training step is deterministic and fused.
    base = tiny_llama() if family == "llama" else tiny_gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base.train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cpu")
    assert set(fused_mlp.mapping.kernelized_modules(patched)) == mlp_paths(patched)
    loss_ref, g_ref = _train_step(base, ids())
    loss, g = _train_step(patched, ids())
    assert sum(fused_mlp.layers.FUSED_CALLS.values()) == 2 and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert abs(loss.item() - loss_ref.item()) < 1e-5 * max(1.0, abs(loss_ref.item()))
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        assert rel_err(g[name], g_ref[name]) < 1e-4, name  # fp32 gradients, reference backward


def test_bert_training_backward_matches(fused_mlp):
    """Mode.TRAINING on BERT: the BertIntermediate modules run linear_act, whose backward
    gives the unpatched model's loss and gradients."""
    from kernels import Mode
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base = BertForMaskedLM(cfg).train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cpu")
    inter = {p for p, m in patched.named_modules() if type(m).__name__ == "BertIntermediate"}
    assert len(inter) == 2 and fused_mlp.mapping.kernelized_modules(patched) == dict.fromkeys(inter, "BertIntermediate")
    loss_ref, g_ref = _train_step(base, ids())
    loss, g = _train_step(patched, ids())
    assert fused_mlp.layers.FUSED_CALLS == {"BertIntermediate": 2} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert abs(loss.item() - loss_ref.item()) < 1e-5 * max(1.0, abs(loss_ref.item()))
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        # atol: the attention key bias's gradient is zero in exact arithmetic (rounding noise).
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-4, atol=1e-8, msg=name)


def test_training_compile_backward(fused_mlp):
    """Mode.TRAINING | TORCH_COMPILE: forward and backward traced in one graph each."""
    from kernels import Mode

    base = tiny_llama().train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu")
    assert set(fused_mlp.mapping.kernelized_modules(patched)) == mlp_paths(patched)
    torch._dynamo.reset()
    compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")
    _, g_ref = _train_step(base, ids())
    patched.zero_grad()
    compiled(ids(), labels=ids()).loss.backward()
    g = _grads(patched)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        assert rel_err(g[name], g_ref[name]) < 1e-4, name


def _autocast_step(model, inputs, device_type):
    model.zero_grad()
    with torch.autocast(device_type, dtype=torch.bfloat16):
        loss = model(inputs, labels=inputs).loss
    loss.backward()
    return loss.detach(), _grads(model)


def test_autocast_training_step(fused_mlp):
    """A float32 model trained under autocast (as Trainer's bf16=True does it): the MLPs run
    fused in bf16, the float32 parameters get gradients within bf16's bound of the
    unpatched model's; and torch.compile(fullgraph=True) traces the same step."""
    from kernels import Mode

    base = tiny_llama().train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu")
    loss_ref, g_ref = _autocast_step(base, ids(), "cpu")
    loss, g = _autocast_step(patched, ids(), "cpu")
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert abs(loss.item() - loss_ref.item()) < 1e-2 * abs(loss_ref.item())
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        assert g[name].dtype == torch.float32 and rel_err(g[name], g_ref[name]) < 3e-2, name
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(patched, fullgraph=True, backend=recording_backend(graphs))
    loss_c, _ = _autocast_step(compiled, ids(), "cpu")
    g_c = _grads(patched)  # by the parameters' own names (the compiled wrapper prefixes them)
    assert package_op_calls(fused_mlp, graphs) == {"gated_mlp_train": 2}
    assert abs(loss_c.item() - loss_ref.item()) < 1e-2 * abs(loss_ref.item())
    for name in g_ref:
        assert rel_err(g_c[name], g_ref[name]) < 3e-2, name


def test_func_grad_of_kernelized_model(fused_mlp):
    """torch.func.grad over torch.func.functional_call of a kernelized model (per-sample
    gradients, meta-learning): the layers hand the call to the original computation, so the
    gradients are the unpatched model's bit for bit; outside the transform it runs fused."""
    from kernels import Mode

    base = tiny_llama().train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cpu")
    x = ids()
    params = {k: v.detach() for k, v in base.named_parameters()}

    def loss_of(model):
        return lambda p: torch.func.functional_call(model, p, (x,)).logits.square().mean()

    want = torch.func.grad(loss_of(base))(params)
    got = torch.func.grad(loss_of(patched))(params)
    assert fused_mlp.layers.ORIGINAL_CALLS == {"GatedMLP": 2} and fused_mlp.layers.FUSED_CALLS == {}
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    patched(x)
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2}


def test_forward_ad_through_kernelized_model(fused_mlp):
    """A forward-mode AD dual level around a kernelized model (a JVP along the input
    embeddings): the layers run the original computation, the logits' tangent is the
    unpatched model's."""
    import torch.autograd.forward_ad as fwad
    from kernels import Mode

    base = tiny_llama(attn_implementation="eager")  # torch's CPU SDPA has no forward AD
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.INFERENCE, device="cpu")
    embeds = base.get_input_embeddings()(ids()).detach()
    tangent = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(2))
    tangents = []
    for model in (base, patched):
        with torch.no_grad(), fwad.dual_level():
            logits = model(inputs_embeds=fwad.make_dual(embeds, tangent)).logits
            tangents.append(fwad.unpack_dual(logits).tangent)
    assert fused_mlp.layers.ORIGINAL_CALLS == {"GatedMLP": 2} and fused_mlp.layers.FUSED_CALLS == {}
    torch.testing.assert_close(tangents[1], tangents[0], rtol=0, atol=0)


def test_active_dropout_runs_original_in_model(fused_mlp):
    """GPT-2 in training with resid_pdrop > 0: the MLP dropout is live, so the layers run the
    original computation: same ops, same random numbers, bitwise the unpatched output."""
    from kernels import Mode

    base = tiny_gpt2(resid_pdrop=0.1).train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cpu")
    assert set(fused_mlp.mapping.kernelized_modules(patched)) == mlp_paths(patched)
    torch.manual_seed(5)
    ref = base(ids()).logits
    torch.manual_seed(5)
    out = patched(ids()).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert fused_mlp.layers.ORIGINAL_CALLS == {"GPT2MLP": 2} and fused_mlp.layers.FUSED_CALLS == {}
    patched.eval()  # dropout off: fused
    with torch.no_grad():
        patched(ids())
    assert fused_mlp.layers.FUSED_CALLS == {"GPT2MLP": 2}


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_kernelize_cuda_bf16(fused_mlp):
    from kernels import Mode

    model = tiny_llama(hidden_size=256, intermediate_size=704).to("cuda", torch.bfloat16)
    x = ids(4, 33).cuda()
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x).logits
        eager = model(x).logits
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE, device="cuda")
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    with torch.no_grad():
        out = model(x).logits
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2}
    # bf16: no less accurate than eager bf16 against the same weights in float64, up to 2x.
    assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_compile_cuda_bf16_one_graph(fused_mlp):
    """A kernelized bf16 model compiled on the GPU (inductor): the fused op in its graph, one
    graph for repeated calls and, with dynamic=True, for other sequence lengths."""
    from kernels import Mode

    model = tiny_llama(hidden_size=256, intermediate_size=704).to("cuda", torch.bfloat16)
    fused_mlp.mapping.kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cuda")
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=recording_backend(graphs, "inductor"))
    with torch.no_grad():
        for i, seq in enumerate((33, 33, 17, 64)):
            x = ids(4, seq).cuda()
            out, eager = compiled(x).logits, model(x).logits
            assert rel_err(out, eager) < 3e-2, seq  # bf16 bound: inductor rounds the rest of the model its own way
            if i == 0:
                first = len(graphs)  # what the first call made
    assert len(graphs) == first, f"{len(graphs) - first} more graphs after the first call"
    assert package_op_calls(fused_mlp, graphs) == {"gated_mlp": 2}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_kernelize_cuda_autocast_training_step(fused_mlp):
    """A float32 model on the GPU trained under autocast bf16: the MLPs run fused (the GPU
    kernels, in bf16), gradients within bf16's bound of the unpatched model's."""
    from kernels import Mode

    base = tiny_llama(hidden_size=256, intermediate_size=704).cuda().train()
    patched = copy.deepcopy(base)
    fused_mlp.mapping.kernelize(patched, mode=Mode.TRAINING, device="cuda")
    x = ids(4, 33).cuda()
    loss_ref, g_ref = _autocast_step(base, x, "cuda")
    loss, g = _autocast_step(patched, x, "cuda")
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2} and fused_mlp.layers.ORIGINAL_CALLS == {}
    assert abs(loss.item() - loss_ref.item()) < 1e-2 * abs(loss_ref.item())
    for name in g_ref:
        assert g[name].dtype == torch.float32 and rel_err(g[name], g_ref[name]) < 3e-2, name


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_transformers_kernel_config_route(fused_mlp):
    """patch(model), then transformers' own use_kernels with a KernelConfig naming our layer."""
    import inspect

    import kernels
    from transformers import KernelConfig

    from transformers.utils import import_utils

    if not import_utils.is_kernels_available():
        # Each transformers release accepts one range of kernels versions and treats others
        # as not installed (use_kernels is then refused): 5.17 takes [0.16, 0.17), 5.20-5.22
        # take [0.17.2, 0.18), 5.23-5.24 take [0.18.2, 0.19), 5.25 requires [0.19.1, 0.20).
        # With kernels 0.17.2, run this test under transformers 5.22.2 (its KernelConfig route
        # accepts GPU devices only).
        wanted = (getattr(import_utils, "KERNELS_MIN_VERSION", "?"), getattr(import_utils, "KERNELS_MAX_VERSION", "?"))
        pytest.skip(f"this transformers wants kernels >= {wanted[0]}, < {wanted[1]}; installed: {kernels.__version__}")
    if "inherit_mapping" not in inspect.signature(KernelConfig).parameters:
        pytest.skip("this transformers' KernelConfig has no inherit_mapping (needed offline)")
    model = tiny_llama(hidden_size=256, intermediate_size=704).to("cuda", torch.bfloat16)
    x = ids(4, 33).cuda()
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x).logits
        eager = model(x).logits
    tagged = fused_mlp.mapping.patch(model)
    assert tagged == {"LlamaMLP": "GatedMLP"}
    # set_use_kernels registers transformers' default mapping globally: keep that inside
    # a scope. inherit_mapping=False: only our layer (the default kernels-community
    # entries need the Hub, and this test runs offline).
    with kernels.use_kernel_mapping({}, inherit_mapping=True):
        config = KernelConfig({"GatedMLP": f"{REPO_ID}:GatedMLP"}, inherit_mapping=False)
        model.set_use_kernels(True, config)
    assert set(fused_mlp.mapping.kernelized_modules(model)) == mlp_paths(model)
    with torch.no_grad():
        out = model(x).logits
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 2}
    assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-3
