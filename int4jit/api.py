"""int4jit.gemv: validate -> plan (one KernelSpec) -> build/cache -> load -> launch."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
import threading
import weakref

import numpy as np

from . import backends
from .arrays import describe, ranges_overlap
from .backends._args import PackedArgs
from .env import ALIASES
from .launch import Kernel, load
from .plan import PLAN_VARIABLES, config_override, plan, read_env
from .shapes import MAX_TOKENS, GemvShape
from .spec import gemm_rows, gemm_unsupported, gemm_workspace_bytes, make_dequant_spec, make_gemm_spec, make_xperm_spec
from .trace import trace
from .validate import validate, validate_x

_ENV_KEYS = tuple(v for name in PLAN_VARIABLES for v in ALIASES[name])  # every alias of each
_kernels: dict[tuple, Kernel] = {}
_kernels_lock = threading.Lock()
_local = threading.local()  # per-thread prepared weight sets: their argument buffers are mutated
_NO_WEIGHTS: dict = {}      # a thread's weight sets before it has prepared any
_MAX_PREPARED = 4096


def _env_reader():
    """A function returning the plan-relevant variables' raw values, read on every call so later
    changes take effect. os.environ keeps its encoded items in _data; a dict lookup there costs
    0.1 us where os.environ.get costs 1.5 us, which matters on the per-call path."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and encode is not None:
        keys, get = tuple(encode(k) for k in _ENV_KEYS), data.get
        return lambda: tuple(map(get, keys))
    return lambda: tuple(os.environ.get(k) for k in _ENV_KEYS)


_env_state = _env_reader()


def kernel_for(dev, shape: GemvShape, config, stream: int, fixed_weights: bool = False, tune: bool = True) -> Kernel:
    """The loaded kernel for this call. Planned once per (device, shape, config, environment
    state, fixed_weights, tune): changing INT4JIT_CONFIG later in the process takes effect.
    tune=False: no runtime search (the tuning DB, the table or the heuristic)."""
    key = (dev, shape, config if config is None or isinstance(config, str) else tuple(config), _env_state(),
           fixed_weights, tune)
    k = _kernels.get(key)
    if k is None:
        # Benchmarking while the stream records a graph would launch into it: cheap tiers only,
        # and a heuristic pick made then is not kept (the next call outside the capture tunes).
        capturing = dev.is_capturing(stream)
        p = plan(shape, dev.arch, dev, env=read_env(), config=config, tune=tune and not capturing,
                 fixed_weights=fixed_weights)
        k = load(dev, p.spec)
        if p.tier != "heuristic" or not (capturing and tune):
            with _kernels_lock:
                _kernels[key] = k
    return k


def y_like(one, x, N: int):
    """`one` (a one-element tensor of x's dtype on x's device) expanded to y's shape [..., N]:
    torch.empty_like of it (contiguous format) is the cheapest new y from Python, 0.9 us on the
    dev machine against 1.3 for x.new_empty(tuple) and 1.8 for x.new_empty(torch.Size)."""
    return one.expand(*x.shape[:-1], N)


def new_y(torch, likes: dict, x, N: int):
    """A new contiguous y [..., N] for x [..., K], in x's dtype on x's device, from the y_like
    kept in `likes` per x shape."""
    shape = x.shape
    like = likes.get(shape)
    if like is None or like.dtype is not x.dtype:
        if len(likes) >= 64:
            likes.clear()
        like = likes[shape] = y_like(x.new_empty(1), x, N)
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def weight_ones(torch, w) -> dict:
    """One element of each activation dtype viewing w's first bytes, for y_like: what a
    ShapedCall keeps to make y from allocates nothing. Memory a call kept would break
    torch.compile's CUDA graphs (mode="reduce-overhead"): their warm-up runs allocate from the
    graphs' pool, which refuses to record while a tensor that is not an output lives there."""
    return {dt: w.reshape(-1)[:2].view(dt) for dt in (torch.float16, torch.bfloat16)}


class ShapedCall:
    """What GemvWeights launches for one x shape and dtype, made by the first checked call of
    them: the token count, y's y_like and the launch planned under one environment state."""
    __slots__ = ("tokens", "like", "env", "launch")

    def __init__(self, tokens: int, like, env: tuple, launch):
        self.tokens, self.like, self.env, self.launch = tokens, like, env, launch


