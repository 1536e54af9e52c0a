"""CPU emulation of gemv_tc.hip's RAW_A arithmetic for one warp and one 16-row tile, with the
m16n8k16 fragment layouts of emulate_mma.mma (the PTX ISA's): A = raw (1024 + q) pairs on even k
and (64 + q) pairs on odd k, the step's offsets from one mma per word with the lane's x as A and
ones (or the diagonal) as B, and the fold D - C - z S per D column, then the diagonal lanes'
exchange. A wrong register or column choice shows as a wrong GEMV before any GPU time is spent.
    python3 bench/proto/emulate_tc_raw.py"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from emulate_mma import mma  # noqa: E402


def _word_pairs_raw(b):
    """4 bytes (elements 8j..8j+7) -> A pairs (1024+q0, 1024+q4) (64+q1, 64+q5) (1024+q2, 1024+q6)
    (64+q3, 64+q7): what the LOP3s with MAGIC_1024 / MAGIC_64 make of the word and of word >> 8."""
    lo, hi = b & 0xF, b >> 4
    return ((1024 + lo[0], 1024 + lo[2]), (64 + hi[0], 64 + hi[2]), (1024 + lo[1], 1024 + lo[3]), (64 + hi[1], 64 + hi[3]))


def emulate(x, w, scales, zeros, N, K, G):
    """y [N] as the RAW_A kernel computes it (float64 arithmetic), tile by tile."""
    chunks, steps, diag, segs = K // 32, -(-K // 128), G < 128, 2 if G == 16 else 1
    seg_words = 4 // segs
    xf = x.astype(np.float64)
    y = np.zeros(N)
    for row0 in range(0, N, 16):
        acc = np.zeros((32, 2))
        rows = [[min(row0 + 8 * h + lane // 4, N - 1) for h in range(2)] for lane in range(32)]
        for s in range(steps):
            xp, keep = [], []
            for lane in range(32):
                g, t = lane // 4, lane % 4
                c = min(4 * s + t, chunks - 1)
                e = xf[32 * c:32 * c + 32].reshape(4, 8)
                xp.append([((v[0], v[4]), (v[1], v[5]), (v[2], v[6]), (v[3], v[7])) for v in e])
                keep.append(not diag or (4 * s + t < chunks and g == t))
            for seg in range(segs):
                eo = [[0.0] * 4 for _ in range(32)]
                d = [[0.0] * 4 for _ in range(32)]
                for jj in range(seg_words):
                    j = seg * seg_words + jj
                    ones = [((1, 1), (1, 1)) if keep[l] else ((0, 0), (0, 0)) for l in range(32)]
                    eo = mma([xp[l][j] for l in range(32)], ones, eo)
                    bx = [[p if keep[l] else (0, 0) for p in xp[l][j]] for l in range(32)]
                    a = []
                    for lane in range(32):
                        t = lane % 4
                        c = min(4 * s + t, chunks - 1)  # a lane past the last chunk re-reads it
                        wa = _word_pairs_raw(w[rows[lane][0], 16 * c + 4 * j:16 * c + 4 * j + 4].astype(np.int64))
                        wb = _word_pairs_raw(w[rows[lane][1], 16 * c + 4 * j:16 * c + 4 * j + 4].astype(np.int64))
                        a.append([(wa[0], wb[0], wa[1], wb[1]), (wa[2], wb[2], wa[3], wb[3])])
                    d = mma([a[l][0] for l in range(32)], [(bx[l][0], bx[l][1]) for l in range(32)], d)
                    d = mma([a[l][1] for l in range(32)], [(bx[l][2], bx[l][3]) for l in range(32)], d)
                for lane in range(32):
                    t = lane % 4
                    fold = 2 * (t & 1) if diag else t
                    for h in range(2):
                        for e in range(2 if diag else 1):
                            fc = min(4 * s + fold + e, chunks - 1)
                            grp = (32 * fc + 16 * seg) // G
                            z = 8.0 if zeros is None else float(zeros[rows[lane][h], grp])
                            C = 1024 * eo[lane][e] + 64 * eo[lane][2 + e]
                            S = eo[lane][e] + eo[lane][2 + e]
                            acc[lane, h] += (d[lane][2 * h + e] - (C + z * S)) * float(scales[rows[lane][h], grp])
        if diag:
            acc = acc + acc[np.arange(32) ^ 1]
        for lane in range(0, 32, 4):
            for h in range(2):
                r = row0 + 8 * h + lane // 4
                if r < N:
                    y[r] = acc[lane, h]
    return y


if __name__ == "__main__":
    import int4jit
    from int4jit import reference
    from int4jit.shapes import GemvShape
    for N, K, G, sym in [(16, 128, 128, False), (21, 96, 16, False), (40, 256, 32, True), (16, 192, 64, False), (5, 4160, 32, False)]:
        x, w, s, z = reference.random_problem(GemvShape(N, K, G, sym))
        ref = int4jit.reference_gemv(x, w, s, z)
        err = np.linalg.norm(emulate(x, w, s, z, N, K, G) - ref) / np.linalg.norm(ref)
        print(f"{N}x{K} g{G} {'sym' if sym else 'asym'}: relative error {err:.1e}")
