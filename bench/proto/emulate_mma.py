"""CPU emulation of gemv_mma.hip's lane/fragment mapping, using the mma.m16n8k16 fragment
layouts as the PTX ISA documents them (A row-major 16x16, B col 16x8, C/D 16x8 f32):
  A: a0=(g, 2t..2t+1) a1=(g+8, 2t..) a2=(g, 2t+8..) a3=(g+8, 2t+8..)
  B: b0=(k 2t..2t+1, n g) b1=(k 2t+8..2t+9, n g);  D: d0,d1=(g, 2t,2t+1) d2,d3=(g+8, 2t,2t+1)
It checks that the kernel's choice of registers computes the GEMV before any GPU time is spent.
    python3 bench/proto/emulate_mma.py"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import int4jit  # noqa: E402
from int4jit.reference import unpack_nibbles  # noqa: E402


def pairs_of_word(vals8):
    """8 elements k0..k7 of one word -> the kernel's pairs (k0,k4) (k1,k5) (k2,k6) (k3,k7)."""
    return [(vals8[0], vals8[4]), (vals8[1], vals8[5]), (vals8[2], vals8[6]), (vals8[3], vals8[7])]


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


def emulate(x, w, s, z, N, K, G):
    q = unpack_nibbles(w).astype(np.float64)
    zz = np.full(s.shape, 8.0) if z is None else z.astype(np.float64)
    sf = s.astype(np.float64)
    xf = x.astype(np.float64)
    chunks, steps = K // 32, -(-K // 128)
    flush_words = 2 if G == 16 else 4
    y = np.zeros(N)
    for row0 in range(0, N, 16):
        rows = lambda g: (min(row0 + g, N - 1), min(row0 + g + 8, N - 1))
        acc = np.zeros((32, 2))
        for step in range(steps):
            for half in range(4 // flush_words):
                d = [[0.0] * 4 for _ in range(32)]
                for j in range(half * flush_words, (half + 1) * flush_words):
                    for m in range(2):  # two mmas per word
                        a_regs, b_regs = [], []
                        for lane in range(32):
                            g, t = lane // 4, lane % 4
                            c = 4 * step + t
                            ra, rb = rows(g)
                            if c < chunks:
                                k8 = slice(32 * c + 8 * j, 32 * c + 8 * j + 8)
                                grp = (32 * c + 8 * j) // G
                                pa = pairs_of_word(q[ra, k8] - zz[ra, grp])
                                pb = pairs_of_word(q[rb, k8] - zz[rb, grp])
                                px = pairs_of_word(xf[k8])
                            else:
                                pa = pb = px = [(0.0, 0.0)] * 4
                            a_regs.append((pa[2 * m], pb[2 * m], pa[2 * m + 1], pb[2 * m + 1]))
                            b_regs.append((px[2 * m], px[2 * m + 1]) if (g == t and c < chunks) else ((0, 0), (0, 0)))
                        d = mma(a_regs, b_regs, d)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    if t >= 2:
                        continue
                    ra, rb = rows(g)
                    for e in range(2):
                        cn = 4 * step + 2 * t + e
                        if cn < chunks:
                            gi = (32 * cn + 8 * flush_words * half) // G
                            acc[lane, 0] += d[lane][e] * sf[ra, gi]
                            acc[lane, 1] += d[lane][2 + e] * sf[rb, gi]
        for g in range(8):
            total_a = acc[4 * g, 0] + acc[4 * g + 1, 0]
            total_b = acc[4 * g, 1] + acc[4 * g + 1, 1]
            if row0 + g < N:
                y[row0 + g] = total_a
            if row0 + g + 8 < N:
                y[row0 + g + 8] = total_b
    return y


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for N, K, G, sym in [(16, 128, 32, False), (21, 96, 16, False), (40, 256, 128, True), (16, 160, 32, False),
                         (3, 64, 64, False), (33, 512, 256, False)]:
        w = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        s = (rng.random((N, K // G)) * 0.02 + 1e-3).astype(np.float16)
        z = None if sym else rng.integers(0, 16, (N, K // G), dtype=np.uint8)
        x = rng.standard_normal(K).astype(np.float16)
        ref = int4jit.reference_gemv(x, w, s, z)
        y = emulate(x, w, s, z, N, K, G)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        print(f"N={N:3d} K={K:4d} g={G:3d} sym={sym}: emulated rel err {err:.1e}")
        assert err < 1e-12
    print("fragment mapping verified")