class _PreparedWeights:
    """A validated weight set (w, scales, zeros: torch tensors on one GPU), kept while the same
    tensor objects come back, so that a call with a new x and out (as a model makes them) checks
    only what x and out can change (dtype, tokens, K, device, contiguity, alignment) and launches.
    Every tensor's data pointer is re-read each call (a tensor given new storage is followed); a
    weight tensor reshaped in place keeps its storage, so the kernel stays inside it. Anything
    the checks do not accept goes the full way (validate), which names what is wrong."""
    __slots__ = ("refs", "shape", "device_index", "dev", "launches", "args", "values", "stream_of", "dtypes", "torch",
                 "out_like")

    def __init__(self, shape: GemvShape, w, scales, zeros, device_index: int, dev):
        self.refs = tuple(None if t is None else weakref.ref(t) for t in (w, scales, zeros))
        self.shape = replace(shape, M=1, dtype="float16")  # the weights' part; a call sets M and dtype
        self.device_index = device_index
        self.dev = dev
        self.launches: dict = {}  # (tokens, dtype, config, environment state) -> launch
        self.args = PackedArgs([0] * 5)
        self.values = self.args.values
        self.stream_of = torch_stream_getter()
        torch = sys.modules["torch"]
        self.dtypes = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
        self.torch = torch
        self.out_like: dict = {}  # x.shape -> one element expanded to y's shape (new_y)

    def holds(self, w, scales, zeros) -> bool:
        rw, rs, rz = self.refs
        return rw() is w and rs() is scales and (rz is None if zeros is None else rz() is zeros)

    def __call__(self, x, w, scales, zeros, out, stream, config, config_key):
        """out (made when None), or None where x or out need the full checks."""
        dt = x.dtype
        shape = x.shape
        ndim = len(shape)
        tokens = 1 if ndim == 1 else shape[0] if ndim == 2 else 0
        N = self.shape.N
        if dt not in self.dtypes or not 1 <= tokens <= MAX_TOKENS or shape[-1] != self.shape.K \
                or not x.is_contiguous() or x.get_device() != self.device_index:
            return None
        y_shape = (N,) if ndim == 1 else (tokens, N)
        given = out is not None
        if not given:
            out = new_y(self.torch, self.out_like, x, N)
        elif out.dtype is not dt or out.shape != y_shape or not out.is_contiguous() \
                or out.get_device() != self.device_index:
            return None
        x_ptr, out_ptr = x.data_ptr(), out.data_ptr()
        if (x_ptr | out_ptr) & 15 or (given and ranges_overlap(x_ptr, 2 * tokens * self.shape.K, out_ptr, 2 * tokens * N)):
            return None  # misaligned, or out overlapping x: the full checks say which
        s = self.stream_of(self.device_index) if stream is None else stream_handle(stream, None)
        key = (tokens, dt, config_key, _env_state())
        launch = self.launches.get(key)
        if launch is None:
            shape_now = replace(self.shape, M=tokens, dtype=self.dtypes[dt])
            launch = kernel_for(self.dev, shape_now, config, s).launch_packed
            if not self.dev.is_capturing(s):  # a pick made inside a capture is not kept (kernel_for)
                self.launches[key] = launch
        v = self.values
        v[0] = x_ptr
        v[1] = w.data_ptr()
        v[2] = scales.data_ptr()
        v[3] = 0 if zeros is None else zeros.data_ptr()
        v[4] = out_ptr
        launch(self.args, s)
        return out


def _prepared_weights() -> dict:
    """This thread's prepared weight sets (their argument buffers are mutated by each call)."""
    sets = getattr(_local, "weights", None)
    if sets is None:
        sets = _local.weights = {}
    return sets


