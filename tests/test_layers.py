"""fused_mlp.layers: valid Hub layers, activation detection, fused path vs original computation.

Each layer's forward is bound to a small module built here with the attributes the
transformers module has (as kernelize does: MethodType(layer.forward, module)); the
expected output is the transformers formula written out in the test.
"""

from __future__ import annotations

import copy
import inspect
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.pytorch_utils import Conv1D

from conftest import HAS_CUDA, ROOT, package_op_calls, recording_backend, rel_err

D, H = 32, 48


@pytest.fixture(autouse=True)
def _counters(fused_mlp):
    fused_mlp.layers.reset_counters()
    yield


def bind(layer_cls, module):
    module.forward = types.MethodType(layer_cls.forward, module)
    return module


def holder(**attrs) -> nn.Module:
    m = nn.Module()
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def gated_module(act="silu", bias=False, act_attr="act_fn"):
    torch.manual_seed(0)
    return holder(
        gate_proj=nn.Linear(D, H, bias=bias),
        up_proj=nn.Linear(D, H, bias=bias),
        down_proj=nn.Linear(H, D, bias=bias),
        **{act_attr: ACT2FN[act] if isinstance(act, str) else act},
    ).eval()


def gated_ref(m, x, act_attr="act_fn"):
    return m.down_proj(getattr(m, act_attr)(m.gate_proj(x)) * m.up_proj(x))


# ----------------------------------------------------------------------------- hub rules


def test_layer_lists_agree(fused_mlp):
    """Every layer class is listed, has a structure check (else it is never kernelized) and,
    for MLP layers, templates in the mapping."""
    L = fused_mlp.layers
    classes = {n for n in L.__all__ if isinstance(getattr(L, n), type) and issubclass(getattr(L, n), nn.Module)}
    assert classes == set(L.MLP_LAYERS) | set(L.ACTIVATION_LAYERS)
    assert set(L._STRUCTURE) == classes
    assert set(fused_mlp.mapping.TEMPLATES) == set(L.MLP_LAYERS)


def test_layers_follow_kernel_hub_rules(fused_mlp):
    sys.path.insert(0, str(ROOT / "tools"))
    import kernels_compat

    _validate_layer = kernels_compat.layer_module()._validate_layer

    L = fused_mlp.layers
    names = L.MLP_LAYERS + L.ACTIVATION_LAYERS
    assert set(names) <= set(L.__all__)
    base = {n for n, _ in inspect.getmembers(nn.Module)}

    class OneArg(nn.Module):
        def forward(self, x):
            return x

    for name in names:
        cls = getattr(L, name)
        assert issubclass(cls, nn.Module)
        assert cls.__init__ is nn.Module.__init__, name
        extra = {n for n, _ in inspect.getmembers(cls)} - base
        assert extra <= {"can_torch_compile", "has_backward"}, (name, extra)
        assert cls.can_torch_compile is True and cls.has_backward is True
        params = list(inspect.signature(cls.forward).parameters.values())
        assert len(params) == 2 and all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params), name
        _validate_layer(check_cls=OneArg, cls=cls, repo=name)  # what kernelize runs
    # transformers looks for a "<Layer>Layout" class to patch a module's __init__: there is none.
    assert not [n for n in dir(L) if n.endswith("Layout")]


# ----------------------------------------------------------------------------- activations


@pytest.mark.parametrize(
    "act, expected",
    [
        (ACT2FN["silu"], "silu"),
        (ACT2FN["swish"], "silu"),  # nn.SiLU
        (nn.SiLU(), "silu"),
        (ACT2FN["gelu_pytorch_tanh"], "gelu_tanh"),
        (ACT2FN["gelu_python_tanh"], "gelu_tanh"),
        (ACT2FN["gelu_new"], "gelu_tanh"),
        (ACT2FN["gelu_fast"], "gelu_tanh"),
        (ACT2FN["gelu_accurate"], "gelu_tanh"),
        (ACT2FN["gelu"], "gelu"),
        (ACT2FN["gelu_python"], "gelu"),
        (nn.GELU(), "gelu"),
        (nn.GELU(approximate="tanh"), "gelu_tanh"),
        (ACT2FN["quick_gelu"], "quick_gelu"),
        (ACT2FN["relu"], "relu"),
        (ACT2FN["relu2"], "relu2"),
        (ACT2FN["linear"], "identity"),
        (F.silu, "silu"),
        (F.gelu, "gelu"),
        (F.relu, "relu"),
        # not computed exactly by fused-mlp: original computation
        (ACT2FN["tanh"], None),
        (ACT2FN["gelu_10"], None),  # clipped GELU
        (ACT2FN["mish"], None),
        (ACT2FN["sigmoid"], None),
        (ACT2FN["relu6"], None),
        (ACT2FN["leaky_relu"], None),
        (torch.tanh, None),
        (None, None),
    ],
)
def test_activation_name(fused_mlp, act, expected):
    assert fused_mlp.layers.activation_name(act) == expected


