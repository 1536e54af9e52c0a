// M=1 INT4 weight-only GEMV on tensor cores (NVIDIA sm_80+, mma.sync m16n8k16 f16 -> f32).
//   y[n] = sum_k x[k] * (q[n,k] - z[n,k/g]) * s[n,k/g]     exact products, fp32 sums, fp16 out
// Same layout as gemv.hip (ONNX Runtime MatMulNBits): w uint8 [N, K/2], low nibble = even k;
// scales fp16 [N, K/g]; zeros uint8 [N, K/g] (absent when symmetric: zero point 8). K % 32 == 0.
//
// Work split. A warp owns TW tiles of 16 rows; lane (g = lane/4, t = lane%4) streams rows
// g and g+8 of each tile, 32-element chunk 4*step + t (16-byte loads, 64 contiguous bytes per
// row per step). KSPLIT warps of a block share the same rows and split the steps.
//
// Dequantisation is two LOP3s per fp16 pair: OR-ing a nibble into the mantissa of 1024 gives
// 1024 + q (low nibbles) or 1024 + 16q (high nibbles) exactly; the offsets come off after the
// mma, with per-chunk sums of x:  sum (q-z) x = D_lo - (1024+z) S_lo + D_hi/16 - (64+z) S_hi.
// In the mma, A holds the lane's pairs (a0/a1: low nibbles of rows g/g+8, a2/a3: high
// nibbles), and B column n holds x only where it belongs: lane (n, n) gives the low-nibble x
// pairs (b0) of chunk n, lane (n+4, n) the high-nibble x pairs (b1); every other B value is 0.
// So D column n < 4 is chunk n's low-nibble sum and column n + 4 its high-nibble sum.
// x is staged once per block in shared memory, already paired and split into low/high
// halves, with the per-segment sums S; lanes that supply no B values read a zero block.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr int WARPS = ${WARPS};
constexpr int KSPLIT = ${KSPLIT};       // warps along K sharing one set of rows
constexpr int TW = ${TW};               // 16-row tiles per warp
constexpr int UNROLL = ${UNROLL};       // steps whose loads are issued before the first use
constexpr int BS = WARPS * 32;
constexpr int WARP_ROWS = 16 * TW;
constexpr int ROWS_PER_BLOCK = (WARPS / KSPLIT) * WARP_ROWS;
constexpr long long ROW_BLOCKS = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
constexpr int CHUNKS = K / 32;          // 16-byte loads per row
constexpr int STEPS = (CHUNKS + 3) / 4;
constexpr int PAD_CHUNKS = 4 * STEPS;
constexpr int NG = K / GROUP;
constexpr long long ROW_BYTES = K / 2;
constexpr int SEG_WORDS = GROUP == 16 ? 2 : 4;  // weight words (8 elements) per group within a chunk
constexpr int SEGS = 4 / SEG_WORDS;
constexpr int ZERO_BLOCK = PAD_CHUNKS * 16;     // 8 zero words after the staged x
constexpr u32 MAGIC_1024 = 0x64006400u;         // fp16 1024.0 in both halves

