// M=1 INT4 weight-only GEMV, one specialisation per (N, K, group, symmetric, BS, TN, arch):
//   y[n] = sum_k x[k] * (q[n,k] - z[n,k/g]) * s[n,k/g]     fp32 accumulate, fp16 or bf16 out
// Layout (ONNX Runtime MatMulNBits): w uint8 [N, K/2], low nibble = even k;
// scales fp16 or bf16 [N, K/g]; zeros uint8 [N, K/g] (absent when symmetric: zero point 8).
//
// A block of BS threads holds RG row groups of TN rows each. The KT threads of a row
// group walk K together, one VEC-byte weight load per row per step, coalesced along
// the row; each thread keeps TN fp32 sums, so its x values serve TN rows.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr bool BF16 = ${BF16};           // x and y in bf16 (else fp16)
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int BS = ${BS};
constexpr int TN = ${TN};
constexpr int KT = ${KT};                // threads along K in a row group
constexpr int RG = BS / KT;              // row groups per block
constexpr int ROWS_PER_BLOCK = RG * TN;
constexpr int VEC = ${VEC};              // weight bytes per load: 16, or 8 when K % 32 == 16
constexpr int CHUNK_ELEMS = 2 * VEC;     // K elements per load
constexpr int PIECES = VEC / 8;          // 16-element pieces per load; a piece never spans groups
constexpr int CHUNKS = K / CHUNK_ELEMS;  // loads per row
constexpr int ITERS = (CHUNKS + KT - 1) / KT;
constexpr int UNROLL = ${UNROLL};        // load steps issued before the first use
constexpr int NG = K / GROUP;
constexpr long long ROW_BYTES = K / 2;

static_assert(BS % KT == 0, "KT must divide BS");
static_assert(K % CHUNK_ELEMS == 0, "K must be a multiple of the load width");
static_assert(GROUP % 16 == 0, "a 16-element piece must lie inside one group");

constexpr u32 MAGIC_1024 = 0x64006400u;  // fp16 1024.0 in both halves
constexpr u32 SIXTEENTH = 0x2C002C00u;   // fp16 0.0625 in both halves

// Zero point z as the two fp16x2 words the nibble trick subtracts:
// (1024 + z) for low nibbles, -(64 + z) for high nibbles (scaled by 1/16 first).
__device__ __forceinline__ void zero_words(u32 z, u32& zlo, u32& zhi_neg) {
    zlo = (0x6400u | z) * 0x00010001u;
    zhi_neg = (0xD400u + (z << 4)) * 0x00010001u;
}

// 8 nibbles of one 32-bit word (k0..k7, k0 in the lowest bits) against x paired as
// (x0,x4) (x1,x5) (x2,x6) (x3,x7): OR-ing a nibble into the mantissa of 1024 gives
// 1024 + q exactly, so q - z comes out of one subtraction with no conversion.
__device__ __forceinline__ dot_acc_t dot8(dot_acc_t a, u32 q, u32 zlo, u32 zhi_neg,
                                          u32 x04, u32 x15, u32 x26, u32 x37) {
    const u32 q2 = q >> 8;
    const u32 lo0 = (q & 0x000F000Fu) | MAGIC_1024;   // (k0, k4)
    const u32 hi0 = (q & 0x00F000F0u) | MAGIC_1024;   // 16 * (k1, k5)
    const u32 lo1 = (q2 & 0x000F000Fu) | MAGIC_1024;  // (k2, k6)
    const u32 hi1 = (q2 & 0x00F000F0u) | MAGIC_1024;  // 16 * (k3, k7)
    a = dot2(a, h2_sub(lo0, zlo), x04);
    a = dot2(a, h2_fma(hi0, SIXTEENTH, zhi_neg), x15);
    a = dot2(a, h2_sub(lo1, zlo), x26);
    a = dot2(a, h2_fma(hi1, SIXTEENTH, zhi_neg), x37);
    return a;
}

