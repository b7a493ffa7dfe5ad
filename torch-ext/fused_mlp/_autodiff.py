"""What the kernel-level entry points do under automatic differentiation.

The public MLP functions (functional.py) handle autograd, torch.func transforms and forward
AD themselves. The kernel-level ones (the out= activation ops of act_and_mul.py and
decode.py's functions) have no derivative: their kernels take raw pointers and return
results without autograd history. Called where a derivative would be wanted they refuse,
as torch's own out= functions do, instead of returning a result whose gradient or tangent
would silently be missing.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as _forward_ad


def transform_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jvp, jacrev, ...) runs, or a forward-mode
    AD dual level (torch.autograd.forward_ad) is open. The kernels take raw pointers (a
    transform's wrapped tensors have none; a dual tensor's tangent would be dropped). The
    two queries cost ~0.05 us together (CPU of session 46) and torch.compile traces them."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def autodiff_wanted(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a derivative would be expected of a call on `tensors`: a torch.func transform
    or forward-AD dual level is active, or grad mode is on and one of them requires grad.
    Kernel-level entry points guard `refuse_autodiff` with it: the plain test costs less
    host time than building the named arguments of the refusal on every call."""
    if transform_active():
        return True
    if torch.is_grad_enabled():
        for t in tensors:  # a loop: any() over a generator costs ~0.15 us more per call
            if t is not None and t.requires_grad:
                return True
    return False


def refuse_autodiff(op: str, alternative: str, **tensors: Optional[torch.Tensor]) -> None:
    """Raise if `op` is called where a derivative would be expected (autodiff_wanted):
    under a torch.func transform or a forward-AD dual level, or with grad mode on and a
    tensor argument that requires grad (named in the message). `alternative` says what to
    call instead."""
    if transform_active():
        raise RuntimeError(
            f"{op} has no derivative and cannot run under a torch.func transform or a "
            f"forward-mode AD dual level; use {alternative}, which both support"
        )
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if t is not None and t.requires_grad:
                raise RuntimeError(
                    f"{op} has no derivative, but its argument {name} requires grad: call it "
                    f"under torch.no_grad() or torch.inference_mode(), or use {alternative}, "
                    "which supports autograd"
                )