static_assert(K % 32 == 0, "the tensor-core kernel needs K % 32 == 0");
static_assert(WARPS % KSPLIT == 0, "KSPLIT must divide WARPS");
static_assert(GROUP % 16 == 0, "a group holds whole 8-element words");

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    __shared__ u32x4 xs4[(ZERO_BLOCK + 8) / 4];
    __shared__ float xsum[PAD_CHUNKS][2][SEGS];
    u32* xs = (u32*)xs4;
    const int tid = threadIdx.x;

    // Stage x: chunk c, word j (elements 8j..8j+7 of the chunk) becomes the low-nibble pairs
    // (x0,x4) (x2,x6) at xs[16c + 2j], the high-nibble pairs (x1,x5) (x3,x7) at xs[16c + 8 + 2j].
    for (int i = tid; i < PAD_CHUNKS * SEGS; i += BS) {
        const int c = i / SEGS, seg = i % SEGS;
        float slo = 0.0f, shi = 0.0f;
#pragma unroll
        for (int jj = 0; jj < SEG_WORDS; ++jj) {
            const int j = seg * SEG_WORDS + jj;
            u32 lo0 = 0, lo1 = 0, hi0 = 0, hi1 = 0;
            if (c < CHUNKS) {
                const u32x4 v = load_cached16(x + 32 * c + 8 * j);
                lo0 = (v.x & 0xFFFFu) | (v.z << 16);
                hi0 = (v.x >> 16) | (v.z & 0xFFFF0000u);
                lo1 = (v.y & 0xFFFFu) | (v.w << 16);
                hi1 = (v.y >> 16) | (v.w & 0xFFFF0000u);
                slo += (h2_lo(lo0) + h2_hi(lo0)) + (h2_lo(lo1) + h2_hi(lo1));
                shi += (h2_lo(hi0) + h2_hi(hi0)) + (h2_lo(hi1) + h2_hi(hi1));
            }
            xs[16 * c + 2 * j] = lo0;
            xs[16 * c + 2 * j + 1] = lo1;
            xs[16 * c + 8 + 2 * j] = hi0;
            xs[16 * c + 8 + 2 * j + 1] = hi1;
        }
        xsum[c][0][seg] = slo;
        xsum[c][1][seg] = shi;
    }
    if (tid < 8) xs[ZERO_BLOCK + tid] = 0u;
    __syncthreads();

    const int warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int wt = warp / KSPLIT, ks = warp % KSPLIT;
    // Where this lane's B values come from: its chunk's x, or the zero block.
    const int b0_base = g == t ? 0 : ZERO_BLOCK, b0_stride = g == t ? 16 : 0;
    const int b1_base = g == t + 4 ? 8 : ZERO_BLOCK, b1_stride = g == t + 4 ? 16 : 0;
    // Which D columns this lane holds: 2t and 2t+1, i.e. chunks 2*(t&1)+e, low or high half.
    const bool high = t >= 2;
    const int pair = t & 1;
    const float d_scale = high ? 0.0625f : 1.0f;
    const float offset = high ? 64.0f : 1024.0f;

    for (long long blk = blockIdx.x; blk < ROW_BLOCKS; blk += gridDim.x) {
        const long long row0 = blk * ROWS_PER_BLOCK + (long long)wt * WARP_ROWS;
        // Rows past N read row N-1 (always valid) and are never stored.
        long long rows[TW][2];
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long r = row0 + 16 * tw + 8 * h + g;
                rows[tw][h] = r < N ? r : N - 1;
            }
        float acc[TW][2];
#pragma unroll
        for (int tw = 0; tw < TW; ++tw) acc[tw][0] = acc[tw][1] = 0.0f;

        for (int s0 = ks; s0 < STEPS; s0 += KSPLIT * UNROLL) {
            u32 wq[UNROLL][TW][2][4];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                int c = 4 * (s0 + u * KSPLIT) + t;
                c = c < CHUNKS ? c : CHUNKS - 1;   // its x is zero (padding) or the step is skipped
#pragma unroll
                for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const u32x4 v = load_stream16(w + rows[tw][h] * ROW_BYTES + 16LL * c);
                        wq[u][tw][h][0] = v.x; wq[u][tw][h][1] = v.y;
                        wq[u][tw][h][2] = v.z; wq[u][tw][h][3] = v.w;
                    }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int step = s0 + u * KSPLIT;
                if (step >= STEPS) break;
                const int c = 4 * step + t;
                u32 b0[8], b1[8];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32x4 v0 = xs4[(b0_base + c * b0_stride) / 4 + h];
                    const u32x4 v1 = xs4[(b1_base + c * b1_stride) / 4 + h];
                    b0[4 * h] = v0.x; b0[4 * h + 1] = v0.y; b0[4 * h + 2] = v0.z; b0[4 * h + 3] = v0.w;
                    b1[4 * h] = v1.x; b1[4 * h + 1] = v1.y; b1[4 * h + 2] = v1.z; b1[4 * h + 3] = v1.w;
                }
