// INT4 weight-only GEMV for 1..16 tokens, fp16 or bf16, on tensor cores (NVIDIA sm_80+,
// mma.sync m16n8k16, f32 accumulate):
//   y[m,n] = sum_k x[m,k] * (q[n,k] - z[n,k/g]) * s[n,k/g]
// Layout (ONNX Runtime MatMulNBits): w uint8 [N, K/2], low nibble = even k; scales [N, K/g];
// zeros uint8 [N, K/g] (absent when symmetric: zero point 8); x [M, K]; y [M, N]. K % 32 == 0.
//
// A = rows g and g+8 of a 16-row tile: for groups of 128 and more (EXACT: a 128-element step
// lies in one group) A = q - z, exact in fp16 and bf16, and each step's D is scaled by its rows'
// scales into fp32 sums; for smaller groups A = (q - z) * s rounded once to the activation type
// (fp16: ~2^-11 relative a weight, bf16: 2^-8) and D accumulates all of K. B = x, one token per
// lane group g (tokens 8..15 in a second mma); D column n is token n. Lane (g, t) reads chunk 4*step + t (16 bytes) of its rows,
// and the same chunk of token g's x, paired as the nibbles are: (k0,k4) (k1,k5) (k2,k6) (k3,k7).
// The warps of a block split K by interleaved steps of 128 elements; their sums meet in shared
// memory.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr int M = ${M};                  // tokens
constexpr bool BF16 = ${BF16};           // x, y and the mma in bf16 (else fp16)
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int KSPLIT = ${KSPLIT};        // warps of a block; they split K
constexpr int TW = ${TW};                // 16-row tiles per warp
constexpr int UNROLL = ${UNROLL};        // steps whose weight loads are in flight together
constexpr int BS = 32 * KSPLIT;
constexpr int NT = (M + 7) / 8;          // 8-token column blocks
constexpr int ROWS_PER_BLOCK = 16 * TW;
constexpr int CHUNKS = K / 32;
constexpr int STEPS = (CHUNKS + 3) / 4;
constexpr int NG = K / GROUP;
constexpr long long ROW_BYTES = K / 2;
constexpr int SEGS = GROUP == 16 ? 2 : 1;  // groups per 32-element chunk
constexpr int SEG_WORDS = 4 / SEGS;        // 8-nibble words per group segment
constexpr bool EXACT = GROUP >= 128;       // A = q - z; scales applied to each step's D

static_assert(K % 32 == 0, "whole 16-byte loads");
static_assert(GROUP % 16 == 0, "a group holds whole 8-element half-words");

// Pair math in the activation type (two values a 32-bit word).
__device__ __forceinline__ u32 pair_sub(u32 a, u32 b) { return BF16 ? bf2_fma(a, 0x3F803F80u, b ^ 0x80008000u) : h2_sub(a, b); }
__device__ __forceinline__ u32 pair_mul(u32 a, u32 b) { return BF16 ? bf2_fma(a, b, 0x80008000u) : h2_fma(a, b, 0x80008000u); }
__device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (BF16) mma_16816_bf16(d, a[0], a[1], a[2], a[3], b0, b1);
    else mma_16816(d, a[0], a[1], a[2], a[3], b0, b1);
}

// A scale as fp32; as stored, in the activation type, in both halves of a word.
__device__ __forceinline__ float scale_f(u16 s) { return SCALE_BF16 ? bf16_to_f(s) : h_to_f(s); }
__device__ __forceinline__ u32 scale_pair(u16 s) {
    const u32 v = BF16 ? f_to_bf16(scale_f(s)) : f_to_h(scale_f(s));
    return v * 0x00010001u;
}

// One 8-nibble word of a row -> its four A pairs (k0,k4) (k1,k5) (k2,k6) (k3,k7) = (q - z) * s.
// fp16: OR-ing a nibble into 1024's mantissa makes 1024 + q (1024 + 16q for the high nibble,
// scaled by 1/16 in the same FMA); bf16 (7 mantissa bits): 128 + q, the high nibble shifted down.
// EXACT: (q - z) alone (s2 unused).
__device__ __forceinline__ u32 scaled(u32 a, u32 s2) { return EXACT ? a : pair_mul(a, s2); }
__device__ __forceinline__ void dequant_word(u32 (&a)[4], u32 q, u32 z, u32 s2) {
    if constexpr (BF16) {
        const u32 zb = (0x4300u | z) * 0x00010001u;  // 128 + z
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 nib = (q >> (4 * i)) & 0x000F000Fu;  // i = 0: (k0,k4); 1: (k1,k5); 2: (k2,k6); 3: (k3,k7)
            a[i] = scaled(pair_sub(nib | 0x43004300u, zb), s2);
        }
    } else {
        const u32 zlo = (0x6400u | z) * 0x00010001u;            // 1024 + z
        const u32 zhi_neg = (0xD400u + (z << 4)) * 0x00010001u;  // -(64 + z)
        const u32 q2 = q >> 8;
        a[0] = scaled(h2_sub((q & 0x000F000Fu) | 0x64006400u, zlo), s2);
        a[1] = scaled(h2_fma((q & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, zhi_neg), s2);
        a[2] = scaled(h2_sub((q2 & 0x000F000Fu) | 0x64006400u, zlo), s2);
        a[3] = scaled(h2_fma((q2 & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, zhi_neg), s2);
    }
}

// x of token `m`, chunk c (32 values), as the B pairs of its four words; zeros past M.
__device__ __forceinline__ void x_pairs(u32 (&b)[4][4], const u16* I4_RESTRICT x, int m, int c) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32x4 v = {0u, 0u, 0u, 0u};
        if (m < M) v = load_cached16(x + (long long)m * K + 32 * c + 8 * j);
        b[j][0] = prmt(v.x, v.z, 0x5410); b[j][1] = prmt(v.x, v.z, 0x7632);
        b[j][2] = prmt(v.y, v.w, 0x5410); b[j][3] = prmt(v.y, v.w, 0x7632);
    }
}

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    const int ks = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const long long row0 = (long long)blockIdx.x * ROWS_PER_BLOCK;
    __shared__ float partial[KSPLIT > 1 ? KSPLIT : 1][KSPLIT > 1 ? M : 1][KSPLIT > 1 ? ROWS_PER_BLOCK : 1];
    long long rows[TW][2];