// bf16 x: one 16-element piece of a row (two words of 8 nibbles, k0 lowest) against x0..x15 in
// fp32. The float with bits 0x4B000000 | (q & 0xF << 4i) is 2^23 + 16^i q exactly (nibble i left
// where it is; the high half-word is shifted down once), so one subtraction of 2^23 + 16^i z
// gives 16^i (q - z). Nibble position i sums into its own accumulator (four independent FMA
// chains), scaled by 16^-i at the end (exact).
__device__ __forceinline__ float dot16_bf16(u32 q0, u32 q1, u32 z, const float (&xf)[16]) {
    float bias[4], acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) bias[i] = bits_to_f(0x4B000000u | (z << (4 * i)));
#pragma unroll
    for (int h = 0; h < 4; ++h) {  // half-words: word h/2, nibbles 4(h%2) .. 4(h%2) + 3
        const u32 q = h % 2 ? (h < 2 ? q0 : q1) >> 16 : (h < 2 ? q0 : q1);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            acc[i] = fma_f32(bits_to_f(0x4B000000u | (q & (0xFu << (4 * i)))) - bias[i], xf[4 * h + i], acc[i]);
    }
    return fma_f32(acc[3], 1.0f / 4096, fma_f32(acc[2], 1.0f / 256, fma_f32(acc[1], 1.0f / 16, acc[0])));
}

// x words (x0x1, x2x3, x4x5, x6x7) regrouped into the nibble trick's pairs.
__device__ __forceinline__ void pair_x(u32x4 v, u32 p[4]) {
    p[0] = (v.x & 0xFFFFu) | (v.z << 16);
    p[1] = (v.x >> 16) | (v.z & 0xFFFF0000u);
    p[2] = (v.y & 0xFFFFu) | (v.w << 16);
    p[3] = (v.y >> 16) | (v.w & 0xFFFF0000u);
}

__device__ __forceinline__ float scale_f(u16 s) { return SCALE_BF16 ? bf16_to_f(s) : h_to_f(s); }
__device__ __forceinline__ u16 out_h(float f) { return BF16 ? f_to_bf16(f) : f_to_h(f); }

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    I4_GRID_WAIT();  // PDL (sm_90): the previous kernel's writes (x) are visible after this
    const int tid = threadIdx.x;
    const int lane = tid % KT;
    const int rg = tid / KT;
    const long long row0 = (long long)blockIdx.x * ROWS_PER_BLOCK + (long long)rg * TN;

    // Rows past N read row N-1 (always valid) and are never stored.
    long long rows[TN];
#pragma unroll
    for (int r = 0; r < TN; ++r) rows[r] = row0 + r < N ? row0 + r : N - 1;

    float acc[TN];
