"""CPU emulation of int4jit/templates/gemv_mma.hip's lane/fragment mapping, using the
mma.m16n8k16 fragment layouts as the PTX ISA documents them (A row-major 16x16, B col 16x8,
C/D 16x8 f32):
  A: a0=(g, 2t..2t+1) a1=(g+8, 2t..) a2=(g, 2t+8..) a3=(g+8, 2t+8..)
  B: b0=(k 2t..2t+1, n g) b1=(k 2t+8..2t+9, n g);  D: d0,d1=(g, 2t,2t+1) d2,d3=(g+8, 2t,2t+1)
It follows the kernel step by step (staged x, offset dequantisation, zero-block B lanes, the
per-lane correction and the lane reduction) in float64, so a wrong register choice shows as a
wrong GEMV before any GPU time is spent.
    python3 bench/proto/emulate_mma.py"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import int4jit  # noqa: E402


def mma(a_regs, b_regs, d_regs):
    """a_regs[lane] = 4 pairs, b_regs[lane] = 2 pairs, d_regs[lane] = 4 floats -> new d."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a0, a1, a2, a3 = a_regs[lane]
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a0, a1
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a2, a3
        b0, b1 = b_regs[lane]
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b0, b1
        C[g, 2 * t:2 * t + 2], C[g + 8, 2 * t:2 * t + 2] = d_regs[lane][:2], d_regs[lane][2:]
    D = A @ B + C
    return [[D[l // 4, 2 * (l % 4)], D[l // 4, 2 * (l % 4) + 1], D[l // 4 + 8, 2 * (l % 4)], D[l // 4 + 8, 2 * (l % 4) + 1]]
            for l in range(32)]


def word_pairs(byte4):
    """One 32-bit weight word (4 bytes, 8 nibbles) -> the kernel's four fp16 pairs:
    lo0 = 1024+(k0,k4), hi0 = 1024+16(k1,k5), lo1 = 1024+(k2,k6), hi1 = 1024+16(k3,k7)."""
    lo = byte4 & 0xF
    hi = byte4 >> 4
    return ((1024 + lo[0], 1024 + lo[2]), (1024 + 16 * hi[0], 1024 + 16 * hi[2]),
            (1024 + lo[1], 1024 + lo[3]), (1024 + 16 * hi[1], 1024 + 16 * hi[3]))


def stage_x(xf, K, seg_words):
    """The kernel's shared-memory x: per padded chunk 8 low-pair words then 8 high-pair words
    (each a pair of floats here), and per-segment sums."""
    chunks = K // 32
    pad = 4 * (-(-chunks // 4))
    xs = np.zeros((pad, 16, 2))
    sums = np.zeros((pad, 2, 4 // seg_words))
    for c in range(chunks):
        for j in range(4):
            e = xf[32 * c + 8 * j: 32 * c + 8 * j + 8]
            xs[c, 2 * j] = (e[0], e[4]); xs[c, 2 * j + 1] = (e[2], e[6])
            xs[c, 8 + 2 * j] = (e[1], e[5]); xs[c, 8 + 2 * j + 1] = (e[3], e[7])
            seg = j // seg_words
            sums[c, 0, seg] += e[0] + e[4] + e[2] + e[6]
            sums[c, 1, seg] += e[1] + e[5] + e[3] + e[7]
    return xs, sums


def emulate(x, w, s, z, N, K, G):
    """One warp's tile at a time (KSPLIT = 1, TW = 1; the split only reorders the sums)."""
    zz = np.full(s.shape, 8.0) if z is None else z.astype(np.float64)
    sf, xf = s.astype(np.float64), x.astype(np.float64)
    chunks, steps = K // 32, -(-K // 128)
    seg_words = 2 if G == 16 else 4
    xs, sums = stage_x(xf, K, seg_words)
    zero = np.zeros((8, 2))
    y = np.zeros(N)
    for row0 in range(0, N, 16):
        acc = np.zeros((32, 2))
        for step in range(steps):
            for seg in range(4 // seg_words):
                d = [[0.0] * 4 for _ in range(32)]
                for jj in range(seg_words):
                    j = seg * seg_words + jj
                    for m in range(2):
                        a_regs, b_regs = [], []
                        for lane in range(32):
                            g, t = lane // 4, lane % 4
                            c = min(4 * step + t, chunks - 1)
                            ra, rb = (min(row0 + g + 8 * h, N - 1) for h in range(2))
                            pa = word_pairs(w[ra, 16 * c + 4 * j: 16 * c + 4 * j + 4].astype(np.int64))
                            pb = word_pairs(w[rb, 16 * c + 4 * j: 16 * c + 4 * j + 4].astype(np.int64))
                            a_regs.append((pa[2 * m], pb[2 * m], pa[2 * m + 1], pb[2 * m + 1]))
                            cc = 4 * step + t
                            b0 = xs[cc, :8] if g == t else zero
                            b1 = xs[cc, 8:] if g == t + 4 else zero
                            b_regs.append((b0[2 * j + m], b1[2 * j + m]))
                        d = mma(a_regs, b_regs, d)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    high, pair = t >= 2, t & 1
                    d_scale, offset = (1 / 16, 64.0) if high else (1.0, 1024.0)
                    for e in range(2):
                        cn = 4 * step + 2 * pair + e
                        if cn >= chunks:
                            continue
                        gi = (32 * cn + 8 * seg_words * seg) // G
                        for h in range(2):
                            r = min(row0 + g + 8 * h, N - 1)
                            acc[lane, h] += (d[lane][2 * h + e] * d_scale - (offset + zz[r, gi]) * sums[cn, int(high), seg]) * sf[r, gi]
        for g in range(8):
            for h in range(2):
                if row0 + g + 8 * h < N:
                    y[row0 + g + 8 * h] = acc[4 * g: 4 * g + 4, h].sum()
    return y


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for N, K, G, sym in [(16, 128, 32, False), (21, 96, 16, False), (40, 256, 128, True), (16, 160, 32, False),
                         (3, 64, 64, False), (33, 512, 256, False), (16, 96, 32, False)]:
        w = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        s = (rng.random((N, K // G)) * 0.02 + 1e-3).astype(np.float16)
        z = None if sym else rng.integers(0, 16, (N, K // G), dtype=np.uint8)
        x = rng.standard_normal(K).astype(np.float16)
        ref = int4jit.reference_gemv(x, w, s, z)
        y = emulate(x, w, s, z, N, K, G)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        print(f"N={N:3d} K={K:4d} g={G:3d} sym={sym}: emulated rel err {err:.1e}")
        assert err < 1e-9
    print("fragment mapping verified")
