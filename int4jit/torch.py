"""torch integration: Int4Linear, quantize_model and the `int4jit::gemv` custom op. Optional:
`import int4jit` never imports torch; this module does.

Int4Linear's call of 1..16 tokens on the GPU runs the int4jit kernel through the layer's
GemvWeights (validated once; a call re-checks only x). Under torch.compile every call, of any
number of tokens, is one node of the registered custom op `torch.ops.int4jit.gemv` (with a fake
implementation and a backward), which picks the path below when it runs: Dynamo traces no int4jit
Python, a compiled model is one graph for prompts too, and CUDA graphs (mode="reduce-overhead")
capture the launches. Where x on the GPU requires grad, calls go through the op too. A few more
tokens (up to chunked_tokens: 32 to 64 by the weights' size) launch the kernel once per 16; on
Hopper a prompt of GEMM_MIN_TOKENS (33) to GEMM_MAX_TOKENS runs the int4 GEMM instead, on layers
of 6 MB of int4 weights or more. Anything else (longer prefill, the CPU, a call no kernel serves
on the target) dequantises and uses torch.matmul, with a warning naming why. One function
chooses among these paths for eager and compiled calls alike (_gpu_path); Int4Linear.path(x)
names the one a call takes.
quantize_model also fuses the layers a model calls on the same x (q/k/v, gate/up) into one
Int4Linear each, for eager calls (fuse_shared_inputs): one launch and one call's host time for all.
load_quantized swaps them in from a checkpoint instead: GPTQ, AWQ, or a quantized model's state_dict.
"""
from __future__ import annotations

import fnmatch
import logging
import weakref
from typing import Optional

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from .api import GemvWeights, permutation_fault
from .formats import from_quantized_layer
from .shapes import MAX_TOKENS
from .reference import quantize
from .trace import trace
from .validate import validate, validate_x

log = logging.getLogger("int4jit")
# The CPU path keeps the dequantised weight of a module up to this size (and dequantises once).
CPU_DENSE_CACHE_BYTES = 1 << 30
# A GPU call of more tokens than one launch takes runs the kernel once per MAX_TOKENS tokens while
# that costs less than dequantising the weight (a launch writing it dense, then cuBLAS reading
# it): at most 2 launches under 16 MB of int4 weights, 3 under 64 MB, 4 above. Measured on
# Llama-3-8B's projections, 16..128 tokens, H100 and H200 (bench/prefill.py; docs/performance.md).
CHUNK_LIMITS = ((16 << 20, 2), (64 << 20, 3), (float("inf"), 4))
# On Hopper the int4 GEMM (GemvWeights.matmul) serves prompts of GEMM_MIN_TOKENS to
# GEMM_MAX_TOKENS, ahead of the chunks; elsewhere (more tokens, other GPUs) one dequantising launch
# + cuBLAS. The GEMM runs at ~2/3 of cuBLAS's rate and saves the dequantisation, so it wins on
# short prompts; its tiles (128 rows x 128 tokens) are cut between SMs where they are too few to
# fill them. It costs about two chunk launches (a floor of ~23 us). H100, GPU us, fp16
# (bench/prefill.py, docs/performance.md "Prefill on Hopper"): against 3 chunks at 48 tokens
# gate/up 39 against 59, down 46 against 77, lm_head 261 against 411, q/o 23 against 26, k/v 30
# against 17; against dequantise + cuBLAS at 128 tokens gate/up 41 against 106, down 49 against
# 115; at 512 tokens gate/up 124 against 145, lm_head 1078 against 1234, q/o, down and k/v within
# 10%; at 640 tokens it loses on every projection (H200: gate/up 158 against 150).
GEMM_MIN_TOKENS = 2 * MAX_TOKENS + 1
GEMM_MAX_TOKENS = 512
# ... and only on layers of GEMM_MIN_BYTES of int4 weights or more: below that, dequantising the
# weight costs less than the GEMM's fixed part (~18 us on the H100: its launch, first loads and
# the sums of tiles cut between SMs), so one dequantising launch + cuBLAS wins at 33 to 512
# tokens. H100, fp16, bench/prefill.py, GEMM / dequantise + cuBLAS µs at 48 and 512 tokens:
# 1024x4096 (2 MB) 27.0 / 13.1, 21.5 / 17.3; 1024x8192 (4 MB) 29.4 / 16.4, 31.0 / 29.0; 3072x3072
# (4.5 MB) 19.2 / 17.3, 28.9 / 26.4; 4096x4096 (8 MB) 20.2 / 28.1, 35.8 / 42.3; 8192x2048 (8 MB)
# 18.4 / 27.4, 41.9 / 43.8; 2048x8192 (8 MB) 24.6 / 29.0, 43.4 / 48.1.
GEMM_MIN_BYTES = 6 << 20
# The prompt shapes a module keeps its prefill path for (forward's fast path); a server sees many.
PROMPT_SHAPES = 64
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NO_DENSE = (None, (), ())  # Int4Linear._dense_of where no CPU dense weight is kept: (dtype, weights, versions)


