"""Facts read from a compiled kernel's bytes, with no GPU: an AMD code object (ELF with
NT_AMDGPU_METADATA notes, disassembled by llvm-objdump) or an NVIDIA cubin (.nv.info
attributes, disassembled by nvdisasm). Nothing here knows how the bytes were built.

    amd_facts(binary, kernel, arch)   -> CodeFacts      registers, spills, LDS, occupancy, loads, dot2
    cuda_facts(binary, kernel, arch)  -> CodeFacts      the same from a cubin
    amd_occupancy(...), cuda_occupancy(...)             the per-target residency rules (docs/amd.md)
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# -- ELF (64-bit little-endian: both vendors' code objects) --------------------------------
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS = 2, 7, 8
NT_AMDGPU_METADATA = 32


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int


def elf_sections(binary: bytes) -> list[Section]:
    """The section headers of a 64-bit little-endian ELF, named."""
    if binary[:4] != b"\x7fELF" or binary[4] != 2 or binary[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF (a code object from hiprtc or a cubin from NVRTC "
                         f"starts with b'\\x7fELF'); got {binary[:8]!r}")
    shoff, = struct.unpack_from("<Q", binary, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", binary, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = raw[shstrndx][4]

    def name(off):
        start = strtab_off + off
        return binary[start:binary.index(b"\0", start)].decode()
    return [Section(name(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in raw]


def _section_bytes(binary: bytes, sec: Section) -> bytes:
    return b"" if sec.type == SHT_NOBITS else binary[sec.offset:sec.offset + sec.size]


def elf_notes(binary: bytes):
    """(owner, type, descriptor bytes) for every note in the ELF's SHT_NOTE sections."""
    for sec in elf_sections(binary):
        if sec.type != SHT_NOTE:
            continue
        data, pos = _section_bytes(binary, sec), 0
        while pos + 12 <= len(data):
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            pos += 12
            owner = data[pos:pos + namesz].rstrip(b"\0").decode(errors="replace")
            pos += (namesz + 3) & ~3
            yield owner, ntype, data[pos:pos + descsz]
            pos += (descsz + 3) & ~3


def elf_symbol(binary: bytes, name: str) -> tuple[Section, int, int] | None:
    """(section holding it, its offset in the file, size) of a defined symbol, or None."""
    sections = elf_sections(binary)
    for sec in sections:
        if sec.type != SHT_SYMTAB:
            continue
        strtab = sections[sec.link]
        data = _section_bytes(binary, sec)
        for pos in range(0, len(data) - 23, 24):
            st_name, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, pos)
            start = strtab.offset + st_name
            if binary[start:binary.index(b"\0", start)].decode(errors="replace") == name and 0 < shndx < len(sections):
                home = sections[shndx]
                # st_value is an address (code objects) or an offset into the section (cubins, sh_addr 0).
                return home, home.offset + value - home.addr, size
    return None


# -- msgpack (the AMDGPU metadata note): the subset LLVM writes, decoding only ---------------
def msgpack_decode(data: bytes):
    """Decode one msgpack value (maps, arrays, strings, ints, floats, bools, nil, bin)."""
    return _mp(data, 0)[0]