#pragma unroll
    for (int r = 0; r < TN; ++r) acc[r] = 0.0f;

    for (int i0 = 0; i0 < ITERS; i0 += UNROLL) {
        u32 wq[UNROLL][TN][VEC / 4];
        u16 sc[UNROLL][TN][PIECES];
        u8 zp[UNROLL][TN][PIECES];
        u32 xw[UNROLL][VEC];          // CHUNK_ELEMS halves = VEC words
        // Issue every load of this step before using any of them.
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            int c = lane + (i0 + u) * KT;
            c = c < CHUNKS ? c : CHUNKS - 1;
            const int k0 = c * CHUNK_ELEMS;
#pragma unroll
            for (int h = 0; h < VEC / 4; ++h) {
                const u32x4 v = load_cached16(x + k0 + 8 * h);
                xw[u][4 * h + 0] = v.x; xw[u][4 * h + 1] = v.y;
                xw[u][4 * h + 2] = v.z; xw[u][4 * h + 3] = v.w;
            }
#pragma unroll
            for (int r = 0; r < TN; ++r) {
                const u8* p = w + rows[r] * ROW_BYTES + (long long)c * VEC;
                if constexpr (VEC == 16) {
                    const u32x4 v = load_stream16(p);
                    wq[u][r][0] = v.x; wq[u][r][1] = v.y; wq[u][r][2] = v.z; wq[u][r][3] = v.w;
                } else {
                    const u32x2 v = load_stream8(p);
                    wq[u][r][0] = v.x; wq[u][r][1] = v.y;
                }
#pragma unroll
                for (int pc = 0; pc < PIECES; ++pc) {
                    const long long gi = rows[r] * NG + (k0 + 16 * pc) / GROUP;
                    sc[u][r][pc] = load_cached_u16(scales + gi);
                    if constexpr (!SYMMETRIC) zp[u][r][pc] = load_cached_u8(zeros + gi);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (i0 + u >= ITERS || lane + (i0 + u) * KT >= CHUNKS) continue;
            u32 xp[VEC];
            float xf[BF16 ? PIECES : 1][16];  // bf16: x in fp32, shared by the TN rows
#pragma unroll
            for (int h = 0; h < VEC / 4 && !BF16; ++h) {
                const u32x4 v = {xw[u][4 * h], xw[u][4 * h + 1], xw[u][4 * h + 2], xw[u][4 * h + 3]};
                pair_x(v, xp + 4 * h);
            }
#pragma unroll
            for (int i = 0; i < (BF16 ? 2 * VEC : 0); ++i) xf[i / 16][i % 16] = bf16_to_f((u16)(xw[u][i / 2] >> (16 * (i % 2))));
#pragma unroll
            for (int r = 0; r < TN; ++r) {
#pragma unroll
                for (int pc = 0; pc < PIECES; ++pc) {
                    if constexpr (BF16) {
                        const u32 z = SYMMETRIC ? 8u : (u32)zp[u][r][pc];
                        acc[r] += dot16_bf16(wq[u][r][2 * pc], wq[u][r][2 * pc + 1], z, xf[BF16 ? pc : 0]) * scale_f(sc[u][r][pc]);
                        continue;
                    }
                    u32 zlo, zhi_neg;
                    zero_words(SYMMETRIC ? 8u : (u32)zp[u][r][pc], zlo, zhi_neg);
                    dot_acc_t a = dot_zero();
                    a = dot8(a, wq[u][r][2 * pc], zlo, zhi_neg,
                             xp[8 * pc + 0], xp[8 * pc + 1], xp[8 * pc + 2], xp[8 * pc + 3]);
                    a = dot8(a, wq[u][r][2 * pc + 1], zlo, zhi_neg,
                             xp[8 * pc + 4], xp[8 * pc + 5], xp[8 * pc + 6], xp[8 * pc + 7]);
                    acc[r] += dot_finish(a) * scale_f(sc[u][r][pc]);
                }
            }
        }
    }

    I4_GRID_LAUNCH_DEPENDENTS();  // this block's loads are done: the next kernel may launch
    // Sum each row over the KT threads of its group: shuffles inside a warp,
    // then shared memory across the warps of a group.
    constexpr int SHUFFLE_SPAN = KT < I4_WARP ? KT : I4_WARP;
#pragma unroll
    for (int r = 0; r < TN; ++r) {
#pragma unroll
        for (int m = SHUFFLE_SPAN / 2; m >= 1; m /= 2) acc[r] += warp_xor(acc[r], m);
    }
    if constexpr (KT <= I4_WARP) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < TN; ++r)
                if (row0 + r < N) y[row0 + r] = out_h(acc[r]);
        }
    } else {
        constexpr int WARPS_PER_GROUP = KT > I4_WARP ? KT / I4_WARP : 1;
        __shared__ float partial[RG][WARPS_PER_GROUP][TN];
        if (lane % I4_WARP == 0) {
#pragma unroll
            for (int r = 0; r < TN; ++r) partial[rg][lane / I4_WARP][r] = acc[r];
        }
        __syncthreads();
        for (int t = tid; t < ROWS_PER_BLOCK; t += BS) {
            const int g = t / TN, r = t % TN;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < WARPS_PER_GROUP; ++i) s += partial[g][i][r];
            const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + t;
            if (row < N) y[row] = out_h(s);
        }
    }
}
