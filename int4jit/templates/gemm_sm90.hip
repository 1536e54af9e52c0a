// INT4 weight-only GEMM for prefill on Hopper (sm_90a: wgmma), the int4 weights read by the
// product itself (no dense copy of them):
//   y[m,n] = sum_k x[m,k] * (q[n,k] - z[n,k/g]) * s[n,k/g]       fp32 sums, y in fp16 or bf16
// Layout as the GEMV kernels take it (w uint8 [N, K/2], low nibble = even k; scales [N, K/g];
// zeros uint8 [N, K/g] or none), except x: the caller passes x' (GemvWeights.matmul makes it).
//
// x' (templates/xperm.hip) is x laid out as this kernel's shared memory wants it: per token tile
// of TOK rows (zero rows past the last token) and step of 128 k, one STAGE_BYTES block holding
// two 64-k halves of TOK rows x 128 bytes, k in the order the A fragments take it and the
// 16-byte chunks of each row swizzled (wgmma's K-major B, 128-byte swizzle). So a stage is one
// bulk copy (cp.async.bulk, the async proxy: no per-thread copies, no proxy fence).
//
// Work. A tile is ROWS = 64 * WGS weight rows by TOK tokens; a unit is one step (128 k) of a
// tile. The grid is persistent (G blocks, one an SM) and walks the tiles in row tile major order,
// so the token tiles of one row tile run together and read the weights from DRAM once:
//   - whole waves, data-parallel: block b takes tiles b, b + G, ... for all but the last one to
//     two waves' worth (tiles - G - tiles % G of them); where tiles <= G, all of them if they
//     fill at least 3/4 of the grid (one wave; cutting 128 tiles on 132 SMs measured 3-15% slower),
//     else none;
//   - the rest, stream-K: its units split evenly, block b taking [b U / G, (b+1) U / G) of the U
//     left, so every SM ends at the same time (448 tiles on 132 SMs would leave a last wave 39%
//     full; 32 tiles, as k/v at 512 tokens, would leave 100 SMs idle while 32 walk all of K).
//     Cutting only the last waves keeps the data-parallel part's weight reuse (cutting
//     them all measured slower: a block's tiles then run at other times than their row tile's).
// A block is WGS warpgroups (3 where N allows, else 2: spec.gemm_rows), each owning 64 rows of
// the tile and the whole token range, D = 64 x TOK fp32 in registers (wgmma m64nTOKk16). A tile
// cut between blocks: the block whose range ends inside it writes its D to its slot of the
// partial sums (after x' in the caller's workspace) and raises its flag; the block holding the
// tile's last step does that segment last of all, waits for the flags of the earlier blocks that
// hold the rest, adds their D (highest block first: deterministic) and stores y. A block waits
// only for lower-numbered blocks, which the GPU started before it and which raise their flag
// before they wait themselves: no cycle, and no wait on a block that a waiting one keeps off the
// GPU (as where MPS or another kernel leaves fewer SMs than blocks). The flags are zeroed by
// xperm.hip.
//
// Per step of 128 k:
//   - thread 0 fills the STAGES-deep ring: it waits until every warpgroup has released the stage
//     (mbarrier `empty`), then one bulk copy whose bytes complete mbarrier `full`;
//   - each lane (warp w of its warpgroup, g = lane/4, t = lane%4) loads 16 bytes (32 k: chunk t
//     of the step) of rows 16w+g and 16w+g+8, PREFETCH steps ahead into registers, and makes
//     A = (q - z) * s rounded once to the activation type (the GEMV's SCALED path): the four
//     LOP3 pairs of a word give the A registers of two k16 blocks, k in the order
//     (k0,k4) (k1,k5) | (k2,k6) (k3,k7);
//   - per half step, four wgmma (A from registers, B from shared memory); the next half step's A
//     is made while they run.
// Epilogue: D to y (tokens past `tokens` are not stored), or to the partial sums.
//
// Launched with PDL after the x layout kernel (which lets it launch at its start): a block loads
// its first segment's weights (fixed while in use: GemvWeights) before griddepcontrol.wait, and
// reads nothing that kernel writes (x', the flags) and writes nothing before it.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr bool BF16 = ${BF16};            // x, y and the products in bf16 (else fp16)
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int TOK = ${TOK};               // tokens a tile (wgmma N)
constexpr int WGS = ${WGS};               // warpgroups a block (64 rows each)
constexpr int STAGES = ${STAGES};         // x' ring depth
constexpr int PREFETCH = 2;
constexpr int BS = 128 * WGS;
constexpr int ROWS = 64 * WGS;
constexpr int STEPS = K / 128;
constexpr int NG = K / GROUP;
constexpr long long ROW_TILES = N / ROWS;
constexpr int HALF_BYTES = TOK * 128;     // one 64-k half of a stage: TOK rows of 128 bytes
constexpr int STAGE_BYTES = 2 * HALF_BYTES;
constexpr int ACC = TOK / 2;              // fp32 accumulators a thread
constexpr int PARTIAL_BYTES = ${PARTIAL_BYTES};  // a block's slot of the partial sums (sized for 3 warpgroups)
static_assert(PARTIAL_BYTES >= BS * ACC * 4, "a block's slot of the partial sums holds every thread's D");
constexpr u32 MAGIC_1024 = 0x64006400u;
constexpr u32 SIXTEENTH = 0x2C002C00u;
constexpr u32 MAGIC_128 = 0x43004300u;
constexpr u32 BF2_ONES = 0x3F803F80u;