def test_activation_name_matches_the_function(fused_mlp):
    """Every recognized activation computes what fused-mlp's name for it means."""
    from_name = fused_mlp.activations.torch_activation
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    for key in ("silu", "swish", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_accurate", "gelu",
                "gelu_python", "quick_gelu", "relu", "relu2", "linear"):
        act = ACT2FN[key]
        name = fused_mlp.layers.activation_name(act)
        torch.testing.assert_close(act(x), from_name(name)(x), rtol=1e-9, atol=1e-9, msg=key)


def test_patched_activation_instance_is_not_trusted(fused_mlp):
    act = ACT2FN["silu"]
    act.forward = torch.tanh  # replaced on the instance: no longer SiLU
    assert fused_mlp.layers.activation_name(act) is None
    hooked = ACT2FN["silu"]
    hooked.register_forward_hook(lambda mod, i, o: o * 2)
    assert fused_mlp.layers.activation_name(hooked) is None


def test_namesake_activation_is_not_trusted(fused_mlp):
    class SiLUActivation(nn.Module):  # same name, defined here: not transformers'
        def forward(self, x):
            return torch.tanh(x)

    assert fused_mlp.layers.activation_name(SiLUActivation()) is None


# ----------------------------------------------------------------------------- fused path


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu", "relu2", "quick_gelu"])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_layer(fused_mlp, act, bias):
    m = gated_module(act, bias)
    x = torch.randn(2, 5, D)
    ref = gated_ref(m, x)
    bind(fused_mlp.layers.GatedMLP, m)
    out = m(x)
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}
    # fp32; the fused op and the module differ only in summation order: ~1e-7.
    assert rel_err(out, ref) < 1e-5


def test_llama4_text_mlp_layer(fused_mlp):
    m = gated_module("silu", act_attr="activation_fn")
    x = torch.randn(7, D)
    ref = gated_ref(m, x, "activation_fn")
    out = bind(fused_mlp.layers.Llama4TextMLP, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"Llama4TextMLP": 1}
    assert rel_err(out, ref) < 1e-5


def test_lfm2_layer(fused_mlp):
    torch.manual_seed(0)
    m = holder(w1=nn.Linear(D, H, bias=False), w3=nn.Linear(D, H, bias=False), w2=nn.Linear(H, D, bias=False))
    x = torch.randn(3, D)
    ref = m.w2(F.silu(m.w1(x)) * m.w3(x))
    out = bind(fused_mlp.layers.Lfm2MLP, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"Lfm2MLP": 1}
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("bias", [False, True])
def test_packed_gated_layers(fused_mlp, bias):
    torch.manual_seed(0)
    m = holder(gate_up_proj=nn.Linear(D, 2 * H, bias=bias), down_proj=nn.Linear(H, D, bias=bias),
               activation_fn=ACT2FN["silu"])
    x = torch.randn(2, 3, D)
    gate, up = m.gate_up_proj(x).chunk(2, dim=-1)
    ref = m.down_proj(up * m.activation_fn(gate))
    out = bind(fused_mlp.layers.PackedGatedMLP, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"PackedGatedMLP": 1}
    assert rel_err(out, ref) < 1e-5

    g = holder(input_linear=nn.Linear(D, 2 * H, bias=bias), output_linear=nn.Linear(H, D, bias=bias),
               activation=ACT2FN["silu"])
    chunks = g.input_linear(x).chunk(2, dim=-1)
    ref = g.output_linear(g.activation(chunks[0]) * chunks[1])
    out = bind(fused_mlp.layers.GraniteMoeSharedMLP, g)(x)
    assert fused_mlp.layers.FUSED_CALLS["GraniteMoeSharedMLP"] == 1
    assert rel_err(out, ref) < 1e-5


