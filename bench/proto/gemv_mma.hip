// PROTOTYPE (not run yet; issue 4): the GEMV inner product on tensor cores.
// mma.sync.m16n8k16 f16 x f16 -> f32: A = (q - z) exact in fp16 (16 rows x 16 k-slots),
// B = x masked so column n holds only the k-slots of lane t = n: D[row][n] is then the
// partial sum of one 32-element chunk, scaled by that chunk's group after 8 (or 4, g=16)
// mmas. Exact products, fp32 sums, ~1.4 instructions per weight element (v2: ~3).
// Lane (g = lane/4, t = lane%4) streams rows g and g+8 of a 16-row tile, chunk 4*step + t.
// Needs K % 32 == 0. Block: WARPS warps = (WARPS / KSPLIT) row tiles x KSPLIT along K.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr int WARPS = ${WARPS};
constexpr int KSPLIT = ${KSPLIT};
constexpr int UNROLL = ${UNROLL};
constexpr int TILES = WARPS / KSPLIT;
constexpr int CHUNKS = K / 32;
constexpr int STEPS = (CHUNKS + 3) / 4;
constexpr int NG = K / GROUP;
constexpr long long ROW_BYTES = K / 2;
constexpr int FLUSH_WORDS = GROUP == 16 ? 2 : 4;  // words (8 elements) per scale group within a chunk
static_assert(K % 32 == 0, "prototype needs K % 32 == 0");
static_assert(WARPS % KSPLIT == 0, "KSPLIT must divide WARPS");

constexpr u32 MAGIC_1024 = 0x64006400u;
constexpr u32 SIXTEENTH = 0x2C002C00u;

__device__ __forceinline__ void zero_words(u32 z, u32& zlo, u32& zhi_neg) {
    zlo = (0x6400u | z) * 0x00010001u;
    zhi_neg = (0xD400u + (z << 4)) * 0x00010001u;
}

// one word (8 nibbles) -> (q-z) as fp16x2 pairs (k0,k4) (k1,k5) (k2,k6) (k3,k7), exact
__device__ __forceinline__ void dequant_word(u32 q, u32 zlo, u32 zhi_neg, u32 p[4]) {
    const u32 q2 = q >> 8;
    p[0] = h2_sub((q & 0x000F000Fu) | MAGIC_1024, zlo);
    p[1] = h2_fma((q & 0x00F000F0u) | MAGIC_1024, SIXTEENTH, zhi_neg);
    p[2] = h2_sub((q2 & 0x000F000Fu) | MAGIC_1024, zlo);
    p[3] = h2_fma((q2 & 0x00F000F0u) | MAGIC_1024, SIXTEENTH, zhi_neg);
}

__device__ __forceinline__ void mma16816(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
${KERNEL_NAME}(const u16* __restrict__ x, const u8* __restrict__ w, const u16* __restrict__ scales,
               const u8* __restrict__ zeros, u16* __restrict__ y) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int tile = warp / KSPLIT, ks = warp % KSPLIT;
    const long long row0 = ((long long)blockIdx.x * TILES + tile) * 16;
    const long long ra = row0 + g < N ? row0 + g : N - 1;
    const long long rb = row0 + g + 8 < N ? row0 + g + 8 : N - 1;
    float acc_a = 0.0f, acc_b = 0.0f;

    for (int s0 = ks; s0 < STEPS; s0 += KSPLIT * UNROLL) {
        u32 wa[UNROLL][4], wb[UNROLL][4];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = 4 * (s0 + u * KSPLIT) + t;
            if (s0 + u * KSPLIT < STEPS && c < CHUNKS) {
                const u32x4 va = load_stream16(w + ra * ROW_BYTES + 16LL * c);
                const u32x4 vb = load_stream16(w + rb * ROW_BYTES + 16LL * c);
                wa[u][0] = va.x; wa[u][1] = va.y; wa[u][2] = va.z; wa[u][3] = va.w;
                wb[u][0] = vb.x; wb[u][1] = vb.y; wb[u][2] = vb.z; wb[u][3] = vb.w;
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) wa[u][i] = wb[u][i] = 0x88888888u;  // q = z = 8: (q-z) = 0
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int step = s0 + u * KSPLIT;
            if (step >= STEPS) break;
            const int c = 4 * step + t;
            const bool mine = c < CHUNKS;
            // x of this lane's chunk, only in the lanes whose B column is this lane's t
            u32 xp[16];
            if (g == t && mine) {
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const u32x4 v = load_cached16(x + 32 * c + 8 * h);
                    xp[4 * h + 0] = (v.x & 0xFFFFu) | (v.z << 16);
                    xp[4 * h + 1] = (v.x >> 16) | (v.z & 0xFFFF0000u);
                    xp[4 * h + 2] = (v.y & 0xFFFFu) | (v.w << 16);
                    xp[4 * h + 3] = (v.y >> 16) | (v.w & 0xFFFF0000u);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) xp[i] = 0u;
            }
#pragma unroll
            for (int half = 0; half < 4 / FLUSH_WORDS; ++half) {
                const int gsub = (32 * (mine ? c : 0) + 8 * FLUSH_WORDS * half) / GROUP;
                u32 za = 8, zb = 8;
                if constexpr (!SYMMETRIC) {
                    if (mine) { za = zeros[ra * NG + gsub]; zb = zeros[rb * NG + gsub]; }
                }
                u32 zla, zha, zlb, zhb;
                zero_words(za, zla, zha);
                zero_words(zb, zlb, zhb);
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = half * FLUSH_WORDS; j < (half + 1) * FLUSH_WORDS; ++j) {
                    u32 pa[4], pb[4];
                    dequant_word(wa[u][j], zla, zha, pa);
                    dequant_word(wb[u][j], zlb, zhb, pb);
                    mma16816(d, pa[0], pb[0], pa[1], pb[1], xp[4 * j + 0], xp[4 * j + 1]);
                    mma16816(d, pa[2], pb[2], pa[3], pb[3], xp[4 * j + 2], xp[4 * j + 3]);
                }
                // d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]: column n = chunk 4*step + n
                if (t < 2) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int cn = 4 * step + 2 * t + e;
                        if (cn < CHUNKS) {
                            const int gi = (32 * cn + 8 * FLUSH_WORDS * half) / GROUP;
                            acc_a += d[e] * h_to_f(scales[ra * NG + gi]);
                            acc_b += d[2 + e] * h_to_f(scales[rb * NG + gi]);
                        }
                    }
                }
            }
        }
    }
    // lanes t = 0 and 1 hold the two halves of each row's sum; t = 2, 3 hold zeros
    acc_a += warp_xor(acc_a, 1);
    acc_b += warp_xor(acc_b, 1);
    __shared__ float partial[TILES][KSPLIT][16];
    if (t == 0) {
        partial[tile][ks][g] = acc_a;
        partial[tile][ks][g + 8] = acc_b;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TILES * 16; i += WARPS * 32) {
        const int tl = i / 16, r = i % 16;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < KSPLIT; ++k) sum += partial[tl][k][r];
        const long long row = ((long long)blockIdx.x * TILES + tl) * 16 + r;
        if (row < N) y[row] = f_to_h(sum);
    }
}
