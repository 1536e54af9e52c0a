"""torch integration: Int4Linear and quantize_model. Optional: `import int4jit` never imports
torch; this module does."""
from __future__ import annotations

import fnmatch

import numpy as np
import torch
from torch import nn

from .api import gemv
from .reference import quantize
from .trace import trace


def _unpack_dequantize(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, dtype) -> torch.Tensor:
    """Canonical int4 tensors -> dense [N, K] weight in `dtype`, on their device."""
    q = torch.stack((w & 0xF, w >> 4), dim=-1).reshape(w.shape[0], -1).to(torch.float32)
    g = q.shape[1] // scales.shape[1]
    z = torch.full_like(scales, 8, dtype=torch.float32) if zeros is None else zeros.to(torch.float32)
    deq = (q - z.repeat_interleave(g, dim=1)) * scales.to(torch.float32).repeat_interleave(g, dim=1)
    return deq.to(dtype)


class Int4Linear(nn.Module):
    """nn.Linear with INT4 weights in int4jit's canonical layout, uploaded once.

    forward on [..., K] with exactly one token and float16 activations on the GPU runs
    int4jit.gemv on torch's current stream, zero-copy (graph capture works). Anything else
    (several tokens, other dtypes, the CPU) dequantises and uses torch.matmul: correct, slower,
    and traced when INT4JIT_TRACE is on."""

    def __init__(self, w, scales, zeros=None, bias=None):
        super().__init__()
        as_t = lambda a: a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
        self.register_buffer("w", as_t(w))
        self.register_buffer("scales", as_t(scales))
        self.register_buffer("zeros", None if zeros is None else as_t(zeros))
        self.bias = None if bias is None else nn.Parameter(as_t(bias).detach().clone(), requires_grad=False)
        self.out_features, self.in_features = self.w.shape[0], 2 * self.w.shape[1]
        self.group_size = self.in_features // self.scales.shape[1]

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, symmetric: bool = False) -> "Int4Linear":
        W = linear.weight.detach().to(torch.float32).cpu().numpy()
        w, s, z = quantize(W, group_size, symmetric)
        dev = linear.weight.device
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float16)
        mod = cls(w, s, z, bias)
        return mod.to(dev)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"symmetric={self.zeros is None}, bias={self.bias is not None}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int4Linear expects [..., {self.in_features}] inputs; got {tuple(x.shape)}")
        tokens = x.numel() // self.in_features
        if tokens == 1 and x.is_cuda and x.dtype == torch.float16 and self.w.is_cuda:
            xv = x.reshape(self.in_features)
            if not xv.is_contiguous():
                xv = xv.contiguous()
            y = gemv(xv, self.w, self.scales, self.zeros, out=xv.new_empty(self.out_features))
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*x.shape[:-1], self.out_features)
        trace("Int4Linear %dx%d: %d tokens, %s on %s -> dequantise + torch.matmul", self.out_features,
              self.in_features, tokens, x.dtype, x.device)
        W = _unpack_dequantize(self.w, self.scales, self.zeros, x.dtype)
        y = torch.matmul(x, W.t())
        return y if self.bias is None else y + self.bias.to(y.dtype)


def quantize_model(model: nn.Module, group_size: int = 128, symmetric: bool = False, skip=()) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by an Int4Linear, except those whose
    qualified name matches a pattern in `skip` (fnmatch, e.g. 'lm_head' or '*.attn.*') or
    whose in_features is not a multiple of group_size (kept, and traced)."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if not isinstance(child, nn.Linear):
                continue
            if any(fnmatch.fnmatch(full, pat) for pat in skip):
                continue
            if child.in_features % group_size:
                trace("quantize_model: keeping %s (in_features %d is not a multiple of %d)", full,
                      child.in_features, group_size)
                continue
            setattr(module, child_name, Int4Linear.from_linear(child, group_size, symmetric))
    return model