def torch_stream_getter():
    """index -> the current torch stream's raw handle (the private call is ~2 us cheaper)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


def stream_handle(stream, xi) -> int:
    """The caller's stream as a raw handle; by default the framework's current stream."""
    if stream is None:
        if xi.framework == "torch":
            return torch_stream_getter()(xi.device[1])
        if xi.framework == "cupy":
            return sys.modules["cupy"].cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    raise TypeError(f"stream must be an int handle, a torch/cupy stream or an object with "
                    f"__cuda_stream__; got {type(stream).__qualname__}")


def _new_output(xi, out_shape):
    if xi.framework == "torch":
        return xi.obj.new_empty(out_shape)
    if xi.framework == "cupy":
        return sys.modules["cupy"].empty(out_shape, dtype=np.float16)
    raise TypeError(f"x is a {xi.framework} device array: pass out= (a float16 device array of "
                    f"shape {out_shape}), int4jit allocates outputs only for torch and cupy")


# Values of device arrays that passed a check (zero points in range, a permutation), by object:
# the check is a reduction that synchronises, so it runs once per array, not per call.
_values_checked: dict[tuple, weakref.ref] = {}


def _check_values(what: str, info, check, stream=None) -> None:
    """Raise ValueError(f"{what} must be {check(xp, a)}") where the check finds a fault (None: it
    passed). numpy arrays are checked every call; torch and cupy device arrays once per object,
    outside graph capture (a capture cannot synchronise: traced, and checked at the next call);
    other device arrays are not checked (traced)."""
    a = info.obj
    if info.framework != "numpy":
        key = (what, id(a))
        ref = _values_checked.get(key)
        if ref is not None and ref() is a:
            return
        if info.framework not in ("torch", "cupy"):
            trace("%s: a %s device array's values are not checked", what, info.framework)
            return
        if backends.device(info.device[1]).is_capturing(stream_handle(stream, info)):
            trace("%s: values not checked during graph capture", what)
            return
    fault = check(np if info.framework == "numpy" else sys.modules[info.framework], a)
    if fault is not None:
        raise ValueError(f"{what} must be {fault}")
    if info.framework != "numpy":
        try:
            _values_checked[key] = weakref.ref(a, lambda _ref, k=key: _values_checked.pop(k, None))
        except TypeError:  # an array type without weak references: checked again next call
            pass


def zero_point_fault(xp, zeros):
    top = int(zeros.max())
    return None if top <= 15 else f"zero points 0..15 (4 bits); got a maximum of {top}"


def permutation_fault(xp, perm):
    """perm sorted must be 0, 1, ..., K-1 (an index outside K would fault the gather on a GPU)."""
    s = xp.sort(perm)
    s = getattr(s, "values", s)  # torch.sort returns (values, indices)
    if int(s[0]) == 0 and int(s[-1]) == s.shape[0] - 1 and bool(((s[1:] - s[:-1]) == 1).all()):
        return None
    return f"a permutation of 0..{s.shape[0] - 1}; got values {int(s[0])}..{int(s[-1])}" + (
        "" if int(s[0]) < 0 or int(s[-1]) >= s.shape[0] else " with repeats")


def _check_perm(perm, K: int, on_device: bool, stream=None):
    """An act-order permutation for K inputs, living where x does (checked as _check_values says)."""
    pi = describe("perm", perm)
    if pi.dtype not in ("int32", "int64") or tuple(pi.shape) != (K,):
        raise ValueError(f"perm must be int32 of shape ({K},) (a permutation of 0..K-1); got {pi.dtype} {pi.shape}")
    if pi.on_device != on_device:
        raise TypeError("perm must live where x does (both numpy, or both on the GPU)")
    _check_values("perm", pi, permutation_fault, stream)


def _permuted(x, perm, K: int, stream=None):
    """x[..., perm] for act-order weights (stored group-contiguous), in x's own framework."""
    xi = describe("x", x)
    _check_perm(perm, K, xi.on_device, stream)
    if xi.framework == "numpy":
        return np.ascontiguousarray(x[..., np.asarray(perm)])
    if xi.framework == "torch":
        return x.index_select(-1, perm)  # int32 or int64 indices: no conversion launch
    if xi.framework == "cupy":
        return sys.modules["cupy"].ascontiguousarray(x[..., perm])
    raise TypeError(f"perm= needs x as numpy, torch or cupy; got a {xi.framework} array")


