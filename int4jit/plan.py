"""One planning step: (shape, target, device, environment) -> one frozen KernelSpec.

The environment is read once per plan (PlanEnv); the kernel is chosen, the tuner's tiers pick
(BS, TN) and the variant, and the spec is built. Rendering, compiling, loading, launching and
the CLI all take the spec from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import backends, tuner
from .env import CHOICES, env_choice, env_flag, env_lookup
from .shapes import GemvShape, LaunchConfig
from .spec import KernelSpec, arch_number, choose_kernel, make_spec

KERNEL_CHOICES = CHOICES["INT4JIT_KERNEL"]
# The variables a plan depends on (read by read_env); callers that memoise plans key on them.
PLAN_VARIABLES = ("INT4JIT_CONFIG", "INT4JIT_EXHAUSTIVE_TUNE", "INT4JIT_TUNE", "INT4JIT_KERNEL", "INT4JIT_PDL")


@dataclass(frozen=True)
class PlanEnv:
    """The variables that change a plan, read (and validated) once."""
    override: tuple[str, str] | None   # (variable, value) of INT4JIT_CONFIG or its alias
    exhaustive: bool
    tune: bool
    kernel: str                        # auto | simt | tc
    pdl: bool


def read_env() -> PlanEnv:
    found = env_lookup("INT4JIT_CONFIG")
    if found is not None and found[1].strip():
        tuner.parse_override(found[1], found[0])  # malformed values fail here, naming the variable
    return PlanEnv(found, env_flag("INT4JIT_EXHAUSTIVE_TUNE"), env_flag("INT4JIT_TUNE", True),
                   env_choice("INT4JIT_KERNEL", KERNEL_CHOICES) or "auto", env_flag("INT4JIT_PDL", True))


@dataclass(frozen=True)
class Plan:
    spec: KernelSpec
    tier: str        # override | db | table | tuned | heuristic
    reason: str


def config_override(config) -> tuner.Override | None:
    """gemv's config= argument: (BS, TN), a LaunchConfig, or 'BS,TN[,field=value...]'."""
    if config is None:
        return None
    if isinstance(config, str):
        return tuner.parse_config_text(config, "config")
    if isinstance(config, LaunchConfig):
        return tuner.Override(config)
    try:
        bs, tn = config
        return tuner.Override(LaunchConfig(int(bs), int(tn)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config must be (BS, TN) inside the grid or 'BS,TN[,field=value...]'; "
                         f"got {config!r}: {e}") from None


def target(shape: GemvShape, arch: str, device=None, env: PlanEnv | None = None) -> tuple[str, str, bool]:
    """(parsed arch, kernel, pdl) for a problem on `arch`: what every plan of it shares."""
    env = env or read_env()
    mod = backends.module_for_arch(arch)
    arch = mod.parse_arch(arch)
    kernel = choose_kernel(shape, bool(mod.kernel_traits(arch)["TENSOR_CORES"]), env.kernel)
    pdl = env.pdl and (device.supports_overlap if device is not None else arch_number(arch) >= 90)
    return arch, kernel, pdl


def plan(shape: GemvShape, arch: str, device=None, *, env: PlanEnv | None = None, config=None,
         tune: bool = True, exhaustive: bool | None = None, fixed_weights: bool = False) -> Plan:
    """The spec for one problem on `arch`. `device` (optional) lets tier 4 benchmark and gives the
    SM count; tune=False keeps benchmarking off (e.g. while a stream is being captured).
    fixed_weights: the caller guarantees no kernel writes the weights while they are in use
    (GemvWeights, Int4Linear), so with PDL the tc kernel may load its first weights before
    waiting for the previous kernel (the `early` twin, where the tuner measures or rules it
    faster; an override decides for itself)."""
    env = env or read_env()
    arch, kernel, pdl = target(shape, arch, device, env)
    override = config_override(config) or env.override
    sel = tuner.select(shape, arch, kernel, device=device, override=override,
                       exhaustive=env.exhaustive if exhaustive is None else exhaustive,
                       tune=tune and env.tune, table=env.kernel == "auto", pdl=pdl, fixed_weights=fixed_weights)
    spec = make_spec(shape, arch, kernel, sel.config, sel.variant, pdl, device.sm_count if device is not None else None)
    return Plan(spec, sel.tier, sel.reason)


def search_space(shape: GemvShape, arch: str, env: PlanEnv | None = None, exhaustive: bool | None = None):
    """Every spec tier 4 may measure for this shape on `arch`, and the early twin of each (which a
    fixed-weights call measures against its pick): what pre-warming compiles."""
    env = env or read_env()
    arch, kernel, pdl = target(shape, arch, None, env)
    specs = tuner.search_space(shape, arch, kernel, None, env.exhaustive if exhaustive is None else exhaustive, pdl)
    twins = (tuner.early_twin(shape, arch, kernel, s.config, s.variant, pdl) for s in specs)
    early = [make_spec(shape, arch, kernel, s.config, v, pdl) for s, v in zip(specs, twins) if v is not None]
    return list(dict.fromkeys(specs + early))
