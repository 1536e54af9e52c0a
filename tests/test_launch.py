"""launch.load_kernel against a stand-in device: the launch grid a kernel gets (persistent
tensor-core kernels: what the device holds at once; the CUDA-core kernel: one block per row
block) and the grid-limit check, made before anything is compiled."""
import pytest

from int4jit import compiler, launch
from int4jit.shapes import GemvShape, LaunchConfig

from conftest import require_compiler


class StandInDevice:
    def __init__(self, arch, max_grid_x=2**31 - 1, per_sm=3, supports_overlap=False):
        self.arch, self.sm_count, self.max_grid_x, self.per_sm = arch, 132, max_grid_x, per_sm
        self.supports_overlap = supports_overlap
        self.loaded = []
        self.launches = []

    def load(self, binary, kernel):
        assert binary[:4] == b"\x7fELF"
        self.loaded.append(kernel)
        return "module", f"fn:{kernel}"

    def blocks_per_sm(self, fn, block):
        assert fn.startswith("fn:")
        return self.per_sm

    def launcher(self, fn, grid, block, overlap=False):
        def run(args, stream=0):
            self.launches.append((fn, grid, block, overlap, list(args.values), stream))
        return run


@pytest.fixture(autouse=True)
def _fresh_launch_memo():
    launch._loaded.clear()
    yield
    launch._loaded.clear()


@pytest.mark.parametrize("N,per_sm", [(28672, 3), (128256, 2), (100, 4)])
def test_persistent_kernel_gets_the_resident_grid(N, per_sm, monkeypatch):
    require_compiler("cuda")
    monkeypatch.setenv("INT4JIT_KERNEL", "mma")
    shape, cfg = GemvShape(N, 4096, 128, False), LaunchConfig(256, 2)
    dev = StandInDevice("sm_90", per_sm=per_sm)
    k = launch.load_kernel(dev, shape, cfg)
    geo = compiler.kernel_geometry(shape, cfg, "sm_90")
    assert geo.persistent and k.grid == min(geo.grid, per_sm * 132) and k.block == 256
    assert launch.load_kernel(dev, shape, cfg) is k and len(dev.loaded) == 1  # loaded once


@pytest.mark.parametrize("supports,env,expected", [(True, None, True), (True, "0", False), (False, None, False),
                                                  (False, "1", False)])
def test_overlapped_launch_only_where_the_device_has_it(supports, env, expected, monkeypatch):
    """Programmatic dependent launch: on by default where the device supports it, INT4JIT_PDL=0 turns it off."""
    require_compiler("cuda")
    if env is None:
        monkeypatch.delenv("INT4JIT_PDL", raising=False)
    else:
        monkeypatch.setenv("INT4JIT_PDL", env)
    k = launch.load_kernel(StandInDevice("sm_90", supports_overlap=supports), GemvShape(4096, 4096, 128, False),
                           LaunchConfig(128, 4))
    assert k.overlap is expected


def test_malformed_pdl_variable_is_rejected(monkeypatch):
    monkeypatch.setenv("INT4JIT_PDL", "maybe")
    with pytest.raises(ValueError, match="INT4JIT_PDL"):
        launch.load_kernel(StandInDevice("sm_90", supports_overlap=True), GemvShape(64, 256, 128, False),
                           LaunchConfig(128, 4))


def test_default_kernels_get_one_block_per_row_block():
    require_compiler("cuda")
    shape, cfg = GemvShape(5000, 4096, 128, False), LaunchConfig(128, 4)
    k = launch.load_kernel(StandInDevice("sm_90"), shape, cfg)  # the default kernel
    geo = compiler.kernel_geometry(shape, cfg, "sm_90")
    assert not geo.persistent and k.grid == geo.grid == -(-5000 // geo.rows_per_block)


def test_grid_limit_is_checked_before_compiling(monkeypatch):
    def no_compile(*a):
        raise AssertionError("compiled a kernel that cannot launch")
    monkeypatch.setattr(compiler, "compile_gemv", no_compile)
    with pytest.raises(ValueError, match="grid limit 1000"):
        launch.load_kernel(StandInDevice("sm_75", max_grid_x=1000), GemvShape(262144, 1024, 128, False),
                           LaunchConfig(32, 2))


def test_kernel_launches_through_the_launcher_the_device_prepared():
    """A loaded kernel calls the device's prepared launcher with its own function, grid, block and
    PDL choice, and the five pointers in the kernel's argument order."""
    require_compiler("cuda")
    dev = StandInDevice("sm_90", supports_overlap=True)
    shape, cfg = GemvShape(4096, 4096, 128, False), LaunchConfig(128, 4)
    k = launch.load_kernel(dev, shape, cfg)
    k(11, 22, 33, 0, 55, stream=7)
    assert dev.launches == [(k.function, k.grid, k.block, True, [11, 22, 33, 0, 55], 7)]
    assert k.grid == compiler.kernel_geometry(shape, cfg, "sm_90").grid
