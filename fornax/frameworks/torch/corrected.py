"""PyTorch decompositions that compute something other than ATen's kernels, replaced.

fornax runs PyTorch's own decompositions (``torch._decomp``) for ops it has no kernel
for.  Where such a decomposition disagrees with the CPU and CUDA kernels it stands in for,
the op is composed here instead, from the same ATen ops, with the kernel's semantics; each
entry says what PyTorch's version gets wrong.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def multilabel_margin_loss_forward(input, target, reduction):
    """ATen's multilabel margin loss.  PyTorch's decomposition (torch 2.13) scores the target
    positions after the first -1 too (it masks them only out of ``is_target``, so they add
    terms built from ``input[0]``), and keeps the batch dimension it adds to a 1-D input
    (shape (1,) with reduction='none', where the kernels give a 0-d result)."""
    shape = input.shape
    torch._check(input.dim() <= 2 and torch.atleast_2d(input).shape[1] != 0,
                 lambda: f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {shape}")
    torch._check(target.shape == shape,
                 lambda: f"inconsistent target size: {target.shape} for input of size: {shape}")
    x, t = torch.atleast_2d(input), torch.atleast_2d(target)
    dim = x.shape[1]
    idx = torch.arange(dim, device=t.device)
    end = torch.amin(torch.where(t == -1, idx, dim), dim=-1, keepdim=True)
    scored = idx < end                                  # target positions before the first -1
    u = torch.gather(x, -1, torch.where(scored, t, 0))  # x[b, t[b, i]]
    is_target = torch.any(idx == torch.where(scored, t, -1).unsqueeze(-1), dim=1)
    z = (1.0 - u.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / dim       # [b, i, j]
    z = torch.where(is_target.unsqueeze(1) | ~scored.unsqueeze(-1), 0, z).sum(dim=(1, 2))
    if reduction == 1:                                  # Reduction::Mean
        z = z.mean()
    elif reduction == 2:                                # Reduction::Sum
        z = z.sum()
    elif input.dim() < 2:
        z = z.reshape(())
    return z, is_target.to(input.dtype).reshape(target.shape)


DECOMPOSITIONS = {
    aten.multilabel_margin_loss_forward.default: multilabel_margin_loss_forward,
}