def chunked_tokens(out_features: int, in_features: int) -> int:
    """The most tokens Int4Linear's GPU call serves in launches of MAX_TOKENS; more dequantise
    (on Hopper the int4 GEMM takes GEMM_MIN_TOKENS and more first)."""
    nbytes = out_features * in_features // 2
    return MAX_TOKENS * next(n for limit, n in CHUNK_LIMITS if nbytes < limit)


def gemm_max_tokens(out_features: int, in_features: int) -> int:
    """The most tokens Int4Linear's GPU call runs through the int4 GEMM (Hopper): GEMM_MAX_TOKENS,
    or 0 (never) for a layer of less than GEMM_MIN_BYTES of int4 weights."""
    return GEMM_MAX_TOKENS if out_features * in_features // 2 >= GEMM_MIN_BYTES else 0


def _unpack_dequantize(w: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], dtype) -> torch.Tensor:
    """Canonical int4 tensors -> dense [N, K] weight in `dtype`, on their device (one pass)."""
    q = torch.stack((w & 0xF, w >> 4), dim=-1).reshape(w.shape[0], -1).to(torch.float32)
    g = q.shape[1] // scales.shape[1]
    z = torch.full_like(scales, 8, dtype=torch.float32) if zeros is None else zeros.to(torch.float32)
    deq = (q.view(w.shape[0], -1, g) - z.unsqueeze(-1)) * scales.to(torch.float32).unsqueeze(-1)
    return deq.reshape(w.shape[0], -1).to(dtype)


def _version(t: torch.Tensor) -> int:
    """t's in-place write count; -1 for an inference-mode tensor (which keeps none)."""
    return -1 if t.is_inference() else t._version


# -- the custom op ----------------------------------------------------------------------
def _layer_for(w: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor]) -> GemvWeights:
    """The prepared layer of these weight tensors, made once and kept on w itself, so that it
    lives as long as the weights do (a module-level table would keep every model's weights
    alive after the model is gone); made again if w was given new storage or other scales."""
    layer = getattr(w, "_int4jit_layer", None)
    if layer is None or layer.scales is not scales or layer.zeros is not zeros or layer.w_ptr != w.data_ptr():
        layer = GemvWeights(w, scales, zeros)
        w._int4jit_layer = layer
    return layer


@torch.library.custom_op("int4jit::gemv", mutates_args=())
def gemv_op(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
            chunked: int = -1, gemm_max: int = -1) -> torch.Tensor:
    """y [..., N] = x @ dequant(w)^T for x [..., K] of any number of tokens: on the GPU the path
    Int4Linear's eager call takes (_on_the_gpu), with launches of 16 up to `chunked` tokens and the
    int4 GEMM up to `gemm_max` (-1: the shape's chunked_tokens and gemm_max_tokens), on the CPU
    dequantise + matmul. Differentiable in x (the weights are constants)."""
    return _on_the_gpu(_layer_for(w, scales, zeros), x.contiguous(), chunked, gemm_max)


# Layers whose several-token kernel is unavailable here (warned once each): the op dequantises.
_no_chunks: "weakref.WeakSet[GemvWeights]" = weakref.WeakSet()


def _gpu_path(layer: GemvWeights, dtype, tokens: int, chunked: int, gemm_max: int) -> str:
    """How a GPU call of `tokens` tokens of `dtype` runs, Int4Linear's eager call and the op's
    alike, with launches of MAX_TOKENS up to `chunked` tokens and the int4 GEMM (Hopper) from
    GEMM_MIN_TOKENS to `gemm_max`: "gemv" (1..16 tokens, the kernel), "gemm", "chunks" (the
    kernel once per 16 tokens), "dense" (one dequantising launch + cuBLAS: longer prompts, and an
    empty x) or "float" (float32/64 x: the weight dequantised in float16, then in x's dtype)."""
    if dtype is not torch.float16 and dtype is not torch.bfloat16:
        return "float"
    if 1 <= tokens <= MAX_TOKENS:
        return "gemv"
    if GEMM_MIN_TOKENS <= tokens <= gemm_max and layer.gemm_unsupported(dtype) is None:
        return "gemm"
    return "chunks" if MAX_TOKENS < tokens <= chunked else "dense"


def _check_prompt(layer: GemvWeights, x: torch.Tensor, tokens: int) -> None:
    """The launch checks of a prompt's x (dtype, device, alignment), on its first MAX_TOKENS tokens."""
    if tokens:
        validate_x(x.view(tokens, layer.K)[:MAX_TOKENS], layer.K, layer.device_index)


def _run(layer: GemvWeights, path: str, x: torch.Tensor, tokens: int) -> torch.Tensor:
    """y [..., N] for x [..., K] (contiguous, checked as its path needs) by `path` (_gpu_path)."""
    N, K = layer.N, layer.K
    if path == "gemv":
        return layer(x)
    if path == "float":
        return torch.matmul(x, layer.dense(x.new_empty(N, K, dtype=torch.float16)).to(x.dtype).t())
    if path == "dense":
        return nn.functional.linear(x, layer.dense(x.new_empty(N, K)))
    y = x.new_empty(*x.shape[:-1], N)
    if path == "gemm":
        return layer.matmul(x, y)
    layer.launch_chunks(x.view(tokens, K), y.view(tokens, N))
    return y