def _gemv_host(shape, infos, out_shape, config, stream, device):
    """numpy in, numpy out: copies to the device and back (convenient, not fast). `device`: the
    GPU ordinal, None for the calling thread's current one."""
    dev = backends.device(backends.current_ordinal() if device is None else device)
    s = stream_handle(stream, infos[0])
    arrays = [i.obj if i is not None else None for i in infos[:4]]
    ptrs = []
    try:
        for a in arrays:
            if a is None:
                ptrs.append(0)
                continue
            p = dev.alloc(a.nbytes)
            ptrs.append(p)
            dev.copy_htod(p, a, s)
        y_ptr = dev.alloc(2 * shape.M * shape.N)
        ptrs.append(y_ptr)
        kernel_for(dev, shape, config, s)(*ptrs[:5], s)
        out = infos[4].obj if infos[4] is not None else np.empty(out_shape, dtype=np.float16)
        dev.copy_dtoh(out, y_ptr, s)
        dev.synchronize(s)
        return out
    finally:
        dev.synchronize(s)
        for p in ptrs:
            if p:
                dev.free(p)


def gemv(x, w, scales, zeros=None, *, perm=None, out=None, stream=None, config=None, device=None):
    """y = x @ dequantize(w, scales, zeros)^T for 1..16 tokens, fp32 accumulation, out in x's dtype.

    x: float16 or bfloat16 [K] or [M, K], M <= 16 (numpy: float16). w: uint8 [N, K/2], low
    nibble = even k. scales: float16 or bfloat16 [N, K/g], g in {16, 32, 64, 128, 256}. zeros:
    uint8 [N, K/g] zero points 0..15, or None (symmetric, zero point 8). perm: int32 [K] for
    act-order weights (y = W @ x[perm]). out: [N] / [M, N] in x's dtype, to write into.
    Arrays are all numpy (copied to the GPU and back) or all device arrays on one GPU
    (torch, cupy, DLPack, __cuda_array_interface__; zero-copy, launched on `stream`,
    default the framework's current stream). Returns an array of the kind of x.
    config=(BS, TN) or 'BS,TN[,field=value...]' forces the launch geometry and variant.
    device: the GPU ordinal numpy arrays run on (default: the calling thread's current device,
    as torch.cuda.set_device / cudaSetDevice / hipSetDevice chose it, else 0). Device arrays
    run on their own GPU; a `device` that differs from it is a ValueError.
    """
    if config is not None:
        config_override(config)  # a malformed config fails before any device or copy is touched
    if perm is not None:
        x = _permuted(x, perm, describe("w", w).shape[-1] * 2, stream)
    torch_weights = device is None and type(x).__module__ == "torch" and type(w).__module__ == "torch"
    if torch_weights:
        config_key = config if config is None or isinstance(config, str) else tuple(config)
        prepared = getattr(_local, "weights", _NO_WEIGHTS).get((id(w), id(scales), id(zeros)))
        if prepared is not None and prepared.holds(w, scales, zeros):
            y = prepared(x, w, scales, zeros, out, stream, config, config_key)
            if y is not None:
                return y
    shape, infos, out_shape = validate(x, w, scales, zeros, out)
    xi = infos[0]
    if not xi.on_device:
        y = _gemv_host(shape, infos, out_shape, config, stream, device)
        if type(x).__module__.split(".", 1)[0] == "torch":  # CPU tensors in, a CPU tensor out
            return out if out is not None else sys.modules["torch"].from_numpy(y)
        return y
    if device is not None and device != xi.device[1]:
        raise ValueError(f"device={device!r} but the arrays are on GPU {xi.device[1]}; leave device= "
                         f"unset for device arrays, or move them")
    dev = backends.device(xi.device[1])
    s = stream_handle(stream, xi)
    if infos[3] is not None:
        _check_values("zeros", infos[3], zero_point_fault, stream)
    kernel = kernel_for(dev, shape, config, s)
    if out is None:
        out = _new_output(xi, out_shape)
        oi = describe("out", out)
    else:
        oi = infos[4]
    zi = infos[3]
    kernel(xi.ptr, infos[1].ptr, infos[2].ptr, 0 if zi is None else zi.ptr, oi.ptr, s)
    if torch_weights and all(i is None or i.framework == "torch" for i in infos[1:4]):
        sets = _prepared_weights()
        if len(sets) >= _MAX_PREPARED:
            sets.clear()
        sets[(id(w), id(scales), id(zeros))] = _PreparedWeights(shape, w, scales, zeros, xi.device[1], dev)
    return out