def _plain(fc, proj, act, fc_name, proj_name, act_name, **extra):
    torch.manual_seed(0)
    return holder(**{fc_name: fc, proj_name: proj, act_name: ACT2FN[act]}, **extra).eval()


PLAIN_CASES = [
    # layer, fc attr, proj attr, act attr, projection kind, activation, extra attributes
    ("UpDownMLP", "up_proj", "down_proj", "act_fn", "linear", "relu2", {}),
    ("Fc1Fc2MLP", "fc1", "fc2", "activation_fn", "linear", "quick_gelu", {}),
    ("Qwen3VLVisionMLP", "linear_fc1", "linear_fc2", "act_fn", "linear", "gelu_pytorch_tanh", {}),
    ("GPTNeoXMLP", "dense_h_to_4h", "dense_4h_to_h", "act", "linear", "gelu", {}),
    ("GPT2MLP", "c_fc", "c_proj", "act", "conv1d", "gelu_new", {"dropout": nn.Dropout(0.1)}),
    ("GPT2MLP", "c_fc", "c_proj", "act", "linear", "gelu_pytorch_tanh", {"dropout": nn.Dropout(0.1)}),
    ("GPTJMLP", "fc_in", "fc_out", "act", "linear", "gelu_new", {"dropout": nn.Dropout(0.1)}),
    ("Starcoder2MLP", "c_fc", "c_proj", "act", "linear", "gelu_pytorch_tanh", {"residual_dropout": 0.1}),
]


def _projections(kind, bias=True):
    torch.manual_seed(0)
    if kind == "conv1d":
        return Conv1D(H, D), Conv1D(D, H)
    return nn.Linear(D, H, bias=bias), nn.Linear(H, D, bias=bias)


@pytest.mark.parametrize("case", PLAIN_CASES, ids=lambda c: f"{c[0]}-{c[4]}")
def test_plain_mlp_layers(fused_mlp, case):
    layer, fc_name, proj_name, act_name, kind, act, extra = case
    fc, proj = _projections(kind)
    m = _plain(fc, proj, act, fc_name, proj_name, act_name, **extra)
    x = torch.randn(2, 5, D)
    ref = proj(getattr(m, act_name)(fc(x)))  # dropout inactive in eval
    out = bind(getattr(fused_mlp.layers, layer), m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {layer: 1}, fused_mlp.layers.ORIGINAL_CALLS
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_bert_intermediate_layer(fused_mlp, act, bias):
    torch.manual_seed(0)
    m = holder(dense=nn.Linear(D, H, bias=bias), intermediate_act_fn=ACT2FN[act]).eval()
    assert fused_mlp.layers.supports(m, "BertIntermediate")
    x = torch.randn(2, 5, D)
    ref = m.intermediate_act_fn(m.dense(x))
    out = bind(fused_mlp.layers.BertIntermediate, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"BertIntermediate": 1}, fused_mlp.layers.ORIGINAL_CALLS
    assert out.shape == ref.shape and rel_err(out, ref) < 1e-5


def test_bert_intermediate_runs_original(fused_mlp):
    torch.manual_seed(0)
    m = holder(dense=nn.Linear(D, H), intermediate_act_fn=ACT2FN["tanh"]).eval()
    assert not fused_mlp.layers.supports(m, "BertIntermediate")
    x = torch.randn(3, D)
    ref = m.intermediate_act_fn(m.dense(x))
    _expect_original(fused_mlp, "BertIntermediate", bind(fused_mlp.layers.BertIntermediate, m), x, ref)
    fused_mlp.layers.reset_counters()
    m = holder(dense=nn.Linear(D, H), intermediate_act_fn=ACT2FN["gelu"]).double().eval()
    x = x.double()
    ref = m.intermediate_act_fn(m.dense(x))
    _expect_original(fused_mlp, "BertIntermediate", bind(fused_mlp.layers.BertIntermediate, m), x, ref)


def test_bert_intermediate_backward_matches_original(fused_mlp):
    torch.manual_seed(0)
    m = holder(dense=nn.Linear(D, H), intermediate_act_fn=ACT2FN["gelu"]).train()
    x = torch.randn(4, D, requires_grad=True)
    m.intermediate_act_fn(m.dense(x)).square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    bind(fused_mlp.layers.BertIntermediate, m)(x).square().sum().backward()
    assert fused_mlp.layers.FUSED_CALLS == {"BertIntermediate": 1}
    for g, r in zip([x.grad] + [p.grad for p in m.parameters()], grads):
        assert rel_err(g, r) < 1e-5


def test_fused_backward_matches_original(fused_mlp):
    """Training through the fused path: the op's backward gives the module's gradients."""
    m = gated_module("gelu_pytorch_tanh", bias=True).train()
    x = torch.randn(4, D, requires_grad=True)
    ref = gated_ref(m, x)
    ref.square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    bind(fused_mlp.layers.GatedMLP, m)(x).square().sum().backward()
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}
    for g, r in zip([x.grad] + [p.grad for p in m.parameters()], grads):
        assert rel_err(g, r) < 1e-5