def _on_the_gpu(layer: GemvWeights, x: torch.Tensor, chunked: int = -1, gemm_max: int = -1) -> torch.Tensor:
    """The op's GPU kernel (x contiguous): the path Int4Linear's eager call takes (_gpu_path) at
    the given limits (-1: the layer's shape's chunked_tokens, gemm_max_tokens), chosen when it
    runs, so that a compiled model is one graph whatever the prompt's length."""
    N, K = layer.N, layer.K
    if not x.shape or x.shape[-1] != K or x.dtype not in INPUT_DTYPES:
        return layer(x)  # GemvWeights' checks say what is wrong
    tokens = x.numel() // K
    chunked = chunked_tokens(N, K) if chunked < 0 else chunked
    path = _gpu_path(layer, x.dtype, tokens, chunked, gemm_max_tokens(N, K) if gemm_max < 0 else gemm_max)
    if path == "chunks" and layer in _no_chunks:
        path = "dense"
    if path in ("gemm", "chunks", "dense"):
        _check_prompt(layer, x, tokens)
    if path == "chunks":
        try:
            return _run(layer, path, x, tokens)
        except NotImplementedError as e:
            _no_chunks.add(layer)
            log.warning("int4jit: int4jit::gemv %dx%d dequantises for %d to %d tokens: %s", N, K,
                        MAX_TOKENS + 1, chunked, e)
            path = "dense"
    return _run(layer, path, x, tokens)


@gemv_op.register_kernel("cpu")
def _(x, w, scales, zeros, chunked=-1, gemm_max=-1):
    _check_input_dtype(x, "int4jit::gemv")
    return torch.matmul(x, _unpack_dequantize(w, scales, zeros, x.dtype).t())


@gemv_op.register_fake
def _(x, w, scales, zeros, chunked=-1, gemm_max=-1):
    _check_input_dtype(x, "int4jit::gemv")
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _check_input_dtype(x: torch.Tensor, who: str) -> None:
    """An integer x would meet a weight dequantised to integers, truncated to zeros: refused."""
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{who} takes float16 or bfloat16 inputs (the int4jit kernels), or float32 or float64 "
                        f"(dequantise + matmul); got {x.dtype}")


def _gemv_setup_context(ctx, inputs, output):
    ctx.weights = inputs[1:4]


def _gemv_backward(ctx, grad):
    """dL/dx = dL/dy @ W, with W dequantised for the backward (fine-tuning adapters on frozen int4
    weights); no gradient for the int4 weights."""
    W = _unpack_dequantize(*ctx.weights, grad.dtype)
    return torch.matmul(grad, W), None, None, None, None, None


gemv_op.register_autograd(_gemv_backward, setup_context=_gemv_setup_context)


