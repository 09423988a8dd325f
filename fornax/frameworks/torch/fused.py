"""Kernels PyTorch ships only for CUDA-class devices, written in ATen ops.

ATen's RNN cells call the fused ``_thnn_fused_gru_cell`` / ``_thnn_fused_lstm_cell``
(and their backward ops) for any accelerator, including PrivateUse1, and those ops have
no CPU kernel to fall back on.  Here they are the same arithmetic as ATen's CUDA
kernels (``aten/src/ATen/native/cuda/RNN.cu``), composed of ordinary ATen ops so every
piece goes down the device's own routes.  The workspace saved for backward holds the
same quantities as CUDA's (GRU: r, z, n, hx, hn; LSTM: i, f, g, o); only these
kernels read it.
"""

from __future__ import annotations

import torch


def _gates(t: torch.Tensor, n: int):
    return t.chunk(n, dim=1)


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, in_ = _gates(input_gates, 3)
    hr, hi, hn = _gates(hidden_gates, 3)
    r = torch.sigmoid(ir + hr)
    z = torch.sigmoid(ii + hi)
    n = torch.tanh(in_ + hn * r)
    hy = n + z * (hx - n)
    workspace = torch.cat([r, z, n, hx, hn], dim=1)
    return hy, workspace


def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = _gates(workspace, 5)
    g_z = grad_hy * (hx - n) * (1 - z) * z
    g_hx = grad_hy * z
    g_in = grad_hy * (1 - z) * (1 - n * n)
    g_hn = g_in * r
    g_r = g_in * hn * (1 - r) * r
    grad_input_gates = torch.cat([g_r, g_z, g_in], dim=1)
    grad_hidden_gates = torch.cat([g_r, g_z, g_hn], dim=1)
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, g_hx, grad_input_gates.sum(0),
                grad_hidden_gates.sum(0))
    empty = torch.empty(0, dtype=grad_hy.dtype, device=grad_hy.device)
    return grad_input_gates, grad_hidden_gates, g_hx, empty, empty


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = _gates(gates, 4)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], dim=1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = _gates(workspace, 4)
    tanh_cy = torch.tanh(cy)
    g_cy = grad_cy if grad_cy is not None else torch.zeros_like(cy)
    if grad_hy is not None:
        g_cy = g_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
        g_o = grad_hy * tanh_cy * o * (1 - o)
    else:
        g_o = torch.zeros_like(o)
    g_i = g_cy * g * i * (1 - i)
    g_f = g_cy * cx * f * (1 - f)
    g_g = g_cy * i * (1 - g * g)
    grad_gates = torch.cat([g_i, g_f, g_g, g_o], dim=1)
    grad_cx = g_cy * f
    grad_bias = grad_gates.sum(0) if has_bias else torch.empty(0, dtype=cy.dtype, device=cy.device)
    return grad_gates, grad_cx, grad_bias


KERNELS = {
    "_thnn_fused_gru_cell": gru_cell,
    "_thnn_fused_gru_cell_backward": gru_cell_backward,
    "_thnn_fused_lstm_cell": lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": lstm_cell_backward,
}