static_assert(K % 128 == 0, "the GEMM walks K in steps of 128");
static_assert(GROUP % 32 == 0, "a lane's 32 k of a step lie in one group");
static_assert(N % ROWS == 0, "whole row tiles");
static_assert(TOK == 128, "wgmma m64n128k16 (prelude): 128 tokens a tile");
static_assert(STAGES >= 3, "the ring holds the step in use, the one before (still read) and one in flight");

__device__ __forceinline__ float scale_f(u16 s) { return SCALE_BF16 ? bf16_to_f(s) : h_to_f(s); }
__device__ __forceinline__ u16 out_h(float f) { return BF16 ? f_to_bf16(f) : f_to_h(f); }
__device__ __forceinline__ u32 scale_pair(u16 s) {
    if constexpr (SCALE_BF16 == BF16) return s * 0x00010001u;
    return (BF16 ? f_to_bf16(scale_f(s)) : f_to_h(scale_f(s))) * 0x00010001u;
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long smem_desc(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// -- A fragments ------------------------------------------------------------------------------
// The zero point as the words that turn (1024 + q) / (1024 + 16q) pairs into q - z (fp16), or
// -(128 + z) for the (128 + q) pairs (bf16).
__device__ __forceinline__ void zero_words(u32 z, u32& zlo, u32& zhi) {
    if constexpr (BF16) {
        zlo = zhi = (0xC300u | z) * 0x00010001u;
    } else {
        zlo = (0x6400u | z) * 0x00010001u;
        zhi = (0xD400u + (z << 4)) * 0x00010001u;
    }
}
__device__ __forceinline__ u32 scaled(u32 a, u32 s2) {
    return BF16 ? bf2_fma(a, s2, 0x80008000u) : h2_fma(a, s2, 0x80008000u);
}
// The nibble masks live in constant memory: LOP3 reads one operand from there, so no register
// holds (or is re-loaded with) a 32-bit constant per use (as in gemv_tc.hip).
__constant__ u32 NIBBLE_MASK[2] = {0x000F000Fu, 0x00F000F0u};

// The pair (q_i, q_i+4) of a word, minus z, times s; i = 0..3.
__device__ __forceinline__ u32 a_pair(u32 q, int i, u32 zlo, u32 zhi, u32 s2) {
    if constexpr (BF16) {
        return scaled(bf2_fma(((q >> (4 * i)) & NIBBLE_MASK[0]) | MAGIC_128, BF2_ONES, zlo), s2);
    } else {
        const u32 qs = q >> (8 * (i / 2));
        return (i & 1) ? scaled(h2_fma((qs & NIBBLE_MASK[1]) | MAGIC_1024, SIXTEENTH, zhi), s2)
                       : scaled(h2_sub((qs & NIBBLE_MASK[0]) | MAGIC_1024, zlo), s2);
    }
}

struct StepWeights {
    u32x4 q[2];     // rows 16w+g and 16w+g+8: 32 k each
    u16 s[2];
    u8 z[2];
};

// A of half step `half` (k16 blocks 4 half .. 4 half + 3: words 2 half and 2 half + 1 of each row;
// block j takes pairs 2(j%2), 2(j%2)+1 of word j/2).
__device__ __forceinline__ void make_a(const StepWeights& sw, int half, u32 (&a)[4][4]) {
    u32 z0lo, z0hi, z1lo, z1hi;
    zero_words(sw.z[0], z0lo, z0hi);
    zero_words(sw.z[1], z1lo, z1hi);
    const u32 sc0 = scale_pair(sw.s[0]), sc1 = scale_pair(sw.s[1]);
    const u32 q0[4] = {sw.q[0].x, sw.q[0].y, sw.q[0].z, sw.q[0].w};
    const u32 q1[4] = {sw.q[1].x, sw.q[1].y, sw.q[1].z, sw.q[1].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int wd = 2 * half + j / 2, i = 2 * (j % 2);
        a[j][0] = a_pair(q0[wd], i, z0lo, z0hi, sc0);
        a[j][1] = a_pair(q1[wd], i, z1lo, z1hi, sc1);
        a[j][2] = a_pair(q0[wd], i + 1, z0lo, z0hi, sc0);
        a[j][3] = a_pair(q1[wd], i + 1, z1lo, z1hi, sc1);
    }
}

extern "C" __global__ void __launch_bounds__(BS, 1)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y, long long tokens) {
    DYNAMIC_SMEM(smem_raw);
    // The ring (1024-byte aligned for the swizzle), then the full and empty mbarriers of each stage.
    const u32 ring = (smem_address(smem_raw) + 1023u) & ~1023u;
    const u32 full_bar = ring + STAGES * STAGE_BYTES, empty_bar = full_bar + 8 * STAGES;
    const int tid = threadIdx.x;
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const long long token_tiles = (tokens + TOK - 1) / TOK;
    const long long tiles = ROW_TILES * token_tiles;
    if (tid == 0) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) {
            mbar_init(full_bar + 8 * k, 1);
            mbar_init(empty_bar + 8 * k, WGS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    // Steps are counted over the block's segments: its n-th step uses stage n % STAGES for the
    // (n / STAGES)-th time, which is the parity its mbarriers are waited on with.
    const long long G = gridDim.x;
    const long long dp_tiles = tiles > G ? tiles - G - tiles % G : 4 * tiles >= 3 * G ? tiles : 0;
    const long long sk_units = (tiles - dp_tiles) * STEPS;
    auto first_unit = [&](long long b) { return dp_tiles * STEPS + b * sk_units / G; };
    long long dp_tile = blockIdx.x, u = first_unit(blockIdx.x), u_end = first_unit(blockIdx.x + 1);
    // Where the range starts inside a tile, that first segment waits for earlier blocks: it goes last.
    long long tail = u, tail_end = u % STEPS ? min(u_end, (u / STEPS + 1) * STEPS) : u;
    u = tail_end;
    float4* const partial = (float4*)((const char*)x + token_tiles * STEPS * (long long)STAGE_BYTES);
    unsigned* const flags = (unsigned*)((char*)partial + G * PARTIAL_BYTES);
    unsigned long long n0 = 0;
    for (;;) {  // a segment [sb, se) of a tile's steps
        long long tile;
        int sb = 0, se = STEPS;
        if (dp_tile < dp_tiles) {
            tile = dp_tile;
            dp_tile += G;
        } else if (u < u_end) {
            tile = u / STEPS;
            sb = (int)(u % STEPS);
            se = (int)min((long long)STEPS, sb + (u_end - u));
            u += se - sb;
        } else if (tail < tail_end) {
            tile = tail / STEPS;
            sb = (int)(tail % STEPS);
            se = (int)(tail_end - tile * STEPS);
            tail = tail_end;
        } else {
            break;
        }
        const long long nb = (long long)n0 - sb;  // step s of this segment is the block's step nb + s
        n0 += se - sb;
        const long long rt = tile / token_tiles, tt = tile % token_tiles, tok0 = tt * TOK;
        const long long row0 = rt * ROWS + wg * 64 + warp * 16 + g;  // and row0 + 8
        const char* xtile = (const char*)x + tt * (long long)(STEPS * STAGE_BYTES);

        // Thread 0: step s of this tile into its stage, once the stage's last readers are done.
        auto fill = [&](int s) {
            const unsigned long long n = nb + s;
            const u32 k = (u32)(n % STAGES);
            if (n >= STAGES) mbar_wait(empty_bar + 8 * k, (u32)((n / STAGES - 1) & 1));
            bulk_copy(ring + k * STAGE_BYTES, xtile + (long long)s * STAGE_BYTES, STAGE_BYTES, full_bar + 8 * k);
        };
        // A warpgroup is done with step s: one lane of it says so.
        auto release = [&](int s) {
            if (tid % 128 == 0) mbar_arrive(empty_bar + 8 * (u32)((nb + s) % STAGES));
        };
        auto wait_full = [&](int s) {
            const unsigned long long n = nb + s;
            mbar_wait(full_bar + 8 * (u32)(n % STAGES), (u32)((n / STAGES) & 1));
        };
        // The lane's weights of rows row0 and row0 + 8 (32 k at t), and their groups' scales and zeros.
        const u8* wrow = w + row0 * (K / 2) + t * 16;
        const long long grow = row0 * NG;
        auto load_w = [&](int s, StepWeights& sw) {
            const int gi = (s * 128 + 32 * t) / GROUP;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sw.q[h] = load_stream16(wrow + h * 8 * (K / 2) + s * 64);
                sw.s[h] = load_cached_u16(scales + grow + h * 8 * NG + gi);
                sw.z[h] = SYMMETRIC ? (u8)8 : load_cached_u8(zeros + grow + h * 8 * NG + gi);
            }
        };

        float acc[ACC];
#pragma unroll
        for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
        StepWeights wring[PREFETCH];
#pragma unroll
        for (int p = 0; p < PREFETCH; ++p) {
            if (sb + p < se) load_w(sb + p, wring[p]);
        }
        I4_GRID_WAIT();  // PDL: x' and the flags are the x layout kernel's writes (a no-op after the first)
        if (tid == 0) {
#pragma unroll
            for (int p = 0; p < STAGES - 1; ++p) {
                if (sb + p < se) fill(sb + p);
            }
        }
        u32 a[2][4][4];  // the A of a half step (64 k), two in turn: one read by wgmma, one being made
        make_a(wring[0], 0, a[0]);
        wait_full(sb);

        for (int s0 = sb; s0 < se; s0 += PREFETCH) {
#pragma unroll
            for (int p = 0; p < PREFETCH; ++p) {  // unrolled: the weight slot is a register, not memory
                const int s = s0 + p;
                if (s >= se) break;
                const u32 base = ring + (u32)(((nb + s) % STAGES) * STAGE_BYTES);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    wg_fence();
#pragma unroll
                    for (int j = 0; j < 4; ++j) wgmma_m64n128k16<BF16>(acc, a[h][j], smem_desc(base + h * HALF_BYTES + j * 32));
                    wg_commit();
                    if (h == 1 && s + 1 == se) break;
                    // The half step before this one is done: its A buffer is free (and, at h == 0,
                    // step s - 1's stage); the next half step's A is made while these run.
                    wg_wait<1>();
                    keep(a[1 - h]);
                    if (h == 0) {
                        if (s > sb) release(s - 1);
                        if (tid == 0 && s + STAGES - 1 < se) fill(s + STAGES - 1);
                        make_a(wring[p], 1, a[1]);
                        if (s + PREFETCH < se) load_w(s + PREFETCH, wring[p]);
                    } else {
                        make_a(wring[(p + 1) % PREFETCH], 0, a[0]);
                        wait_full(s + 1);
                    }
                }
            }
        }
        wg_wait<0>();
        release(se - 1);
#pragma unroll
        for (int i = 0; i < ACC; ++i) keep(acc[i]);
        keep(a[0]);
        keep(a[1]);

        // Element i of a thread's D is row 16w + g + 8((i%4)/2), token 8(i/4) + 2t + i%2; in the
        // partial sums, float4 i/4 of thread tid is at [i/4][tid] (coalesced).
        if (se < STEPS) {  // a tile's steps before the last: a later block adds this partial D
            float4* mine = partial + (long long)blockIdx.x * (PARTIAL_BYTES / 16) + tid;
#pragma unroll
            for (int i = 0; i < ACC; i += 4) mine[(i / 4) * BS] = float4{acc[i], acc[i + 1], acc[i + 2], acc[i + 3]};
            __threadfence();
            __syncthreads();
            if (tid == 0) flag_raise(flags + blockIdx.x);
            continue;
        }
        if (sb > 0) {  // the tile's last steps: the earlier blocks whose ranges end inside it hold the rest
            const long long tile_begin = tile * STEPS;
            for (long long b = blockIdx.x - 1; b >= 0 && first_unit(b + 1) > tile_begin; --b) {
                if (first_unit(b) == first_unit(b + 1)) continue;  // no units, no partial
                if (tid == 0) flag_wait(flags + b);
                __syncthreads();
                const float4* theirs = partial + b * (PARTIAL_BYTES / 16) + tid;
#pragma unroll
                for (int i = 0; i < ACC; i += 4) {
                    const float4 v = __ldcg(theirs + (i / 4) * BS);
                    acc[i] += v.x;
                    acc[i + 1] += v.y;
                    acc[i + 2] += v.z;
                    acc[i + 3] += v.w;
                }
            }
        }

#pragma unroll
        for (int i = 0; i < ACC; ++i) {
            const long long tok = tok0 + 8 * (i / 4) + 2 * t + (i % 2);
            if (tok < tokens) y[tok * N + row0 + 8 * ((i % 4) / 2)] = out_h(acc[i]);
        }
    }
}
