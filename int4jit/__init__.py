"""int4jit: JIT-compiled, autotuned M=1 INT4 weight-only GEMV for AMD (hiprtc) and NVIDIA (NVRTC)."""
from ._version import __version__
from .api import gemv
from .errors import BackendUnavailable, CompileError, DriverError, Int4JitError
from .reference import dequantize, quantize, reference_gemv
from .shapes import GemvShape, LaunchConfig

__all__ = ["gemv", "quantize", "dequantize", "reference_gemv", "GemvShape", "LaunchConfig",
           "CompileError", "DriverError", "BackendUnavailable", "Int4JitError", "__version__"]