# ----------------------------------------------------------------------------- original computation


def _expect_original(fused_mlp, layer, m, x, ref):
    out = m(x)
    assert fused_mlp.layers.FUSED_CALLS == {}, "the fused path ran"
    assert fused_mlp.layers.ORIGINAL_CALLS == {layer: 1}
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # the same ops: bitwise equal
    return out


@pytest.mark.parametrize("act", ["tanh", "mish", "gelu_10", "sigmoid"])
def test_unsupported_activation_runs_original(fused_mlp, act):
    m = gated_module(act)
    x = torch.randn(3, D)
    assert not fused_mlp.layers.supports(m, "GatedMLP")  # kernelize would not even swap it
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, gated_ref(m, x))


def test_custom_activation_module_runs_original(fused_mlp):
    class Custom(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(2.0 * x)

    m = gated_module(Custom())
    x = torch.randn(3, D)
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, gated_ref(m, x))


def test_float64_runs_original(fused_mlp):
    m = gated_module().double()
    x = torch.randn(3, D, dtype=torch.float64)
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, gated_ref(m, x))


def test_quantized_weight_runs_original(fused_mlp):
    class QuantParam(nn.Parameter):  # stands for bitsandbytes' Params4bit & co.
        pass

    m = gated_module()
    m.up_proj.weight = QuantParam(m.up_proj.weight.data)
    x = torch.randn(3, D)
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, gated_ref(m, x))


def test_linear_subclass_runs_original(fused_mlp):
    class LoraLinear(nn.Linear):  # stands for a quantized / adapter linear
        def forward(self, x):
            return super().forward(x) + 0.5 * x.sum(-1, keepdim=True)

    m = gated_module()
    lin = LoraLinear(D, H, bias=False)
    lin.load_state_dict(m.gate_proj.state_dict())
    m.gate_proj = lin
    assert not fused_mlp.layers.supports(m, "GatedMLP")
    x = torch.randn(3, D)
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, gated_ref(m, x))


