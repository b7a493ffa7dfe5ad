"""The one place that decides which implementation computes an MLP for given inputs.

Every public function (functional.py) and every layer goes through here; no other
module picks a kernel. Inputs arrive 2-D ([M, D]), validated, activation canonical.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import reference


def gated_mlp_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    activation: str,
    gate_bias: Optional[torch.Tensor],
    up_bias: Optional[torch.Tensor],
    down_bias: Optional[torch.Tensor],
) -> torch.Tensor:
    return reference.gated_mlp(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)


def mlp_forward(
    x: torch.Tensor,
    fc_weight: torch.Tensor,
    fc_bias: Optional[torch.Tensor],
    proj_weight: torch.Tensor,
    proj_bias: Optional[torch.Tensor],
    activation: str,
    weight_layout: str,
) -> torch.Tensor:
    return reference.mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout)
