"""CPU emulation of gemv_tc.hip with OFFSET (session 4; correct on the H200, off by default): A = the raw
(1024 + q) / (1024 + 16q) nibble pairs, low nibbles into one accumulator and high into another,
the offsets C = 1024 sum(x even) + 64 sum(x odd) (+ 8 sum(x) when symmetric) and S = sum(x)
taken off per D column from a table the block computes on the tensor cores (A constant).
Follows the kernel's lanes and fragments (bench/proto/emulate_mma.py's mma) in float64, for
groups >= 128 (every lane carries x) and under 128 (the diagonal), so a wrong register or
index shows as a wrong GEMV before any GPU time is spent.
    python3 bench/proto/emulate_tc_offset.py"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4jit  # noqa: E402
from emulate_mma import mma  # noqa: E402


def x_pairs(xf, c, chunks, keep):
    """tc_x_pairs: the lane's chunk c as xp[j] = (x0,x4) (x1,x5) (x2,x6) (x3,x7) of word j."""
    e = xf[32 * min(c, chunks - 1): 32 * min(c, chunks - 1) + 32] if keep else np.zeros(32)
    return [[(e[8 * j + i], e[8 * j + i + 4]) for i in range(4)] for j in range(4)]


def raw_pairs(word_bytes):
    """A pairs of one 8-nibble word: lo(q) = 1024+(q0,q4), hi(q) = 1024+16(q1,q5),
    lo(q>>8) = 1024+(q2,q6), hi(q>>8) = 1024+16(q3,q7)."""
    q = [(int(b) & 0xF, int(b) >> 4) for b in word_bytes]  # elements 2b, 2b+1
    el = [v for pair in q for v in pair]
    return ((1024 + el[0], 1024 + el[4]), (1024 + 16 * el[1], 1024 + 16 * el[5]),
            (1024 + el[2], 1024 + el[6]), (1024 + 16 * el[3], 1024 + 16 * el[7]))


def emulate(x, w, s, z, N, K, G):
    sym = z is None
    zz = np.full(s.shape, 8.0) if sym else z.astype(np.float64)
    sf, xf = s.astype(np.float64), x.astype(np.float64)
    chunks, steps = K // 32, -(-K // 128)
    diag, segs = G < 128, (2 if G == 16 else 1)
    seg_words = 4 // segs
    keep = lambda g, t, c: c < chunks and (not diag or g == t)

    # tc_offsets: D[g] = C, D[g+8] = S per column
    offs = np.zeros((4 * steps * segs if diag else steps, 2))
    for st in range(steps):
        xps = [x_pairs(xf, 4 * st + l % 4, chunks, keep(l // 4, l % 4, 4 * st + l % 4)) for l in range(32)]
        for seg in range(segs):
            d = [[0.0] * 4 for _ in range(32)]
            for jj in range(seg_words):
                j = seg * seg_words + jj
                d = mma([((1024, 1024), (1, 1), (1024, 1024), (1, 1))] * 32, [(xps[l][j][0], xps[l][j][2]) for l in range(32)], d)
                d = mma([((64, 64), (1, 1), (64, 64), (1, 1))] * 32, [(xps[l][j][1], xps[l][j][3]) for l in range(32)], d)
            for lane in range(4):  # g == 0
                t = lane
                if diag:
                    if t < 2:
                        for e in range(2):
                            offs[(4 * st + 2 * t + e) * segs + seg] = (d[lane][e] + (8 * d[lane][2 + e] if sym else 0), d[lane][2 + e])
                elif t == 0:
                    offs[st] = (d[lane][0] + (8 * d[lane][2] if sym else 0), d[lane][2])

    y = np.zeros(N)
    for row0 in range(0, N, 16):
        acc = np.zeros((32, 2))
        for st in range(steps):
            xps = [x_pairs(xf, 4 * st + l % 4, chunks, keep(l // 4, l % 4, 4 * st + l % 4)) for l in range(32)]
            for seg in range(segs):
                dl = [[0.0] * 4 for _ in range(32)]
                dh = [[0.0] * 4 for _ in range(32)]
                for jj in range(seg_words):
                    j = seg * seg_words + jj
                    al, ah, bl, bh = [], [], [], []
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        c = min(4 * st + t, chunks - 1)
                        ra, rb = (min(row0 + g + 8 * h, N - 1) for h in range(2))
                        pa = raw_pairs(w[ra, 16 * c + 4 * j: 16 * c + 4 * j + 4])
                        pb = raw_pairs(w[rb, 16 * c + 4 * j: 16 * c + 4 * j + 4])
                        al.append((pa[0], pb[0], pa[2], pb[2]))
                        ah.append((pa[1], pb[1], pa[3], pb[3]))
                        bl.append((xps[lane][j][0], xps[lane][j][2]))
                        bh.append((xps[lane][j][1], xps[lane][j][3]))
                    dl = mma(al, bl, dl)
                    dh = mma(ah, bh, dh)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    fold = 2 * (t & 1) if diag else t
                    for h in range(2):
                        r_row = min(row0 + g + 8 * h, N - 1)
                        for e in range(2 if diag else 1):
                            c, o = (min(4 * st + fold + e, chunks - 1),
                                    offs[(4 * st + 2 * (t & 1) + e) * segs + seg] if diag else offs[st])
                            gi = (32 * c + 16 * seg) // G
                            r = dh[lane][2 * h + e] * 0.0625 + dl[lane][2 * h + e] - o[0]
                            if not sym:
                                r -= zz[r_row, gi] * o[1]
                            if not diag or t < 2:
                                acc[lane, h] += r * sf[r_row, gi]
        for g in range(8):
            for h in range(2):
                if row0 + g + 8 * h < N:
                    lane = 4 * g  # t == 0 stores: its own sums, plus lane t = 1's on the diagonal
                    y[row0 + g + 8 * h] = acc[lane, h] + (acc[lane + 1, h] if diag else 0)
    return y


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for N, K, G, sym in [(16, 128, 128, False), (17, 256, 128, True), (16, 256, 256, False), (16, 128, 32, False),
                         (21, 96, 16, False), (16, 160, 32, True), (3, 64, 64, False), (16, 96, 32, False)]:
        w = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        s = (rng.random((N, K // G)) * 0.02 + 1e-3).astype(np.float16)
        z = None if sym else rng.integers(0, 16, (N, K // G), dtype=np.uint8)
        x = (rng.standard_normal(K) + 0.5).astype(np.float16)  # a mean, as activations have
        ref = int4jit.reference_gemv(x, w, s, z)
        y = emulate(x, w, s, z, N, K, G)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        print(f"N={N:3d} K={K:4d} g={G:3d} sym={sym}: emulated rel err {err:.1e}")
        assert err < 1e-9, err
    print("OFFSET form and its offsets table verified (float64)")