def test_hooks_run_original(fused_mlp):
    m = gated_module()
    x = torch.randn(3, D)
    calls = []
    handle = m.down_proj.register_forward_hook(lambda mod, inp, out: calls.append(1) or out * 2)
    ref = gated_ref(m, x)
    calls.clear()
    _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, ref)
    assert calls == [1]
    handle.remove()

    # A forward replaced on the submodule instance (accelerate offload hooks do this).
    m.up_proj.forward = types.MethodType(lambda self, t: F.linear(t, self.weight) + 1.0, m.up_proj)
    fused_mlp.layers.reset_counters()
    _expect_original(fused_mlp, "GatedMLP", m, x, gated_ref(m, x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_fused(fused_mlp, dtype):
    """Under autocast a float32 module runs fused in autocast's dtype, as its projections
    would run: the op on the operands cast by hand, bit for bit, close to the original."""
    m = gated_module("gelu_new", bias=True)
    x = torch.randn(3, D)
    with torch.autocast("cpu", dtype=dtype):
        ref = gated_ref(m, x)
        out = bind(fused_mlp.layers.GatedMLP, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}, fused_mlp.layers.ORIGINAL_CALLS
    assert out.dtype == ref.dtype == dtype
    c = {name: getattr(m, name) for name in ("gate_proj", "up_proj", "down_proj")}
    by_hand = fused_mlp.gated_mlp(x.to(dtype), *(c[n].weight.to(dtype) for n in c), "gelu_tanh",
                                  gate_bias=c["gate_proj"].bias.to(dtype), up_bias=c["up_proj"].bias.to(dtype),
                                  down_bias=c["down_proj"].bias.to(dtype))
    assert torch.equal(out, by_hand)
    assert rel_err(out.float(), ref.float()) < 3e-2


def test_autocast_plain_and_bert_layers_run_fused(fused_mlp):
    fc, proj = _projections("conv1d")
    m = _plain(fc, proj, "gelu_new", "c_fc", "c_proj", "act", dropout=nn.Dropout(0.1))
    torch.manual_seed(0)
    b = holder(dense=nn.Linear(D, H), intermediate_act_fn=ACT2FN["gelu"]).eval()
    x = torch.randn(2, 5, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = m.dropout(m.c_proj(m.act(m.c_fc(x))))
        out = bind(fused_mlp.layers.GPT2MLP, m)(x)
        b_ref = b.intermediate_act_fn(b.dense(x))
        b_out = bind(fused_mlp.layers.BertIntermediate, b)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"GPT2MLP": 1, "BertIntermediate": 1}, fused_mlp.layers.ORIGINAL_CALLS
    for o, r in ((out, ref), (b_out, b_ref)):
        assert o.dtype == r.dtype == torch.bfloat16
        assert rel_err(o.float(), r.float()) < 3e-2


def test_autocast_mixed_dtypes_run_fused(fused_mlp):
    """Weights of two float dtypes: an error without autocast (test below), cast alike
    under it, by the original and by the fused path."""
    m = gated_module()
    m.down_proj.to(torch.bfloat16)
    x = torch.randn(3, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = gated_ref(m, x)
        out = bind(fused_mlp.layers.GatedMLP, m)(x)
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}
    assert out.dtype == torch.bfloat16 and rel_err(out.float(), ref.float()) < 3e-2


def test_autocast_float64_runs_original(fused_mlp):
    """Autocast leaves float64 alone, and so does the layer: the original runs."""
    m = gated_module().double()
    x = torch.randn(3, D, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = gated_ref(m, x)
        out = _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, ref)
    assert out.dtype == torch.float64


def test_autocast_training_step_matches_original(fused_mlp):
    """A float32 module trained under autocast: the fused path's gradients reach the float32
    parameters and agree with the original's within bf16's rounding."""
    m = gated_module("silu", bias=True).train()
    x = torch.randn(6, D, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = gated_ref(m, x)
    ref.float().square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = bind(fused_mlp.layers.GatedMLP, m)(x)
    out.float().square().sum().backward()
    assert fused_mlp.layers.FUSED_CALLS == {"GatedMLP": 1}
    for g, r in zip([x.grad] + [p.grad for p in m.parameters()], grads):
        assert g.dtype == torch.float32 and rel_err(g, r) < 3e-2


def test_mixed_dtypes_run_original(fused_mlp):
    m = gated_module()
    m.down_proj.to(torch.bfloat16)
    x = torch.randn(3, D)
    bind(fused_mlp.layers.GatedMLP, m)
    with pytest.raises(RuntimeError):  # what the original does with these weights
        m(x)
    assert fused_mlp.layers.FUSED_CALLS == {}


@pytest.mark.parametrize("case", [c for c in PLAIN_CASES if c[0] in ("GPT2MLP", "GPTJMLP", "Starcoder2MLP")],
                         ids=lambda c: f"{c[0]}-{c[4]}")
def test_active_dropout_runs_original(fused_mlp, case):
    layer, fc_name, proj_name, act_name, kind, act, extra = case
    fc, proj = _projections(kind)
    m = _plain(fc, proj, act, fc_name, proj_name, act_name, **extra).train()
    x = torch.randn(4, D)
    torch.manual_seed(1)
    h = proj(getattr(m, act_name)(fc(x)))
    ref = m.dropout(h) if hasattr(m, "dropout") else F.dropout(h, p=m.residual_dropout, training=True)
    bind(getattr(fused_mlp.layers, layer), m)
    torch.manual_seed(1)
    out = _expect_original(fused_mlp, layer, m, x, ref)
    assert (out == 0).any()  # dropout did run

    # Dropout with p == 0 in training is the identity: fused.
    if hasattr(m, "dropout"):
        m.dropout.p = 0.0
    else:
        m.residual_dropout = 0.0
    fused_mlp.layers.reset_counters()
    out = m(x)
    assert fused_mlp.layers.FUSED_CALLS == {layer: 1}
    assert rel_err(out, h) < 1e-5


def test_seed_oss_dropout(fused_mlp):
    m = gated_module()
    m.residual_dropout = 0.25
    x = torch.randn(4, D)
    bind(fused_mlp.layers.SeedOssMLP, m)
    out = m(x)  # eval: dropout inactive, fused
    assert fused_mlp.layers.FUSED_CALLS == {"SeedOssMLP": 1}
    assert rel_err(out, gated_ref(m, x)) < 1e-5
    m.train()
    fused_mlp.layers.reset_counters()
    torch.manual_seed(3)
    ref = F.dropout(gated_ref(m, x), p=0.25, training=True)
    torch.manual_seed(3)
    _expect_original(fused_mlp, "SeedOssMLP", m, x, ref)


def test_packed_odd_width_runs_original(fused_mlp):
    m = holder(gate_up_proj=nn.Linear(D, 2 * H + 1, bias=False), down_proj=nn.Linear(H + 1, D, bias=False),
               activation_fn=ACT2FN["silu"])
    bind(fused_mlp.layers.PackedGatedMLP, m)
    x = torch.randn(3, D)
    with pytest.raises(RuntimeError):  # the original chunks unevenly and fails to multiply
        m(x)
    assert fused_mlp.layers.FUSED_CALLS == {}


# ----------------------------------------------------------------------------- act-and-mul layers


@pytest.mark.parametrize("layer, fn", [
    ("SiluAndMul", F.silu),
    ("GeluAndMul", F.gelu),
    ("GeluTanhAndMul", lambda t: F.gelu(t, approximate="tanh")),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_and_mul_layers(fused_mlp, layer, fn, dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 2 * 40, dtype=dtype)
    m = getattr(fused_mlp.layers, layer)()
    out = m(x)
    assert fused_mlp.layers.FUSED_CALLS == {layer: 1}
    assert out.shape == (3, 5, 40) and out.dtype == dtype
    ref = (fn(x[..., :40].double()) * x[..., 40:].double())
    # fp32: a few ulps; bf16: the output is rounded once to bf16 (2^-8 relative).
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 8e-3)


def test_act_and_mul_layer_with_grad_runs_original(fused_mlp):
    x = torch.randn(4, 16, requires_grad=True)
    out = fused_mlp.layers.SiluAndMul()(x)
    assert fused_mlp.layers.ORIGINAL_CALLS == {"SiluAndMul": 1} and fused_mlp.layers.FUSED_CALLS == {}
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    (F.silu(x2[..., :8]) * x2[..., 8:]).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=0)


@pytest.mark.parametrize("transform", ["forward_ad", "jvp", "vmap"])
def test_act_and_mul_layer_under_transforms_runs_original(fused_mlp, transform):
    """The act-and-mul kernel has no derivative and no batching rule: under forward AD and
    torch.func transforms the layer computes the formula (the tangent is not dropped)."""
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    x, t = torch.randn(4, 16), torch.randn(4, 16)
    m = fused_mlp.layers.SiluAndMul()

    def f(z):
        return F.silu(z[..., :8]) * z[..., 8:]

    if transform == "forward_ad":
        with fwAD.dual_level():
            out = fwAD.unpack_dual(m(fwAD.make_dual(x, t)))
        got, ref = (out.primal, out.tangent), torch.func.jvp(f, (x,), (t,))
    elif transform == "jvp":
        got, ref = torch.func.jvp(m, (x,), (t,)), torch.func.jvp(f, (x,), (t,))
    else:
        got, ref = (torch.func.vmap(m)(x),), (f(x),)
    for a, b in zip(got, ref):
        assert a is not None
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert fused_mlp.layers.FUSED_CALLS == {} and sum(fused_mlp.layers.ORIGINAL_CALLS.values()) >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("layer", ["GatedMLP", "PackedGatedMLP"])
def test_gated_layers_gpu_bf16(fused_mlp, layer):
    torch.manual_seed(0)
    if layer == "GatedMLP":
        m = gated_module("silu")
        ref_fn = gated_ref
    else:
        m = holder(gate_up_proj=nn.Linear(D, 2 * H, bias=False), down_proj=nn.Linear(H, D, bias=False),
                   activation_fn=ACT2FN["silu"])

        def ref_fn(mod, t):
            g, u = mod.gate_up_proj(t).chunk(2, dim=-1)
            return mod.down_proj(u * mod.activation_fn(g))
    m = m.to("cuda", torch.bfloat16)
    xb = torch.randn(64, D, device="cuda", dtype=torch.bfloat16)
    exact = ref_fn(copy.deepcopy(m).double(), xb.double())  # same bf16 weights, exact arithmetic
    eager = ref_fn(m, xb)
    out = bind(getattr(fused_mlp.layers, layer), m)(xb)
    assert fused_mlp.layers.FUSED_CALLS == {layer: 1}
    # No less accurate than eager bf16 (which rounds h to bf16 before down_proj), up to 2x.
    assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-3


def test_global_module_hook_runs_original(fused_mlp):
    m = gated_module()
    x = torch.randn(3, D)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, i, o: seen.append(type(mod)))
    try:
        ref = gated_ref(m, x)
        seen.clear()
        _expect_original(fused_mlp, "GatedMLP", bind(fused_mlp.layers.GatedMLP, m), x, ref)
        assert seen.count(nn.Linear) == 3
    finally:
        handle.remove()


COMPILE_CASES = (["GatedMLP", "PackedGatedMLP"] + [c[0] for c in PLAIN_CASES if c[4] == "linear"]
                 + ["GPT2MLP-conv1d", "BertIntermediate"])


@pytest.mark.parametrize("name", COMPILE_CASES)
def test_layers_compile_fullgraph(fused_mlp, name):
    """Each layer traces without a graph break (aot_eager: dynamo + fake tensors) and
    the fused path is what gets traced."""
    layer = name.split("-")[0]
    if layer == "GatedMLP":
        m, ref_fn = gated_module("gelu_pytorch_tanh", bias=True), gated_ref
    elif layer == "BertIntermediate":
        torch.manual_seed(0)
        m = holder(dense=nn.Linear(D, H), intermediate_act_fn=ACT2FN["gelu"]).eval()

        def ref_fn(mod, t):
            return mod.intermediate_act_fn(mod.dense(t))
    elif layer == "PackedGatedMLP":
        torch.manual_seed(0)
        m = holder(gate_up_proj=nn.Linear(D, 2 * H), down_proj=nn.Linear(H, D), activation_fn=ACT2FN["silu"])

        def ref_fn(mod, t):
            g, u = mod.gate_up_proj(t).chunk(2, dim=-1)
            return mod.down_proj(u * mod.activation_fn(g))
    else:
        case = next(c for c in PLAIN_CASES if c[0] == layer and (c[4] == "conv1d") == name.endswith("conv1d"))
        _, fc_name, proj_name, act_name, kind, act, extra = case
        fc, proj = _projections(kind)
        m = _plain(fc, proj, act, fc_name, proj_name, act_name, **extra)

        def ref_fn(mod, t):
            return getattr(mod, proj_name)(getattr(mod, act_name)(getattr(mod, fc_name)(t)))
    x = torch.randn(2, 3, D)
    ref = ref_fn(m, x)
    bind(getattr(fused_mlp.layers, layer), m)
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(m, fullgraph=True, backend=recording_backend(graphs))
    out = compiled(x)
    # The parameters require grad here, so the training ops are the ones traced.
    op = {"GatedMLP": "gated_mlp_train", "PackedGatedMLP": "gated_mlp_train",
          "BertIntermediate": "linear_act"}.get(layer, "mlp_train")
    assert package_op_calls(fused_mlp, graphs) == {op: 1}
    assert rel_err(out, ref) < 1e-5
    # Called again, the compiled layer reuses its graph (the counters are not guarded on).
    assert rel_err(compiled(x), ref) < 1e-5 and len(graphs) == 1
    assert fused_mlp.layers.FUSED_CALLS == {}  # eager calls only