#pragma unroll
                for (int tw = 0; tw < TW; ++tw) {
#pragma unroll
                    for (int seg = 0; seg < SEGS; ++seg) {
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int jj = 0; jj < SEG_WORDS; ++jj) {
                            const int j = seg * SEG_WORDS + jj;
                            const u32 qa = wq[u][tw][0][j], qb = wq[u][tw][1][j];
                            const u32 qa2 = qa >> 8, qb2 = qb >> 8;
                            mma_16816(d, (qa & 0x000F000Fu) | MAGIC_1024, (qb & 0x000F000Fu) | MAGIC_1024,
                                      (qa & 0x00F000F0u) | MAGIC_1024, (qb & 0x00F000F0u) | MAGIC_1024,
                                      b0[2 * j], b1[2 * j]);
                            mma_16816(d, (qa2 & 0x000F000Fu) | MAGIC_1024, (qb2 & 0x000F000Fu) | MAGIC_1024,
                                      (qa2 & 0x00F000F0u) | MAGIC_1024, (qb2 & 0x00F000F0u) | MAGIC_1024,
                                      b0[2 * j + 1], b1[2 * j + 1]);
                        }
                        // d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
                        const int cn0 = 4 * step + 2 * pair;
                        if constexpr (GROUP >= 64) {
                            // both columns' chunks lie in one group (K % 64 == 0: both exist or neither)
                            if (cn0 < CHUNKS) {
                                const int gi = 32 * cn0 / GROUP;
                                const float sx = xsum[cn0][high][0] + xsum[cn0 + 1][high][0];
#pragma unroll
                                for (int h = 0; h < 2; ++h) {
                                    const long long gidx = rows[tw][h] * NG + gi;
                                    const float z = SYMMETRIC ? 8.0f : (float)load_cached_u8(zeros + gidx);
                                    acc[tw][h] += ((d[2 * h] + d[2 * h + 1]) * d_scale - (offset + z) * sx)
                                                  * h_to_f(load_cached_u16(scales + gidx));
                                }
                            }
                        } else {
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int cn = cn0 + e;
                                if (cn < CHUNKS) {
                                    const int gi = (32 * cn + 8 * SEG_WORDS * seg) / GROUP;
                                    const float sx = xsum[cn][high][seg];
#pragma unroll
                                    for (int h = 0; h < 2; ++h) {
                                        const long long gidx = rows[tw][h] * NG + gi;
                                        const float z = SYMMETRIC ? 8.0f : (float)load_cached_u8(zeros + gidx);
                                        acc[tw][h] += (d[2 * h + e] * d_scale - (offset + z) * sx)
                                                      * h_to_f(load_cached_u16(scales + gidx));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }

        // Lanes t = 0..3 of a row hold its low/high halves of two chunk columns each.
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                acc[tw][h] += warp_xor(acc[tw][h], 1);
                acc[tw][h] += warp_xor(acc[tw][h], 2);
            }
        if constexpr (KSPLIT == 1) {
            if (t == 0) {
#pragma unroll
                for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const long long r = row0 + 16 * tw + 8 * h + g;
                        if (r < N) y[r] = f_to_h(acc[tw][h]);
                    }
            }
        } else {
            __shared__ float partial[WARPS / KSPLIT][KSPLIT][WARP_ROWS];
            if (t == 0) {
#pragma unroll
                for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                    for (int h = 0; h < 2; ++h) partial[wt][ks][16 * tw + 8 * h + g] = acc[tw][h];
            }
            __syncthreads();
            for (int i = tid; i < ROWS_PER_BLOCK; i += BS) {
                const int tile = i / WARP_ROWS, r = i % WARP_ROWS;
                float sum = 0.0f;
#pragma unroll
                for (int k = 0; k < KSPLIT; ++k) sum += partial[tile][k][r];
                const long long row = blk * ROWS_PER_BLOCK + i;
                if (row < N) y[row] = f_to_h(sum);
            }
            __syncthreads();
        }
    }
}
