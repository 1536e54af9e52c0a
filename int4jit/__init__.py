"""int4jit: JIT-compiled, autotuned INT4 weight-only GEMV (1..16 tokens, fp16 or bf16; an int4 GEMM
for prompts on Hopper) for AMD (hiprtc) and NVIDIA (NVRTC)."""
from ._version import __version__
from .api import GemvWeights, gemv
from .errors import BackendUnavailable, CompileError, DriverError, Int4JitError
from .formats import Int4Weights, from_awq, from_gptq, from_matmulnbits, from_quantized_layer, to_matmulnbits
from .reference import dequantize, quantize, reference_gemv
from .shapes import GemvShape, LaunchConfig

__all__ = ["gemv", "GemvWeights", "quantize", "dequantize", "reference_gemv", "from_matmulnbits", "to_matmulnbits",
           "from_awq", "from_gptq", "from_quantized_layer", "Int4Weights", "GemvShape", "LaunchConfig",
           "CompileError", "DriverError", "BackendUnavailable", "Int4JitError", "__version__"]


def __getattr__(name):
    # int4jit.onnx and int4jit.torch load their optional dependencies only when used.
    if name in ("onnx", "torch"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'int4jit' has no attribute {name!r}")