def _mp(d: bytes, i: int):
    b = d[i]
    i += 1
    if b <= 0x7F:
        return b, i
    if b >= 0xE0:
        return b - 0x100, i
    if 0x80 <= b <= 0x8F:
        return _mp_map(d, i, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _mp_array(d, i, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return d[i:i + n].decode(), i + n
    if b == 0xC0:
        return None, i
    if b in (0xC2, 0xC3):
        return b == 0xC3, i
    fixed = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
             0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if b in fixed:
        fmt = fixed[b]
        return struct.unpack_from(fmt, d, i)[0], i + struct.calcsize(fmt)
    sized = {0xC4: (">B", bytes), 0xC5: (">H", bytes), 0xC6: (">I", bytes),
             0xD9: (">B", str), 0xDA: (">H", str), 0xDB: (">I", str),
             0xDC: (">H", list), 0xDD: (">I", list), 0xDE: (">H", dict), 0xDF: (">I", dict)}
    if b not in sized:
        raise ValueError(f"msgpack type byte 0x{b:02x} at offset {i - 1} is not one the AMDGPU metadata uses")
    fmt, kind = sized[b]
    n = struct.unpack_from(fmt, d, i)[0]
    i += struct.calcsize(fmt)
    if kind is list:
        return _mp_array(d, i, n)
    if kind is dict:
        return _mp_map(d, i, n)
    raw = d[i:i + n]
    return (raw.decode() if kind is str else bytes(raw)), i + n


def _mp_array(d, i, n):
    out = []
    for _ in range(n):
        v, i = _mp(d, i)
        out.append(v)
    return out, i


def _mp_map(d, i, n):
    out = {}
    for _ in range(n):
        k, i = _mp(d, i)
        v, i = _mp(d, i)
        out[k] = v
    return out, i


def amd_metadata(binary: bytes) -> dict:
    """The code object's NT_AMDGPU_METADATA note (code object v3+), decoded."""
    for owner, ntype, desc in elf_notes(binary):
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            return msgpack_decode(desc)
    raise ValueError("no NT_AMDGPU_METADATA note in this ELF: not an AMD code object of v3 or later")


def amd_kernel_metadata(binary: bytes, kernel: str) -> dict:
    kernels = amd_metadata(binary).get("amdhsa.kernels", [])
    for k in kernels:
        if k.get(".name") == kernel:
            return k
    raise ValueError(f"kernel {kernel!r} is not in the code object; it holds {[k.get('.name') for k in kernels]}")


# -- occupancy rules ----------------------------------------------------------------------
@dataclass(frozen=True)
class AmdTarget:
    """What limits residency on one AMD target (LLVM's AMDGPUBaseInfo IsaInfo rules).
    A 'CU' is what a workgroup's waves share: the CU on GCN/CDNA, the WGP (two CUs, four
    SIMD32s) on RDNA in WGP mode, hiprtc's default."""
    wave: int
    max_waves_per_simd: int
    vgprs_per_simd: int        # per lane; gfx90a/gfx94x: arch VGPRs + AGPRs, one file
    vgpr_granule: int
    simds_per_cu: int
    lds_per_cu: int
    sgpr_limited: bool         # GCN/CDNA: 800 SGPRs a SIMD; RDNA gives every wave its own 106


def amd_target(arch: str, wgp_mode: bool = True) -> AmdTarget:
    m = re.match(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$", arch)
    if not m:
        raise ValueError(f"not an AMD target: {arch!r}")
    major, minor = int(m.group(1)), int(m.group(2), 16)
    if major == 9 and minor >= 4 or arch == "gfx90a":         # CDNA2/3: one 512-register file
        lds = 160 << 10 if arch == "gfx950" else 64 << 10
        return AmdTarget(64, 8, 512, 8, 4, lds, True)
    if major <= 9:                                            # GCN, CDNA1 (gfx908: AGPRs apart)
        return AmdTarget(64, 10, 256, 4, 4, 64 << 10, True)
    simds, lds = (4, 128 << 10) if wgp_mode else (2, 64 << 10)
    if major == 10 and minor == 1:                            # RDNA1
        return AmdTarget(32, 20, 1024, 8, simds, lds, False)
    if arch in ("gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"):  # 1.5x register file
        return AmdTarget(32, 16, 1536, 24, simds, lds, False)
    return AmdTarget(32, 16, 1024, 16, simds, lds, False)     # gfx103x, other gfx11/gfx12


@dataclass(frozen=True)
class Occupancy:
    """Residency of one kernel: waves a SIMD (AMD) or warps an SM (NVIDIA) and the limiter."""
    blocks_per_cu: int
    waves_per_simd: float      # AMD: waves per SIMD; NVIDIA: warps per SM / 4 schedulers
    limiter: str               # vgprs | sgprs | lds | waves | blocks | barriers | regs | smem | threads
    limits: dict = field(default_factory=dict)

    def __str__(self):
        return f"{self.blocks_per_cu} blocks/CU, {self.waves_per_simd:g} waves/SIMD ({self.limiter})"


def _round_up(n: int, g: int) -> int:
    return -(-max(n, 1) // g) * g


def amd_occupancy(arch: str, block: int, vgprs: int, sgprs: int, lds: int, agprs: int = 0,
                  wgp_mode: bool = True) -> Occupancy:
    """Blocks of `block` threads one CU (WGP on RDNA) holds, and waves per SIMD, for a kernel of
    `vgprs` VGPRs (gfx90a/gfx94x: the unified count the metadata gives), `agprs` AGPRs (gfx908's
    separate file: the larger of the two counts), `sgprs` SGPRs and `lds` bytes of LDS.
    waves/SIMD by registers = min(max waves, floor(file / round_up(regs, granule)))."""
    t = amd_target(arch, wgp_mode)
    regs = max(vgprs, agprs) if t.vgprs_per_simd == 256 else vgprs
    limits = {"waves": t.max_waves_per_simd,
              "vgprs": min(t.max_waves_per_simd, t.vgprs_per_simd // _round_up(regs, t.vgpr_granule))}
    if t.sgpr_limited:  # VI+ table (LLVM getOccupancyWithNumSGPRs)
        limits["sgprs"] = 10 if sgprs <= 80 else 9 if sgprs <= 88 else 8 if sgprs <= 100 else 7
    per_simd = min(limits.values())
    waves_per_block = -(-block // t.wave)
    # A workgroup's waves are dealt over the CU's SIMDs: whole blocks fit in simds * per_simd waves.
    blocks = {"waves": limits["waves"] * t.simds_per_cu // waves_per_block,
              "regs": per_simd * t.simds_per_cu // waves_per_block}
    if waves_per_block > 1:
        blocks["barriers"] = 16 if t.simds_per_cu == 2 or t.wave == 64 else 32
    if lds:
        blocks["lds"] = t.lds_per_cu // lds
    n = min(blocks.values())
    limiter = min(blocks, key=blocks.get)
    if limiter == "regs":
        limiter = min(limits, key=limits.get)
    limits.update({f"blocks by {k}": v for k, v in blocks.items()})
    return Occupancy(n, n * waves_per_block / t.simds_per_cu, limiter, limits)


# NVIDIA: (threads, blocks, 32-bit registers, shared bytes usable by blocks) per SM.
_SM_LIMITS = {70: (2048, 32, 65536, 96 << 10), 75: (1024, 16, 65536, 64 << 10),
              80: (2048, 32, 65536, 164 << 10), 86: (1536, 16, 65536, 100 << 10),
              87: (1536, 16, 65536, 164 << 10), 89: (1536, 24, 65536, 100 << 10),
              90: (2048, 32, 65536, 228 << 10), 100: (2048, 32, 65536, 228 << 10),
              120: (1536, 32, 65536, 100 << 10)}


def cuda_occupancy(arch: str, block: int, regs: int, smem: int) -> Occupancy:
    """Blocks of `block` threads one SM holds (the CUDA occupancy calculator's rules: registers
    allocated 256 a warp, 1 KB of shared memory reserved per block)."""
    sm = int(re.match(r"^sm_(\d+)", arch).group(1))
    threads, max_blocks, regfile, smem_sm = _SM_LIMITS.get(sm, _SM_LIMITS[max(k for k in _SM_LIMITS if k <= sm)]
                                                           if sm >= 70 else _SM_LIMITS[70])
    warps = -(-block // 32)
    regs_per_warp = _round_up(regs * 32, 256)
    blocks = {"threads": threads // (32 * warps), "blocks": max_blocks,
              "regs": (regfile // regs_per_warp) // warps if regs else max_blocks}
    if smem:
        blocks["smem"] = smem_sm // (smem + 1024)
    n = min(blocks.values())
    return Occupancy(n, n * warps / 4, min(blocks, key=blocks.get), blocks)


# -- disassembly ----------------------------------------------------------------------------
class ToolMissing(RuntimeError):
    """No disassembler for this target on the machine: counts are unavailable, the rest is not."""


def _llvm_objdump_candidates():
    for root in (os.environ.get("ROCM_PATH"), os.environ.get("ROCM_HOME"), "/opt/rocm"):
        if root:
            yield Path(root) / "llvm" / "bin" / "llvm-objdump"
    found = shutil.which("llvm-objdump")
    if found:
        yield Path(found)
    for v in range(30, 13, -1):
        found = shutil.which(f"llvm-objdump-{v}")
        if found:
            yield Path(found)


def _run_tool(argv, binary: bytes, suffix: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(binary)
        f.flush()
        res = subprocess.run([*argv, f.name], capture_output=True, text=True)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({res.returncode}): {res.stderr.strip()[:500]}")
    return res.stdout


def amd_disassemble(binary: bytes, arch: str) -> str:
    """llvm-objdump -d of an AMD code object (ROCm's LLVM first, then the PATH's): raises
    ToolMissing when none is installed or none knows `arch`."""
    errors = []
    for tool in _llvm_objdump_candidates():
        if not tool.exists():
            continue
        try:
            text = _run_tool([tool, "--triple=amdgcn-amd-amdhsa", f"--mcpu={arch}", "-d"], binary, ".co")
        except RuntimeError as e:
            errors.append(str(e))
            continue
        if "<unknown>" in text or "invalid instruction" in text.lower():
            errors.append(f"{tool} does not decode {arch} fully")
            continue
        return text
    raise ToolMissing(f"no llvm-objdump that knows {arch} was found (looked in $ROCM_PATH/llvm/bin, "
                      f"/opt/rocm/llvm/bin and PATH; Debian: apt-get install llvm)"
                      + (": " + "; ".join(errors) if errors else ""))


def _nvidia_tool(name: str) -> Path | None:
    found = shutil.which(name)
    if found:
        return Path(found)
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / name).exists():
            return Path(root) / "bin" / name
    # The nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump wheels, and Triton's bundled copy.
    for entry in sys.path:
        for rel in (f"nvidia/cu13/bin/{name}", f"nvidia/cuda_nvdisasm/bin/{name}",
                    f"nvidia/cuda_cuobjdump/bin/{name}", f"triton/backends/nvidia/bin/{name}"):
            p = Path(entry) / rel
            if p.exists():
                return p
    return None


def cuda_disassemble(binary: bytes) -> str:
    tool = _nvidia_tool("nvdisasm")
    if tool is not None:
        return _run_tool([tool], binary, ".cubin")
    tool = _nvidia_tool("cuobjdump")
    if tool is not None:
        return _run_tool([tool, "-sass"], binary, ".cubin")
    raise ToolMissing("no nvdisasm or cuobjdump found (PATH, $CUDA_HOME/bin, or the nvidia-cuda-nvdisasm "
                      "wheel: pip install nvidia-cuda-nvdisasm)")


_AMD_LINE = re.compile(r"^\s+([a-z][a-z0-9_]+)\s*(.*?)\s*(?://.*)?$")
_AMD_LOAD = re.compile(r"^(global|buffer|flat)_load_(?:lds_)?([a-z0-9_]+)$")
_LOAD_BYTES = {"dwordx4": 16, "b128": 16, "dwordx3": 12, "b96": 12, "dwordx2": 8, "b64": 8,
               "dword": 4, "b32": 4, "ushort": 2, "sshort": 2, "u16": 2, "i16": 2, "short_d16": 2,
               "short_d16_hi": 2, "d16_b16": 2, "d16_hi_b16": 2, "ubyte": 1, "sbyte": 1, "u8": 1, "i8": 1,
               "ubyte_d16": 1, "ubyte_d16_hi": 1, "sbyte_d16": 1, "sbyte_d16_hi": 1, "d16_u8": 1,
               "d16_i8": 1, "d16_hi_u8": 1, "d16_hi_i8": 1}
# Non-temporal (streaming) cache bits as each generation prints them: slc on gfx9/gfx10/gfx11,
# nt on gfx94x, th:TH_LOAD_NT* on gfx12. int4jit streams weights, and only weights, this way.
# int4jit's kernels address memory with global_* only, so their MUBUF buffer_* ops are the private
# segment (spills, private arrays: the scratch descriptor in some s[n:n+3]), as are scratch_* ops.
_MUBUF_SCRATCH = re.compile(r"^buffer_(load|store|atomic)_")
_NONTEMPORAL = re.compile(r"(?:^|\s)(?:slc|nt|th:TH_LOAD_NT\w*)(?:\s|$)")


@dataclass(frozen=True)
class InstructionCounts:
    """Counts over the kernel's static code (every instruction once, loops not multiplied)."""
    mnemonics: Counter
    loads_by_bytes: dict           # global/buffer loads: bytes -> count
    stream_loads_by_bytes: dict    # non-temporal (weight-stream) loads: bytes -> count
    dot2: int                      # v_dot2(c)_f32_f16 (AMD); 0 on NVIDIA
    mma: int                       # v_mfma/v_wmma (AMD), HMMA (NVIDIA)
    fma_f32: int                   # fp32 FMA/MAC/MAD: the no-dot2 path's products
    scratch: int                   # scratch_* (AMD) / LDL+STL (NVIDIA): local memory traffic

    @property
    def wide_loads(self) -> int:
        return self.loads_by_bytes.get(16, 0)

    @property
    def narrow_loads(self) -> int:
        return sum(n for b, n in self.loads_by_bytes.items() if b < 16)

    @property
    def stream_wide(self) -> int:
        return self.stream_loads_by_bytes.get(16, 0)

    @property
    def stream_narrow(self) -> int:
        return sum(n for b, n in self.stream_loads_by_bytes.items() if b < 16)

    def summary(self) -> str:
        loads = ", ".join(f"{n}x{b}B" for b, n in sorted(self.loads_by_bytes.items(), reverse=True)) or "none"
        stream = ", ".join(f"{n}x{b}B" for b, n in sorted(self.stream_loads_by_bytes.items(), reverse=True)) or "none"
        return (f"global loads {loads} (non-temporal: {stream}); dot2 {self.dot2}, mma {self.mma}, "
                f"fp32 fma {self.fma_f32}, scratch/local ops {self.scratch}")


_AMD_FUNCTION = re.compile(r"^[0-9a-f]+ <([^>]+)>:")


def count_amd(disassembly: str, function: str | None = None) -> InstructionCounts:
    """Counts over `function`'s instructions only (a code object may also carry device-library
    functions, e.g. __ockl_hostcall_internal, that the kernel never calls), or the whole text."""
    mn, loads, stream = Counter(), Counter(), Counter()
    inside = found = function is None
    for line in disassembly.splitlines():
        head = _AMD_FUNCTION.match(line)
        if head:
            inside = function is None or head.group(1) == function
            found |= inside
            continue
        m = _AMD_LINE.match(line) if inside else None
        if not m:
            continue
        op, operands = m.group(1), m.group(2)
        mn[op] += 1
        if op.startswith("scratch_") or _MUBUF_SCRATCH.match(op + " " + operands):
            mn["(scratch access)"] += 1
            continue
        lm = _AMD_LOAD.match(op)
        if lm:
            nbytes = _LOAD_BYTES.get(lm.group(2), 0)
            loads[nbytes] += 1
            if _NONTEMPORAL.search(operands):
                stream[nbytes] += 1
    if not found:
        raise ValueError(f"function {function!r} is not in the disassembly")
    dot2 = sum(n for op, n in mn.items() if re.match(r"^v_dot2c?_f32_f16", op))
    mma = sum(n for op, n in mn.items() if op.startswith(("v_mfma", "v_wmma", "v_smfmac", "v_swmmac")))
    fma = sum(n for op, n in mn.items() if re.match(r"^v_(fma|fmac|mac|mad|pk_fma)_f32", op))
    return InstructionCounts(mn, dict(loads), dict(stream), dot2, mma, fma, mn["(scratch access)"])


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def count_sass(disassembly: str) -> InstructionCounts:
    mn, loads, stream = Counter(), Counter(), Counter()
    for line in disassembly.splitlines():
        m = _SASS_LINE.search(line)
        if not m:
            continue
        op = m.group(1)
        mn[op] += 1
        parts = op.split(".")
        if parts[0] == "LDG":
            width = next((int(p) // 8 for p in parts[1:] if p in ("64", "128", "256")), None)
            if width is None:
                width = 1 if ("U8" in parts or "S8" in parts) else 2 if ("U16" in parts or "S16" in parts) else 4
            loads[width] += 1
            # .NA (no allocate) / .EF (evict first) / .LU (last use): int4jit's weight-stream loads.
            if any(p in ("NA", "EF", "LU") for p in parts):
                stream[width] += 1
    mma = sum(n for op, n in mn.items() if op.startswith(("HMMA", "IMMA", "HGMMA")))
    fma = sum(n for op, n in mn.items() if op.split(".")[0] in ("FFMA", "FMUL"))
    scratch = sum(n for op, n in mn.items() if op.split(".")[0] in ("LDL", "STL"))
    return InstructionCounts(mn, dict(loads), dict(stream), 0, mma, fma, scratch)


# -- facts ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeFacts:
    """What a compiled kernel's bytes say about it. `counts` is None where no disassembler
    was found (`counts_note` says which tool to install); everything else needs none."""
    vendor: str                    # amd | nvidia
    arch: str
    kernel: str
    wave: int                      # wavefront / warp size
    block: int                     # threads per block the kernel was built for
    vgprs: int                     # AMD VGPRs (unified count on gfx90a/gfx94x) / NVIDIA registers a thread
    sgprs: int                     # AMD SGPRs; 0 on NVIDIA
    agprs: int
    vgpr_spills: int | None        # AMD metadata; NVIDIA: local stores (STL) when disassembled
    sgpr_spills: int
    scratch_bytes: int             # private segment (AMD) / local frame + stack (NVIDIA) a thread
    lds_bytes: int                 # LDS (AMD group segment) / static shared memory (NVIDIA)
    occupancy: Occupancy
    counts: InstructionCounts | None
    counts_note: str = ""

    @property
    def spills(self) -> int | None:
        return None if self.vgpr_spills is None else self.vgpr_spills + self.sgpr_spills


def _amd_wgp_mode(binary: bytes, kernel: str, arch: str) -> bool:
    """gfx10+: COMPUTE_PGM_RSRC1.WGP_MODE (bit 29) of the kernel descriptor; CU mode otherwise."""
    if not arch.startswith("gfx1"):
        return False
    sym = elf_symbol(binary, kernel + ".kd")
    if sym is None:
        return True
    _sec, off, _size = sym
    rsrc1, = struct.unpack_from("<I", binary, off + 48)
    return bool(rsrc1 >> 29 & 1)


def amd_facts(binary: bytes, kernel: str, arch: str, disassemble: bool = True) -> CodeFacts:
    """Facts of `kernel` in an AMD code object (raw ELF bytes from hiprtc: no int4jit header)."""
    md = amd_kernel_metadata(binary, kernel)
    target = amd_metadata(binary).get("amdhsa.target", "")
    if target and f"--{arch}" not in target:
        raise ValueError(f"code object is for {target}, not {arch}")
    block = int(md.get(".max_flat_workgroup_size", 0))
    reqd = md.get(".reqd_workgroup_size")
    if reqd:
        block = reqd[0] * reqd[1] * reqd[2]
    vgprs, sgprs, agprs = int(md[".vgpr_count"]), int(md[".sgpr_count"]), int(md.get(".agpr_count", 0))
    lds = int(md.get(".group_segment_fixed_size", 0))
    wgp = _amd_wgp_mode(binary, kernel, arch)
    occ = amd_occupancy(arch, block, vgprs, sgprs, lds, agprs, wgp)
    counts, note = None, "not asked for (disassemble=False)"
    if disassemble:
        try:
            counts, note = count_amd(amd_disassemble(binary, arch), kernel), ""
        except ToolMissing as e:
            note = str(e)
    return CodeFacts("amd", arch, kernel, int(md.get(".wavefront_size", 64)), block, vgprs, sgprs, agprs,
                     int(md.get(".vgpr_spill_count", 0)), int(md.get(".sgpr_spill_count", 0)),
                     int(md.get(".private_segment_fixed_size", 0)), lds, occ, counts, note)


# .nv.info attributes (EIATTR_*) int4jit reads; each SVAL here is (u32 symbol index, u32 value).
EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE, EIATTR_MAX_STACK_SIZE, EIATTR_REGCOUNT = 0x11, 0x12, 0x23, 0x2F
EIATTR_MAX_THREADS, EIATTR_REQNTID = 0x05, 0x10
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4


def nv_info_attributes(data: bytes):
    """(attribute, format, payload) entries of a cubin's .nv.info section."""
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr, val = struct.unpack_from("<BBH", data, pos)
        pos += 4
        if fmt == EIFMT_SVAL:
            yield attr, fmt, data[pos:pos + val]
            pos += val
        else:
            yield attr, fmt, struct.pack("<H", val)


def cuda_facts(binary: bytes, kernel: str, arch: str, block: int, disassemble: bool = True) -> CodeFacts:
    """Facts of `kernel` in a cubin: registers and frame from .nv.info, static shared memory
    from .nv.shared.<kernel>, spills and loads from nvdisasm where installed. `block` is the
    launch's threads per block (a cubin records it only under __launch_bounds__ / reqntid)."""
    sections = elf_sections(binary)
    names = {s.name: s for s in sections}
    text = names.get(f".text.{kernel}")
    if text is None:
        raise ValueError(f"kernel {kernel!r} is not in the cubin")
    regs = frame = stack = 0
    for attr, fmt, payload in nv_info_attributes(_section_bytes(binary, names.get(".nv.info", text))
                                                 if ".nv.info" in names else b""):
        if fmt == EIFMT_SVAL and len(payload) >= 8:
            _sym, value = struct.unpack_from("<II", payload)
            if attr == EIATTR_REGCOUNT:
                regs = max(regs, value)   # one entry per function; a one-kernel cubin has one
            elif attr == EIATTR_FRAME_SIZE:
                frame = max(frame, value)
            elif attr in (EIATTR_MIN_STACK_SIZE, EIATTR_MAX_STACK_SIZE):
                stack = max(stack, value)
    if not regs:
        regs = text.info >> 24
    shared = names.get(f".nv.shared.{kernel}")
    smem = shared.size if shared is not None else 0
    counts, note = None, "not asked for (disassemble=False)"
    if disassemble:
        try:
            counts, note = count_sass(cuda_disassemble(binary)), ""
        except ToolMissing as e:
            note = str(e)
    spills = (counts.mnemonics.get("STL", 0) + sum(n for op, n in counts.mnemonics.items() if op.startswith("STL."))
              if counts is not None else (0 if frame == 0 and stack == 0 else None))
    occ = cuda_occupancy(arch, block, regs, smem)
    return CodeFacts("nvidia", arch, kernel, 32, block, regs, 0, 0, spills, 0, max(frame, stack), smem, occ,
                     counts, note)


def code_facts(binary: bytes, kernel: str, arch: str, block: int, disassemble: bool = True) -> CodeFacts:
    """amd_facts for gfx*, cuda_facts for sm_*."""
    if arch.startswith("gfx"):
        return amd_facts(binary, kernel, arch, disassemble)
    return cuda_facts(binary, kernel, arch, block, disassemble)