# -- the module -------------------------------------------------------------------------
class Int4Linear(nn.Module):
    """nn.Linear with INT4 weights in int4jit's canonical layout.

    forward on [..., K] with 1..16 tokens, fp16 or bf16, on the GPU runs the int4jit kernels on
    torch's current stream (graph capture works): one token on the simt or tc kernel, several on
    the tensor-core kernels (NVIDIA sm_80+); a dtype and token count no kernel serves on the
    target falls back, said once. Up to `chunked_tokens` (CHUNK_LIMITS) the kernel runs once per 16
    tokens, but on Hopper (sm_90) a prompt of GEMM_MIN_TOKENS to `gemm_max_tokens` (GEMM_MAX_TOKENS,
    or 0 under GEMM_MIN_BYTES of weights) runs the int4 GEMM (GemvWeights.matmul); other prefills
    dequantise once per call on the GPU with one int4jit launch (templates/dequant.hip) and use
    torch.matmul; on the CPU the dequantised weight is kept per module (up to
    CPU_DENSE_CACHE_BYTES). Under torch.compile, and on the GPU where x requires grad (grad
    enabled), every call is one node of the custom op, which takes the same paths when it runs,
    at the module's `chunked_tokens` and `gemm_max_tokens` (a compiled graph holds the values it
    was traced with); its backward gives dL/dx (the int4 weights are constants). A
    conversion of the model's dtype leaves the scales as quantised. The weight buffers are
    GemvWeights' (fixed while in use: a kernel that writes them must not be the one launched right
    before the layer's call on its stream)."""

    def __init__(self, w, scales, zeros=None, bias=None, perm=None):
        super().__init__()
        as_t = lambda a: a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
        self.register_buffer("w", as_t(w))
        self.register_buffer("scales", as_t(scales))
        self.register_buffer("zeros", None if zeros is None else as_t(zeros))
        # act-order checkpoints: x is gathered as x[..., perm] first (int64 for index_select)
        self.register_buffer("perm", None if perm is None else as_t(perm).to(torch.int64))
        self.bias = None if bias is None else nn.Parameter(as_t(bias).detach().clone(), requires_grad=False)
        self.out_features, self.in_features = self.w.shape[0], 2 * self.w.shape[1]
        if self.bias is not None and tuple(self.bias.shape) != (self.out_features,):  # (1,) would broadcast
            raise ValueError(f"bias must have shape ({self.out_features},), one value an output row; "
                             f"got {tuple(self.bias.shape)}")
        if self.w.device.type != "meta":  # the layout gemv takes, checked now rather than at the first call
            validate(torch.empty(self.in_features, dtype=torch.float16, device=self.w.device), self.w, self.scales,
                     self.zeros, None)
        if self.perm is not None:  # checked once here: an index outside K faults the gather on a GPU
            fault = (permutation_fault(torch, self.perm) if tuple(self.perm.shape) == (self.in_features,)
                     else f"of shape ({self.in_features},); got {tuple(self.perm.shape)}")
            if fault is not None:
                raise ValueError(f"perm must be {fault}")
        self.group_size = self.in_features // self.scales.shape[1]
        self._layer: Optional[GemvWeights] = None
        # ((x.shape, x.dtype), chunked_tokens, gemm_max_tokens) -> x -> y without bias: the path a
        # GPU prefill of that shape took (the int4 GEMM, or dequantise + cuBLAS), for the next one
        self._prompts: dict = {}
        self._dense: Optional[torch.Tensor] = None  # the CPU's dequantised weight, and what it was made of
        self._dense_of: tuple = _NO_DENSE
        self._warned = False
        self._no_kernel: set = set()  # (dtype, tokens) no kernel serves on this layer's target
        self.chunked_tokens = chunked_tokens(self.out_features, self.in_features)
        self.gemm_max_tokens = gemm_max_tokens(self.out_features, self.in_features)  # 0: never the GEMM
        self._shared = None  # a _Watch or _Fused shared with sibling layers (fuse_shared_inputs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, symmetric: bool = False) -> "Int4Linear":
        """Quantise on the layer's own device (GPU weights never leave it)."""
        w, s, z = quantize(linear.weight.detach(), group_size, symmetric)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float16)
        return cls(w, s, z, bias).to(linear.weight.device)

    def _apply(self, fn, *args, **kwargs):
        """.to(device) moves every buffer; a dtype conversion of the model (model.float(), .half(),
        .to(torch.bfloat16)) leaves the scales in the type they were quantised in (the kernels
        read float16 or bfloat16 scales, and a cast would change the quantised weights)."""
        scales = self._buffers["scales"]
        if isinstance(self._shared, _Fused):  # the group's weights are made again from the moved ones
            self._shared.release()
        moved = fn(scales[:0])  # what fn makes of the scales (an empty view: nothing copied)
        if moved.dtype == scales.dtype:
            return super()._apply(fn, *args, **kwargs)
        self._buffers["scales"] = None  # skipped by the conversion, then only moved
        try:
            return super()._apply(fn, *args, **kwargs)
        finally:
            self._buffers["scales"] = scales.to(moved.device)

    def __getstate__(self):  # copy/pickle: the prepared launch is per process, made again on use; a copy
        # runs unfused (its weights stay views of one tensor where they were fused)
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        return {**state, "_layer": None, "_prompts": {}, "_shared": None, "_dense": None, "_dense_of": _NO_DENSE}

    def __setstate__(self, state):  # a module pickled before chunked_tokens (or the GEMM) existed gets it
        super().__setstate__(state)
        if "chunked_tokens" not in self.__dict__:
            self.chunked_tokens = chunked_tokens(self.out_features, self.in_features)
        if "gemm_max_tokens" not in self.__dict__:
            self.gemm_max_tokens = gemm_max_tokens(self.out_features, self.in_features)
        self.__dict__.setdefault("_prompts", {})
        self.__dict__.setdefault("_shared", None)
        self.__dict__.setdefault("_dense_of", _NO_DENSE)

    @classmethod
    def from_weights(cls, weights) -> "Int4Linear":
        """From a converter's result (int4jit.Int4Weights: from_gptq, from_awq, from_matmulnbits,
        onnx.load's nodes), act-order permutation and bias included."""
        return cls(weights.w, weights.scales, weights.zeros, getattr(weights, "bias", None),
                   getattr(weights, "perm", None))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"symmetric={self.zeros is None}, bias={self.bias is not None}, act_order={self.perm is not None}")

    def _prepared(self) -> GemvWeights:
        layer = self._layer
        if layer is None or layer.w is not self.w:  # made once; again after .to()/.cuda()
            layer = self._layer = GemvWeights(self.w, self.scales, self.zeros)
            self._prompts.clear()  # they hold the layer made before
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()
        if not compiling and self._shared is not None:  # siblings called on one x: one launch (fuse_shared_inputs)
            y = self._shared(self, x)
            if y is not None:
                return y
        layer = self._layer
        # The eager call, kept lean (each tensor attribute costs ~0.1 us, a reshape ~1.4, a
        # buffer read as self.w ~0.9: self._buffers is read instead): an x whose shape and dtype
        # an earlier call checked and planned (layer.calls: decode) or took a prefill path for
        # (self._prompts), contiguous, on the layer's GPU, no gradient wanted, the weights not
        # moved since prepared. Anything else takes the full path below, which makes the entry.
        # Under torch.compile the second test is false, and the op below is all that is traced.
        if layer is not None and not compiling and layer.w is self._buffers["w"] \
                and self._buffers["perm"] is None and x.get_device() == layer.device_index and x.is_contiguous() \
                and not x.requires_grad:
            key = (x.shape, x.dtype)
            call = layer.calls.get(key)
            if call is not None:
                y = layer.launch_shaped(call, x)
                return y if self.bias is None else y.add_(self.bias)  # in y's dtype, whatever the bias's
            prompt = self._prompts.get((key, self.chunked_tokens, self.gemm_max_tokens))
            if prompt is not None:
                y = prompt(x)
                return y if self.bias is None else y.add_(self.bias)
        if not x.dim() or x.shape[-1] != self.in_features:
            raise ValueError(f"Int4Linear expects [..., {self.in_features}] inputs; got {tuple(x.shape)}")
        _check_input_dtype(x, "Int4Linear")
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        if compiling or (x.is_cuda and x.requires_grad and torch.is_grad_enabled()):
            # one node of the op whatever x is (a graph's; its backward): it picks the path when it runs
            return self._plus_bias(torch.ops.int4jit.gemv(x, self.w, self.scales, self.zeros, self.chunked_tokens,
                                                          self.gemm_max_tokens))
        if not x.is_cuda:
            return self._on_the_cpu(x)
        return self._on_the_gpu(x if x.is_contiguous() else x.contiguous())

    def path(self, x: torch.Tensor) -> str:
        """The way an eager call on x goes: "cpu", or on the GPU one of _gpu_path's (with this
        module's chunked_tokens and gemm_max_tokens; a token count no kernel serves here, once
        seen, "dense")."""
        return self._path_on_its_gpu(self._prepared(), x, x.numel() // self.in_features) if x.is_cuda else "cpu"

    def _path_on_its_gpu(self, layer: GemvWeights, x: torch.Tensor, tokens: int) -> str:
        """path(x) for an x on the layer's GPU (_on_the_gpu's; its tests' x is on the CPU)."""
        path = _gpu_path(layer, x.dtype, tokens, self.chunked_tokens, self.gemm_max_tokens)
        return "dense" if path in ("gemv", "chunks") and (x.dtype, tokens) in self._no_kernel else path

    def _on_the_gpu(self, x: torch.Tensor) -> torch.Tensor:
        """A GPU call (x contiguous) by its path; a prompt's path is kept for the next x of its
        shape (_remember). A kernel the target lacks is said once, then that token count dequantises."""
        layer, tokens = self._prepared(), x.numel() // self.in_features
        path = self._path_on_its_gpu(layer, x, tokens)
        if path in ("gemm", "chunks", "dense"):
            _check_prompt(layer, x, tokens)
        if path in ("gemv", "chunks"):
            try:
                return self._plus_bias(_run(layer, path, x, tokens))
            except NotImplementedError as e:  # e.g. several tokens or bf16 on a target without tensor-core kernels
                self._no_kernel.add((x.dtype, tokens))
                log.warning("int4jit: Int4Linear %dx%d falls back to dequantise + matmul: %s", self.out_features,
                            self.in_features, e)
                path = "dense"
        if path == "float":
            self._say_fallback(f"{x.dtype} activations", x, tokens)
        elif path == "dense" and tokens > MAX_TOKENS:  # (a missing kernel was warned above)
            self._say_fallback("several tokens (prefill)", x, tokens, warn=False)
        y = _run(layer, path, x, tokens)
        if path in ("gemm", "dense"):
            self._remember(x, lambda x: _run(layer, path, x, tokens))
        return self._plus_bias(y)

    def _remember(self, x: torch.Tensor, prompt) -> None:
        """Keep the path a GPU prefill of x's shape and dtype took, for the next such call; past
        PROMPT_SHAPES shapes the oldest goes."""
        if len(self._prompts) >= PROMPT_SHAPES:
            del self._prompts[next(iter(self._prompts))]
        self._prompts[(x.shape, x.dtype), self.chunked_tokens, self.gemm_max_tokens] = prompt

    def _plus_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _say_fallback(self, why: str, x: torch.Tensor, tokens: int, warn: bool = True) -> None:
        """A call that dequantises + multiplies, and why: warned once per module (float32/64
        activations, the CPU); with warn=False (a GPU prefill, the designed path for long prompts)
        only traced, leaving the warning for a later call that is a fallback."""
        if warn and self._warned:
            return
        self._warned = self._warned or warn
        (log.warning if warn else trace)(
            "int4jit: Int4Linear %dx%d runs dequantise + torch.matmul for %s (%d token%s, %s on %s)",
            self.out_features, self.in_features, why, tokens, "" if tokens == 1 else "s", x.dtype, x.device)

    def _cpu_dense(self, dtype) -> torch.Tensor:
        """The dequantised weight in `dtype`, kept per module (up to CPU_DENSE_CACHE_BYTES) until the
        weights are replaced or written in place (load_state_dict copies into them)."""
        weights = (self.w, self.scales, self.zeros)
        versions = tuple(-2 if t is None else _version(t) for t in weights)
        kept = self._dense_of
        if self._dense is not None and kept[0] is dtype and all(a is b for a, b in zip(kept[1], weights)) \
                and kept[2] == versions:
            return self._dense
        W = _unpack_dequantize(*weights, dtype)
        if W.numel() * W.element_size() <= CPU_DENSE_CACHE_BYTES:
            self._dense, self._dense_of = W, (dtype, weights, versions)
        return W

    def _on_the_cpu(self, x: torch.Tensor) -> torch.Tensor:
        self._say_fallback("the CPU", x, x.numel() // self.in_features)
        return self._plus_bias(torch.matmul(x, self._cpu_dense(x.dtype).t()))


# -- layers that share their input ------------------------------------------------------
# Groups hold their members by weak reference: a member refers to its group (_shared), and a cycle
# would keep a deleted model's GPU memory until the garbage collector runs.
def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _fusable(m: "Int4Linear") -> tuple:
    """What layers must have in common to be fused: equal keys."""
    return m.in_features, m.group_size, m.zeros is None, m.scales.dtype, m.w.device, m.perm is None


def _names(members) -> str:
    return " + ".join(f"{m.out_features}x{m.in_features}" for m in members)


def _views_aligned(members) -> bool:
    """Whether each member's rows of the concatenated w, scales and zeros would start on a 16-byte
    boundary, as the kernels read them (validate): a member may run alone on its views (under
    torch.compile, in a copy, after a split-up)."""
    row_bytes = [t[0].numel() * t.element_size() for t in (members[0].w, members[0].scales, members[0].zeros)
                 if t is not None]
    start = 0
    for m in members:
        if any(start * b % 16 for b in row_bytes):
            return False
        start += m.out_features
    return True


class _Watch:
    """Sibling Int4Linears that may be called on one x (as q/k/v and gate/up are): their eager
    calls are watched until each member has been in a run of calls (members called one after
    another with the same, unchanged x object). Members that ran together are fused (_Fused); one
    that ran alone stops being watched. Nothing is decided during a CUDA graph capture."""

    def __init__(self, members):
        self.x, self.version, self.run = None, 0, []  # run: weak references
        for m in members:
            m._shared = self

    def __call__(self, member: "Int4Linear", x: torch.Tensor) -> Optional[torch.Tensor]:
        me = weakref.ref(member)
        if x is not self.x or _version(x) != self.version or me in self.run:
            run, self.run, self.x = [r() for r in self.run], [], None  # the run so far has ended
            if not _capturing(x):  # (fusing copies the weights: a capture would only record that)
                if len(run) == 1 and run[0] is not None:
                    run[0]._shared = None
                elif len(run) > 1 and None not in run:
                    if _views_aligned(run):
                        _Fused(run)
                    else:
                        trace("not fusing layers %s: a member's rows would start off a 16-byte boundary", _names(run))
                        for m in run:
                            m._shared = None
            if member._shared is not self:  # fused with the run just ended, or let go
                return None if member._shared is None else member._shared(member, x)
            self.x, self.version = x, _version(x)
        self.run.append(me)
        return None  # the member computes its own output


class _Fused:
    """Int4Linears called on one x, computed together: their weights are concatenated into one
    Int4Linear (each member's w, scales, zeros and bias become views of its tensors, so nothing is
    held twice), the first member called with an x runs it once for all, and the others return
    their slice of its output while they are called with that same, unchanged x. A member called
    with another x while a slice is still waiting splits the group up (said once): each member
    then runs alone on its views."""

    def __init__(self, members):
        self.refs = tuple(weakref.ref(m) for m in members)
        self.index = {id(m): i for i, m in enumerate(members)}
        self.sizes = [m.out_features for m in members]
        self.views: tuple = ()  # the members' w as made by build: another one means they changed
        self.release()
        for m in members:
            m._shared = self
        self.build(members)
        trace("fused layers that share their input: %s", _names(members))

    @property
    def members(self) -> tuple:
        return tuple(r() for r in self.refs)

    def build(self, ms) -> None:
        """Concatenate the members' weights into one Int4Linear; the members' tensors become views of it."""
        cat = lambda name: None if ms[0]._buffers[name] is None else torch.cat([m._buffers[name] for m in ms])
        given = [m.bias for m in ms if m.bias is not None]  # zeros for members without one, in the biases' dtype
        bias = torch.cat([m.bias.detach().to(given[0].dtype) if m.bias is not None
                          else given[0].new_zeros(m.out_features) for m in ms]) if given else None
        self.linear = Int4Linear(cat("w"), cat("scales"), cat("zeros"), bias)
        start = 0
        for m, n in zip(ms, self.sizes):
            for name in ("w", "scales", "zeros"):
                if m._buffers[name] is not None:
                    m._buffers[name] = self.linear._buffers[name][start:start + n]
            if m.bias is not None:
                m.bias = nn.Parameter(self.linear.bias[start:start + n], requires_grad=False)
            m._layer, m._dense, m._dense_of = None, None, _NO_DENSE  # what held their own weights
            m._prompts.clear()
            start += n
        self.views = tuple(m._buffers["w"] for m in ms)

    def release(self) -> None:
        """A member was moved or converted: the concatenated weights are made again at the next call."""
        self.linear: Optional[Int4Linear] = None
        self.x, self.version, self.waiting, self.left = None, 0, [None] * len(self.refs), 0

    def split_up(self, why: str) -> None:
        ms = [m for m in self.members if m is not None]
        log.warning("int4jit: layers %s no longer run as one (%s); each runs alone from now on", _names(ms), why)
        for m in ms:
            m._shared = None

    def __call__(self, member: "Int4Linear", x: torch.Tensor) -> Optional[torch.Tensor]:
        i = self.index[id(member)]
        if self.linear is None or member._buffers["w"] is not self.views[i]:  # moved, converted or assigned
            ms = self.members
            if None in ms or len({_fusable(m) for m in ms}) > 1:
                self.split_up("they no longer have one device, scales dtype and format")
                return None
            if _capturing(x):  # making the weights again would only be recorded
                self.split_up("its weights changed and a CUDA graph is being captured")
                return None
            self.release()
            self.build(ms)
        elif x is self.x and _version(x) == self.version:
            y = self.waiting[i]
            if y is not None:
                self.waiting[i] = None
                self.left -= 1
                if not self.left:
                    self.x = None
                return y
        elif self.left:
            self.split_up("a layer was called with another input before the last one's output was taken")
            return None
        ys = self.linear.forward(x).split_with_sizes(self.sizes, -1)
        ys = [y if y.is_contiguous() else y.contiguous() for y in ys]  # as nn.Linear gives them
        y, ys[i] = ys[i], None
        self.x, self.version, self.waiting, self.left = x, _version(x), ys, len(ys) - 1
        return y


def fuse_shared_inputs(model: nn.Module) -> int:
    """Let the Int4Linear children of each module that are called on the same x (q/k/v, gate/up)
    run as one launch. Candidates are a module's Int4Linear children with one in_features, group
    size, symmetry, scales dtype and device, and no act-order permutation; the model's first eager
    calls show which of them share x (see _Watch), and only those are fused. Under torch.compile,
    and for a copy of the model, each layer runs alone. Fused layers' weights are views of one
    tensor (torch.save keeps them so; safetensors wants each cloned); a group runs as one
    Int4Linear with its own chunked_tokens and gemm_max_tokens. Under torch.inference_mode an
    in-place write to x between the members' calls goes unseen (inference tensors keep no version
    counter). Returns how many groups of candidates are watched."""
    watched = 0
    for module in model.modules():
        groups: dict = {}
        for child in module.children():
            if isinstance(child, Int4Linear) and child.perm is None and child.w.device.type != "meta":
                groups.setdefault(_fusable(child), []).append(child)
        for members in groups.values():
            if len(members) > 1:
                _Watch(members)
                watched += 1
    return watched


def quantize_model(model: nn.Module, group_size: int = 128, symmetric: bool = False, skip=(),
                   fuse: bool = True) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by an Int4Linear, quantised on its own device,
    except those whose qualified name matches a pattern in `skip` (fnmatch, e.g. 'lm_head' or
    '*.attn.*') and those whose in_features is not a multiple of group_size (kept in floating
    point, and named in one warning). A progress bar shows on a terminal.
    fuse: layers called on the same x run as one launch (fuse_shared_inputs)."""
    todo, kept = [], []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if not isinstance(child, nn.Linear) or any(fnmatch.fnmatch(full, pat) for pat in skip):
                continue
            (kept if child.in_features % group_size else todo).append((module, child_name, child, full))
    if kept:
        log.warning("int4jit: quantize_model keeps %d of %d nn.Linear layers in floating point: in_features not a "
                    "multiple of group_size=%d (%s); a group_size that divides them quantises them too, "
                    "skip=[...] names layers to keep on purpose", len(kept), len(kept) + len(todo), group_size,
                    _first([f"{full} ({child.in_features})" for _, _, child, full in kept]))
    for module, child_name, child, _ in tqdm(todo, desc="quantize_model", unit="layer", disable=None):
        setattr(module, child_name, Int4Linear.from_linear(child, group_size, symmetric))
    if fuse:
        fuse_shared_inputs(model)
    return model


QUANTIZED_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "bias")  # a GPTQ/AWQ layer's tensors
INT4JIT_SUFFIXES = ("w", "scales", "zeros", "perm", "bias")  # an Int4Linear's state_dict


def load_quantized(model: nn.Module, tensors, config: Optional[dict] = None, fuse: bool = True) -> nn.Module:
    """Load a quantized checkpoint into `model` in place: a GPTQ or AWQ one, or a state_dict of a
    model int4jit quantized (quantize_model, then torch.save or safetensors). The model is built
    from the checkpoint's config, its weights random (on the meta device only where the
    checkpoint holds every tensor it has, which a model's computed buffers such as rotary
    inv_freq are not).
    Each nn.Linear of the model whose qualified name has `<name>.qweight` (GPTQ/AWQ: read with
    `config`, the checkpoint's quantization_config or its config.json, as from_quantized_layer
    says) or `<name>.w` and `<name>.scales` (int4jit's) in `tensors` becomes an Int4Linear holding
    that layer's tensors, on the linear's device (the CPU for a meta one). Every other tensor is
    loaded as load_state_dict loads it; the model's parameters and buffers that the checkpoint
    lacks are named in one warning (a tied lm_head is not).
    Errors, raised before anything is swapped: tensors the model does not have, meta tensors the
    checkpoint does not fill, GPTQ/AWQ layers without a config. Errors naming the layer: one that
    is not an nn.Linear of the model, a shape that is not the linear's, tensors its format rejects.
    tensors: {name: tensor} of the whole checkpoint, e.g. safetensors.torch.load_file's (a sharded
    checkpoint: its shards' dicts merged; torch tensors on any device, or numpy arrays).
    fuse: layers called on the same x run as one launch (fuse_shared_inputs)."""
    gptq = {name[:-len(".qweight")] for name in tensors if name.endswith(".qweight")}
    own = {n for n in (name[:-len(".w")] for name in tensors if name.endswith(".w"))
           if f"{n}.scales" in tensors and isinstance(_submodule(model, n), nn.Linear)}
    layers = {**{n: QUANTIZED_SUFFIXES for n in gptq}, **{n: INT4JIT_SUFFIXES for n in own - gptq}}
    if gptq and config is None:
        raise TypeError(f"the checkpoint has GPTQ/AWQ layers ({sorted(gptq)[0]}, ...): pass its quantize config "
                        f"(config.json's quantization_config) as config=")
    model_keys = set(model.state_dict()) | {f"{n}.{s}" for n, suffixes in layers.items() for s in suffixes}
    unexpected = [k for k in tensors if k not in model_keys]
    if unexpected:
        raise ValueError(f"the checkpoint has {len(unexpected)} tensors the model does not: {_first(unexpected)}")
    still_meta = [n for n, t in (*model.named_parameters(), *model.named_buffers())
                  if t.is_meta and n not in tensors and n.rpartition(".")[0] not in layers]
    if still_meta:
        raise ValueError(f"{len(still_meta)} of the model's tensors are on the meta device and not in the checkpoint "
                         f"({_first(still_meta)}), e.g. buffers a model computes when built: build the model "
                         f"on a device (dtype=torch.float16 keeps it small)")
    used = set()
    for name in tqdm(sorted(layers), desc="load_quantized", unit="layer", disable=None):
        linear = _submodule(model, name)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"checkpoint layer {name!r} has quantized tensors, but the model's {name!r} is "
                             f"{type(linear).__name__ if linear is not None else 'missing'}; expected an nn.Linear "
                             f"(is the model built from the checkpoint's config?)")
        keys = {s: f"{name}.{s}" for s in layers[name] if f"{name}.{s}" in tensors}
        try:
            if name in gptq:
                layer = Int4Linear.from_weights(from_quantized_layer(config, {s: tensors[k] for s, k in keys.items()}))
            else:
                layer = Int4Linear(*(tensors.get(keys.get(s)) for s in ("w", "scales", "zeros", "bias", "perm")))
        except (ValueError, TypeError) as e:
            raise type(e)(f"checkpoint layer {name!r}: {e}") from None
        if (layer.out_features, layer.in_features) != (linear.out_features, linear.in_features):
            raise ValueError(f"checkpoint layer {name!r} holds {layer.out_features}x{layer.in_features} weights; the "
                             f"model's linear is {linear.out_features}x{linear.in_features}")
        parent, _, child = name.rpartition(".")
        device = linear.weight.device if linear.weight.device.type != "meta" else torch.device("cpu")
        setattr(model.get_submodule(parent), child, layer.to(device))
        used.update(keys.values())
    rest = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
            for k, v in tensors.items() if k not in used}
    meta = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    missing, _ = model.load_state_dict(rest, strict=False, assign=meta)  # none unexpected: checked above
    quantized = {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, Int4Linear) for k in m.state_dict()}
    missing = [k for k in missing if k not in quantized and not _tied(model, k)]
    if missing:
        log.warning("int4jit: load_quantized: the checkpoint lacks %d of the model's tensors, left as they were: %s",
                    len(missing), _first(missing))
    if fuse:
        fuse_shared_inputs(model)
    return model


def _first(names: list, count: int = 4) -> str:
    """The first `count` names, comma-separated, with ', ...' where there are more (messages)."""
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")


def _submodule(model: nn.Module, name: str) -> Optional[nn.Module]:
    """The module at qualified `name` ('' is the model), or None."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _tied(model: nn.Module, key: str) -> bool:
    """Whether parameter `key` is the same tensor as another of the model's (a tied lm_head)."""
    module_name, _, attr = key.rpartition(".")
    t = getattr(_submodule(model, module_name), attr, None)
    return isinstance(t, torch.Tensor) and sum(p is t for _, p in model.named_parameters(remove_duplicate=False)) > 1
