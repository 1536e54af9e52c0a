"""launch.load against a stand-in device: the spec's grid, block and PDL choice reach the
device's launcher, the grid limit is checked before anything is compiled, a code object the
driver rejects is rebuilt once."""
import pytest

from int4jit import compiler, launch, plan
from int4jit.errors import DriverError
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.spec import Variant, make_spec

from conftest import require_compiler


class StandInDevice:
    def __init__(self, arch, max_grid_x=2**31 - 1, supports_overlap=False, reject_first_load=False):
        self.arch, self.name, self.sm_count, self.max_grid_x = arch, "stand-in", 132, max_grid_x
        self.max_threads_per_sm, self.regs_per_sm, self.warp_size = 2048, 65536, 32
        self.supports_overlap, self.reject = supports_overlap, reject_first_load
        self.loaded = []
        self.launches = []

    def load(self, binary, kernel):
        assert binary[:4] == b"\x7fELF"
        self.loaded.append((kernel, binary))
        if self.reject:
            self.reject = False
            raise DriverError("cuda", "cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE")
        return "module", f"fn:{kernel}"

    def launcher(self, fn, grid, block, overlap=False, smem=0):
        def run(args, stream=0):
            self.launches.append((fn, grid, block, overlap, list(args.values), stream))
        return run


@pytest.fixture(autouse=True)
def _fresh_memos():
    launch._loaded.clear()
    compiler._memo.clear()
    yield
    launch._loaded.clear()


def _planned(dev, shape, config="128,4"):
    return plan.plan(shape, dev.arch, dev, config=config).spec


@pytest.mark.parametrize("supports,env,expected", [(True, None, True), (True, "0", False), (False, None, False),
                                                  (False, "1", False)])
def test_pdl_only_where_the_device_has_it(supports, env, expected, monkeypatch):
    """Programmatic dependent launch: on by default where the device supports it, INT4JIT_PDL=0
    turns it off; the spec says so and the launcher is prepared with it."""
    require_compiler("cuda")
    if env is not None:
        monkeypatch.setenv("INT4JIT_PDL", env)
    dev = StandInDevice("sm_90", supports_overlap=supports)
    spec = _planned(dev, GemvShape(4096, 4096, 128, False))
    assert spec.pdl is expected and spec.param("PREFETCH") == 0  # prefetch is a searched variant, off by default
    with_prefetch = _planned(dev, GemvShape(4096, 4096, 128, False), config="512,2,prefetch=1")
    assert with_prefetch.param("PREFETCH") == (1 if expected else 0)  # only where PDL launches it
    k = launch.load(dev, spec)
    k(1, 2, 3, 4, 5)
    assert dev.launches[-1][3] is expected


def test_malformed_pdl_variable_is_rejected(monkeypatch):
    monkeypatch.setenv("INT4JIT_PDL", "maybe")
    with pytest.raises(ValueError, match="INT4JIT_PDL"):
        _planned(StandInDevice("sm_90", supports_overlap=True), GemvShape(64, 256, 128, False))


@pytest.mark.parametrize("kernel,variant,grid", [("simt", None, None),
                                                 ("tc", Variant(), -(-5000 // 32)),
                                                 ("tc", Variant(kcluster=2), 2 * -(-5000 // 32))])
def test_one_block_per_row_block(kernel, variant, grid):
    require_compiler("cuda")
    shape, cfg = GemvShape(5000, 4096, 128, False), LaunchConfig(128, 4)
    spec = make_spec(shape, "sm_90", kernel, cfg, variant)
    dev = StandInDevice("sm_90")
    k = launch.load(dev, spec)
    assert k.spec is spec and spec.grid == -(-5000 // spec.rows_per_block) * spec.variant.kcluster
    assert grid is None or spec.grid == grid
    assert launch.load(dev, spec) is k and len(dev.loaded) == 1  # loaded once
    other = launch.load(dev, make_spec(shape, "sm_90", kernel, LaunchConfig(256, 4)))
    assert other is not k and len(dev.loaded) == 2


def test_grid_limit_is_checked_before_compiling(monkeypatch):
    def no_compile(*a):
        raise AssertionError("compiled a kernel that cannot launch")
    monkeypatch.setattr(compiler, "build", no_compile)
    spec = make_spec(GemvShape(262144, 1024, 128, False), "sm_75", "simt", LaunchConfig(32, 2))
    with pytest.raises(ValueError, match="grid limit 1000"):
        launch.load(StandInDevice("sm_75", max_grid_x=1000), spec)


def test_kernel_launches_through_the_launcher_the_device_prepared():
    """A loaded kernel calls the device's prepared launcher with its own function, grid, block and
    PDL choice, and the five pointers in the kernel's argument order."""
    require_compiler("cuda")
    dev = StandInDevice("sm_90", supports_overlap=True)
    spec = _planned(dev, GemvShape(4096, 4096, 128, False))
    k = launch.load(dev, spec)
    k(11, 22, 33, 0, 55, stream=7)
    assert dev.launches == [(k.function, spec.grid, spec.block, True, [11, 22, 33, 0, 55], 7)]
    assert k.function == f"fn:{spec.name}"


def test_code_object_the_driver_rejects_is_rebuilt_once(monkeypatch):
    require_compiler("cuda")
    spec = make_spec(GemvShape(512, 1024, 32, True), "sm_90", "simt", LaunchConfig(64, 4))
    first = compiler.build(spec)
    path = compiler.code_object_path(first.key)
    assert path.is_file()
    forgotten = []
    real_forget = compiler.forget
    monkeypatch.setattr(compiler, "forget", lambda c: forgotten.append(c) or real_forget(c))
    dev = StandInDevice("sm_90", reject_first_load=True)
    k = launch.load(dev, spec)
    assert forgotten == [first] and len(dev.loaded) == 2 and k.function == f"fn:{spec.name}"
    assert dev.loaded[1][1] == first.binary and path.is_file()  # rebuilt and cached again
    # a second rejection is not retried forever: it is the caller's error
    launch._loaded.clear()
    dev = StandInDevice("sm_90")
    dev.load = lambda b, n: (_ for _ in ()).throw(DriverError("cuda", "cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE"))
    with pytest.raises(DriverError, match="cuModuleLoadData"):
        launch.load(dev, spec)