class GemvWeights:
    """One layer's weights, validated once, for calls whose activations are new every time (as a
    model makes them): a call re-checks only what a new x can change (shape, dtype, device,
    contiguity) and launches with the layer's kernel and packed arguments.

    w, scales, zeros: torch CUDA tensors in the canonical layout (see gemv). perm: act-order
    permutation or None. The layer's tensors are fixed while it is in use: no kernel may write
    them (with PDL on sm_90 a call loads its first weights before waiting for the previous
    kernel on the stream; INT4JIT_PDL=0 turns that off with PDL itself)."""

    def __init__(self, w, scales, zeros=None, perm=None):
        import torch  # GemvWeights is the torch fast path; `import int4jit` does not import torch
        self._torch = torch
        probe = torch.empty(2 * w.shape[1], dtype=torch.float16, device=w.device)
        self.shape, infos, _ = validate(probe, w, scales, zeros, None)
        if not infos[1].on_device:
            raise TypeError("GemvWeights holds device tensors; for numpy arrays call int4jit.gemv")
        if zeros is not None:
            _check_values("zeros", infos[3], zero_point_fault)
        if perm is not None:
            _check_perm(perm, self.shape.K, True)
        self.w, self.scales, self.zeros, self.perm = w, scales, zeros, perm
        self._one = weight_ones(torch, w)
        self.device_index = infos[1].device[1]
        self.w_ptr = infos[1].ptr  # the weights' address the packed arguments hold
        self.device = backends.device(self.device_index)
        self.N, self.K = self.shape.N, self.shape.K
        self._stream_of = torch_stream_getter()
        self._args = PackedArgs([0, infos[1].ptr, infos[2].ptr, 0 if zeros is None else infos[3].ptr, 0])
        self._values = self._args.values
        # (x.shape, x.dtype) -> ShapedCall, made by a checked call: a later x of that shape and
        # dtype needs only what its shape and dtype do not say checked (launch_shaped)
        self.calls: dict = {}
        self._dense_launch: dict = {}  # output torch dtype -> the dequantising launch
        self._gemm_launches: dict = {}  # (activation dtype, tile rows) -> (x' launch, GEMM launch): matmul
        self._gemm_why: dict = {}  # activation dtype -> why matmul cannot serve it, or None
        # The GEMM's arguments: the GEMV's five and the token count
        self._gemm_args = PackedArgs([0, infos[1].ptr, infos[2].ptr, 0 if zeros is None else infos[3].ptr, 0, 0])
        self._chunk_launches: dict = {}  # (tokens, dtype, tune) -> (environment state, launch): launch_chunks
        self._lock = threading.Lock()

    def dense(self, out):
        """Write the dequantised weight into `out` (a contiguous torch float16 or bfloat16 tensor
        of shape [N, K] on the weights' device) with one launch on torch's current stream."""
        torch = self._torch
        dtype = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(out.dtype)
        if dtype is None or tuple(out.shape) != (self.N, self.K) or not out.is_contiguous() \
                or not out.is_cuda or out.device.index != self.device_index:
            raise ValueError(f"out must be a contiguous float16 or bfloat16 tensor of shape ({self.N}, {self.K}) "
                             f"on GPU {self.device_index}; got {out.dtype} {tuple(out.shape)} on {out.device}")
        launch = self._dense_launch.get(out.dtype)
        if launch is None:
            launch = self._dense_launch[out.dtype] = load(self.device, make_dequant_spec(
                self.shape, self.device.arch, self._shape_for(out.dtype).dtype)).launch_packed
        with self._lock:
            v = self._values
            v[0] = 0
            v[4] = out.data_ptr()
            launch(self._args, self._stream_of(self.device_index))
        return out

    def _shape_for(self, dtype, tokens: int = 1) -> GemvShape:
        """The layer's shape for calls of `tokens` tokens of torch `dtype`."""
        return replace(self.shape, M=tokens, dtype="bfloat16" if dtype is self._torch.bfloat16 else "float16")

    def gemm_unsupported(self, dtype) -> str | None:
        """Why matmul cannot serve x of `dtype` on this layer's device, or None (worked out once
        per dtype: Int4Linear asks on every prefill call)."""
        if dtype not in self._gemm_why:
            self._gemm_why[dtype] = gemm_unsupported(self._shape_for(dtype), self.device.arch)
        return self._gemm_why[dtype]

    def matmul(self, x, out):
        """out [..., N] = x [..., K] @ W^T for a prompt of any number of tokens T on Hopper (sm_90):
        x laid out for the GEMM in a workspace (templates/xperm.hip), then the GEMM that reads the
        int4 weights itself (templates/gemm_sm90.hip in tiles of gemm_rows(N, T) rows: the last
        waves' tiles, or too few tiles to fill the SMs, cut between them so all end together;
        with PDL it starts while the first drains), on torch's current stream; no dense copy of
        the weight. x and out: contiguous float16 or bfloat16 tensors of T x K and T x N elements
        on the layer's device, checked by the caller as __call__ checks x.
        NotImplementedError where gemm_unsupported says why."""
        T = x.numel() // self.K
        rows = gemm_rows(self.N, T, self.device.sm_count)
        launches = self._gemm_launches.get((x.dtype, rows))
        if launches is None:
            why = self.gemm_unsupported(x.dtype)
            if why:
                raise NotImplementedError(why)
            shape, arch, sms = self._shape_for(x.dtype), self.device.arch, self.device.sm_count
            pdl = read_env().pdl and self.device.supports_overlap  # INT4JIT_PDL, read at the first prompt
            launches = self._gemm_launches[x.dtype, rows] = (
                load(self.device, make_xperm_spec(shape, arch, sms)).launch_packed,
                load(self.device, make_gemm_spec(shape, arch, sms, rows, pdl)).launch_packed)
        if x.data_ptr() & 15:  # as launch_shaped: x is read in 16-byte loads
            validate_x(x.reshape(T, self.K)[:MAX_TOKENS], self.K, self.device_index)
        xp = self._torch.empty(gemm_workspace_bytes(T, self.K, self.device.sm_count) // 2, dtype=x.dtype,
                               device=x.device)  # x', the partial sums and their flags
        stream = self._stream_of(self.device_index)
        with self._lock:  # the argument buffer is shared by the layer's callers
            v = self._gemm_args.values
            v[0], v[4], v[5] = x.data_ptr(), xp.data_ptr(), T
            launches[0](self._gemm_args, stream)
            v[0], v[4] = xp.data_ptr(), out.data_ptr()
            launches[1](self._gemm_args, stream)
        return out

    def _launch_for(self, tokens: int, dtype, stream: int, tune: bool = True):
        """The launch for `tokens` tokens of `dtype` (kernel_for plans it once per environment state,
        so a later INT4JIT_CONFIG takes effect)."""
        return kernel_for(self.device, self._shape_for(dtype, tokens), None, stream, fixed_weights=True,
                          tune=tune).launch_packed

    def __call__(self, x, out=None):
        """y [..., N] for x [..., K] (1..16 tokens, float16 or bfloat16) on the weights' device, on
        torch's current stream. A new x and out every call are fine."""
        torch = self._torch
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        dt = x.dtype
        tokens = x.numel() // self.K
        if (dt is not torch.float16 and dt is not torch.bfloat16) or x.get_device() != self.device_index \
                or x.shape[-1] != self.K or not 1 <= tokens <= MAX_TOKENS or not x.is_contiguous():
            validate_x(x, self.K, self.device_index)
        if out is not None:
            if out.dtype != dt or out.numel() != tokens * self.N or not out.is_contiguous() or out.device != x.device:
                raise ValueError(f"out must be a contiguous {dt} tensor of {tokens} x {self.N} elements on {x.device}; "
                                 f"got {out.dtype} {tuple(out.shape)} on {out.device}")
            if ranges_overlap(x.data_ptr(), 2 * x.numel(), out.data_ptr(), 2 * out.numel()):
                raise ValueError("out must be memory of its own (it is written while x is read); got a tensor overlapping x")
        return self.launch_checked(x, tokens, out)

    def launch_checked(self, x, tokens: int, out=None):
        """y for an x the caller has checked as __call__ does (its dtype, device, [..., K] holding
        `tokens` tokens, contiguous; no perm to apply). Makes the ShapedCall of x's shape and dtype
        on their first call."""
        return self.launch_shaped(self._shaped_call(x, tokens), x, out)

    def launch_chunks(self, x, out, chunk: int = MAX_TOKENS):
        """out [T, N] = x [T, K] @ W^T for more tokens than one launch takes: one launch per `chunk`
        rows (the last may hold fewer), each reading the int4 weights. x and out: contiguous 2-D
        tensors of x's dtype on the layer's device, checked by the caller as __call__ checks x.
        The full chunks' kernel is planned as any call of `chunk` tokens is (tuned on first use;
        a heuristic pick measured ~30% slower, H200); the last chunk's comes from the tuning DB,
        the table or the heuristic, so prompts of new lengths never wait for a search
        (`int4jit warm --tokens 1-16` tunes them all ahead)."""
        T = x.shape[0]
        if x.data_ptr() & 15:  # as launch_shaped: the kernel reads x in 16-byte loads
            validate_x(x[:chunk], self.K, self.device_index)
        whole, rest = divmod(T, chunk)
        stream = self._stream_of(self.device_index)
        full = self._chunk_launch(chunk, x.dtype, stream, tune=True) if whole else None
        last = self._chunk_launch(rest, x.dtype, stream, tune=False) if rest else None
        x_ptr, y_ptr, x_step, y_step = x.data_ptr(), out.data_ptr(), 2 * chunk * self.K, 2 * chunk * self.N
        with self._lock:  # the argument buffer is shared by the layer's callers
            v = self._values
            for i in range(whole):
                v[0], v[4] = x_ptr + i * x_step, y_ptr + i * y_step
                full(self._args, stream)
            if last is not None:
                v[0], v[4] = x_ptr + whole * x_step, y_ptr + whole * y_step
                last(self._args, stream)
        return out

    def _chunk_launch(self, tokens: int, dtype, stream: int, tune: bool):
        """The launch for a chunk of `tokens` tokens, planned once per environment state (and kept
        only outside a capture where it may tune, as kernel_for keeps its picks)."""
        env = _env_state()
        kept = self._chunk_launches.get((tokens, dtype, tune))
        if kept is None or kept[0] != env:
            kept = (env, self._launch_for(tokens, dtype, stream, tune=tune))
            if not (tune and self.device.is_capturing(stream)):
                self._chunk_launches[(tokens, dtype, tune)] = kept
        return kept[1]

    def _shaped_call(self, x, tokens: int) -> ShapedCall:
        """The ShapedCall of x's shape and dtype, made (and kept, outside a capture) on first use."""
        key = (x.shape, x.dtype)
        call = self.calls.get(key)
        if call is None:
            stream = self._stream_of(self.device_index)
            like = y_like(self._one[x.dtype], x, self.N)
            call = ShapedCall(tokens, like, _env_state(), self._launch_for(tokens, x.dtype, stream))
            if not self.device.is_capturing(stream):  # a pick made inside a capture is not kept (kernel_for)
                if len(self.calls) >= 64:
                    self.calls.clear()
                self.calls[key] = call
        return call

    def launch_shaped(self, call: ShapedCall, x, out=None):
        """y for x through the ShapedCall of x's shape and dtype; the caller has checked x's device
        and contiguity (Int4Linear's eager call, where a new x comes every call)."""
        x_ptr = x.data_ptr()
        if x_ptr & 15:  # a view at an odd offset: the kernel reads x in 16-byte loads
            validate_x(x, self.K, self.device_index)
        if out is None:
            out = self._torch.empty_like(call.like, memory_format=self._torch.contiguous_format)
        stream = self._stream_of(self.device_index)
        env = _env_state()
        if env != call.env:  # a plan variable changed since: planned again
            call.launch, call.env = self._launch_for(call.tokens, x.dtype, stream), env
        with self._lock:  # the argument buffer is shared by the layer's callers
            v = self._values
            v[0] = x_ptr
            v[4] = out.data_ptr()
            call.launch(self._args, stream)
        return out

__all__ = ["gemv", "GemvWeights"]