#pragma unroll
    for (int tw = 0; tw < TW; ++tw)
#pragma unroll
        for (int h = 0; h < 2; ++h) rows[tw][h] = min(row0 + 16 * tw + 8 * h + g, N - 1);  // past N: read, not stored
    float d[TW][NT][4];
#pragma unroll
    for (int tw = 0; tw < TW; ++tw)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) d[tw][nt][0] = d[tw][nt][1] = d[tw][nt][2] = d[tw][nt][3] = 0.0f;
    I4_GRID_WAIT();  // PDL (sm_90): the previous kernel's writes (x) are visible after this
    for (int s0 = ks; s0 < STEPS; s0 += KSPLIT * UNROLL) {
        u32 wq[UNROLL][TW][2][4];
        u16 sc[UNROLL][TW][2][SEGS];
        u8 zp[UNROLL][TW][2][SEGS];
        // Issue every load of the batch before using any; a chunk past K re-reads the last one.
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = min(4 * min(s0 + u * KSPLIT, STEPS - 1) + t, CHUNKS - 1);
#pragma unroll
            for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32x4 v = load_stream16(w + rows[tw][h] * ROW_BYTES + 16LL * c);
                    wq[u][tw][h][0] = v.x; wq[u][tw][h][1] = v.y; wq[u][tw][h][2] = v.z; wq[u][tw][h][3] = v.w;
#pragma unroll
                    for (int seg = 0; seg < SEGS; ++seg) {
                        const long long gi = rows[tw][h] * NG + (32 * c + 16 * seg) / GROUP;
                        sc[u][tw][h][seg] = load_cached_u16(scales + gi);
                        zp[u][tw][h][seg] = SYMMETRIC ? (u8)8 : load_cached_u8(zeros + gi);
                    }
                }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int step = s0 + u * KSPLIT;
            const int c = 4 * step + t;
            if (step >= STEPS) break;
            // Lanes past the last chunk of a partial step give B = 0 (their A is a re-read).
            const bool live = c < CHUNKS;
            float ds[EXACT ? TW : 1][EXACT ? NT : 1][4];  // EXACT: this step's D, scaled below
#pragma unroll
            for (int tw = 0; tw < (EXACT ? TW : 0); ++tw)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) ds[tw][nt][0] = ds[tw][nt][1] = ds[tw][nt][2] = ds[tw][nt][3] = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                u32 b[4][4];
                x_pairs(b, x, live ? 8 * nt + g : M, live ? c : 0);
#pragma unroll
                for (int tw = 0; tw < TW; ++tw) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int seg = j / SEG_WORDS;
                        u32 a[4], a8[4];
                        dequant_word(a, wq[u][tw][0][j], zp[u][tw][0][seg], scale_pair(sc[u][tw][0][seg]));
                        dequant_word(a8, wq[u][tw][1][j], zp[u][tw][1][seg], scale_pair(sc[u][tw][1][seg]));
                        // A fragment: rows g (a) and g + 8 (a8), pairs (k0,k4) (k1,k5), then (k2,k6) (k3,k7).
                        const u32 first[4] = {a[0], a8[0], a[1], a8[1]}, second[4] = {a[2], a8[2], a[3], a8[3]};
                        float (&acc)[4] = EXACT ? ds[EXACT ? tw : 0][EXACT ? nt : 0] : d[tw][nt];
                        mma(acc, first, b[j][0], b[j][1]);
                        mma(acc, second, b[j][2], b[j][3]);
                    }
                }
            }
            if constexpr (EXACT) {  // D elements e: rows g (e < 2) and g + 8, each by its row's scale
#pragma unroll
                for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const u16 sv = sc[u][tw][e >> 1][0];
                            d[tw][nt][e] = fmaf(ds[tw][nt][e], scale_f(sv), d[tw][nt][e]);
                        }
            }
        }
    }
    I4_GRID_LAUNCH_DEPENDENTS();  // this block's loads are done: the next kernel may launch
    // d[tw][nt] = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]: tokens 8nt + 2t (+1), rows g (+8).
    if constexpr (KSPLIT == 1) {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int m = 8 * nt + 2 * t + (e & 1);
                    const long long r = row0 + 16 * tw + 8 * (e >> 1) + g;
                    if (m < M && r < N) y[(long long)m * N + r] = BF16 ? f_to_bf16(d[tw][nt][e]) : f_to_h(d[tw][nt][e]);
                }
    } else {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int m = 8 * nt + 2 * t + (e & 1);
                    if (m < M) partial[ks][m][16 * tw + 8 * (e >> 1) + g] = d[tw][nt][e];
                }
        __syncthreads();
        for (int i = threadIdx.x; i < M * ROWS_PER_BLOCK; i += BS) {
            const int m = i / ROWS_PER_BLOCK, r = i % ROWS_PER_BLOCK;
            if (row0 + r >= N) continue;
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < KSPLIT; ++k) sum += partial[k][m][r];
            y[(long long)m * N + row0 + r] = BF16 ? f_to_bf16(sum) : f_to_h(sum);
        }
    }
}
