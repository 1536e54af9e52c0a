// INT4 weight-only GEMM for prefill on Hopper (sm_90a: wgmma), the int4 weights read by the
// product itself (no dense copy of them):
//   y[m,n] = sum_k x[m,k] * (q[n,k] - z[n,k/g]) * s[n,k/g]       fp32 sums, y in fp16 or bf16
// Layout as the GEMV kernels take it (w uint8 [N, K/2], low nibble = even k; scales [N, K/g];
// zeros uint8 [N, K/g] or none), except x: the caller passes x' = x with each 128-element step
// of K permuted as the A fragments below make it (GemvWeights.matmul does it), [tokens, K].
//
// Work. A tile is ROWS = 64 * WGS weight rows by TOK tokens; the grid is persistent and walks
// the tiles (row tile major, so the token tiles of one row tile run together and read the
// weights from DRAM once). A block is WGS warpgroups, each owning 64 rows of the tile and the
// whole token range, D = 64 x TOK fp32 in registers (wgmma m64nTOKk16).
//
// Per step of 128 k:
//   - x' of the tile's tokens comes into a STAGES-deep shared-memory ring by cp.async, laid out
//     as wgmma's K-major B with the 128-byte swizzle (two 64-k halves of TOK rows x 128 bytes);
//   - each lane (warp w of its warpgroup, g = lane/4, t = lane%4) loads 16 bytes (32 k: chunk t
//     of the step) of rows 16w+g and 16w+g+8, PREFETCH steps ahead into registers, and makes
//     A = (q - z) * s rounded once to the activation type (the GEMV's SCALED path): the four
//     LOP3 pairs of a word give the A registers of two k16 blocks, k in the order
//     (k0,k4) (k1,k5) | (k2,k6) (k3,k7), which is what x' is permuted to;
//   - eight wgmma (A from registers, B from shared memory), committed and waited for.
// Epilogue: D to y (tokens past `tokens` are zero-filled on load and not stored).

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
constexpr int PROBE = ${PROBE};           // 0; 1: A constant (no dequantisation); 2: no wgmma               // steps of weights in flight in registers
constexpr int BS = 128 * WGS;
constexpr int ROWS = 64 * WGS;
constexpr int STEPS = K / 128;
constexpr int NG = K / GROUP;
constexpr long long ROW_TILES = N / ROWS;
constexpr int HALF_BYTES = TOK * 128;     // one 64-k half of a stage: TOK rows of 128 bytes
constexpr int STAGE_BYTES = 2 * HALF_BYTES;
constexpr int CHUNKS = TOK * 16;          // 16-byte pieces of x' in a stage
constexpr int ACC = TOK / 2;              // fp32 accumulators a thread
constexpr u32 MAGIC_1024 = 0x64006400u;
constexpr u32 SIXTEENTH = 0x2C002C00u;
constexpr u32 MAGIC_128 = 0x43004300u;
constexpr u32 BF2_ONES = 0x3F803F80u;

static_assert(K % 128 == 0, "the GEMM walks K in steps of 128");
static_assert(GROUP % 32 == 0, "a lane's 32 k of a step lie in one group");
static_assert(N % ROWS == 0, "whole row tiles");
static_assert(TOK == 64 || TOK == 128, "wgmma N of 64 or 128 tokens");
static_assert(CHUNKS % BS == 0, "every thread copies the same number of x' pieces");
static_assert(STAGES >= 3, "the ring holds the step in use, the one before (still read) and one in flight");

__device__ __forceinline__ float scale_f(u16 s) { return SCALE_BF16 ? bf16_to_f(s) : h_to_f(s); }
__device__ __forceinline__ u16 out_h(float f) { return BF16 ? f_to_bf16(f) : f_to_h(f); }
__device__ __forceinline__ u32 scale_pair(u16 s) {
    if constexpr (SCALE_BF16 == BF16) return s * 0x00010001u;
    return (BF16 ? f_to_bf16(scale_f(s)) : f_to_h(scale_f(s))) * 0x00010001u;
}

// -- Hopper primitives ------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory"); }
// cp.async writes through the generic proxy; wgmma reads shared memory through the async one.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory"); }
// Pin a register to this point: the asynchronous wgmma reads A and writes D behind the
// compiler's back, so neither may be moved across the wait.
__device__ __forceinline__ void keep(float& v) { asm volatile("" : "+f"(v)::"memory"); }
__device__ __forceinline__ void keep(u32 (&a)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
        asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3])::"memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long smem_desc(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// D (64 x TOK, fp32) += A (64 x 16, registers) * B (16 x TOK, shared memory).
__device__ __forceinline__ void wgmma_step(float (&d)[ACC], const u32 (&a)[4], unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %${ONE}, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n${TOK}k16.f32.${AB}.${AB} ${D_REGS}, {%${A0}, %${A1}, %${A2}, %${A3}}, %${DESC}, p, 1, 1, 0;\n}"
                 : ${D_OPERANDS}
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
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
// The pair (q_i, q_i+4) of a word, minus z, times s; i = 0..3.
__device__ __forceinline__ u32 a_pair(u32 q, int i, u32 zlo, u32 zhi, u32 s2) {
    if constexpr (BF16) {
        return scaled(bf2_fma(((q >> (4 * i)) & 0x000F000Fu) | MAGIC_128, BF2_ONES, zlo), s2);
    } else {
        const u32 qs = q >> (8 * (i / 2));
        return (i & 1) ? scaled(h2_fma((qs & 0x00F000F0u) | MAGIC_1024, SIXTEENTH, zhi), s2)
                       : scaled(h2_sub((qs & 0x000F000Fu) | MAGIC_1024, zlo), s2);
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
    if constexpr (PROBE == 1) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j][0] = a[j][1] = a[j][2] = a[j][3] = sw.q[0].x & 0x3C003C00u;
        return;
    }
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
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (smem_address(smem_raw) + 1023u) & ~1023u;  // the swizzle needs 1024-byte alignment
    const int tid = threadIdx.x;
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const long long token_tiles = (tokens + TOK - 1) / TOK;
    const long long tiles = ROW_TILES * token_tiles;

    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const long long rt = tile / token_tiles, tok0 = (tile % token_tiles) * TOK;
        const long long row0 = rt * ROWS + wg * 64 + warp * 16 + g;  // and row0 + 8

        // x' of step s into stage s % STAGES (zero-filled past the last token).
        auto copy_x = [&](int s) {
            const u32 base = smem + (u32)((s % STAGES) * STAGE_BYTES);
#pragma unroll
            for (int i = 0; i < CHUNKS / BS; ++i) {
                const int piece = tid + i * BS;
                const int r = piece / 16, half = (piece % 16) / 8, c = piece % 8;
                const bool live = tok0 + r < tokens;
                const u16* src = live ? x + (tok0 + r) * K + s * 128 + half * 64 + c * 8 : x;
                cp_async16(base + half * HALF_BYTES + r * 128 + ((c ^ (r & 7)) << 4), src, live ? 16u : 0u);
            }
        };
        auto load_w = [&](int s, StepWeights& sw) {
            const int gi = (s * 128 + 32 * t) / GROUP;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long row = row0 + 8 * h;
                sw.q[h] = load_stream16(w + row * (K / 2) + s * 64 + t * 16);
                sw.s[h] = load_cached_u16(scales + row * NG + gi);
                sw.z[h] = SYMMETRIC ? (u8)8 : load_cached_u8(zeros + row * NG + gi);
            }
        };

        float acc[ACC];
#pragma unroll
        for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
        StepWeights ring[PREFETCH];
#pragma unroll
        for (int s = 0; s < PREFETCH; ++s) {
            if (s < STEPS) load_w(s, ring[s]);
        }
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < STEPS) copy_x(s);
            cp_async_commit();
        }
        u32 a[2][4][4];  // the A of a half step (64 k), two in turn: one read by wgmma, one being made
        cp_async_wait<STAGES - 2>();
        fence_async_shared();
        __syncthreads();
        make_a(ring[0], 0, a[0]);

        for (int s0 = 0; s0 < STEPS; s0 += PREFETCH) {
#pragma unroll
            for (int u = 0; u < PREFETCH; ++u) {  // unrolled: the ring slot is a register, not memory
                const int s = s0 + u;
                if (s >= STEPS) break;
                const u32 base = smem + (u32)((s % STAGES) * STAGE_BYTES);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    wg_fence();
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        if constexpr (PROBE == 2) acc[j] += __uint_as_float(a[h][j][0] ^ a[h][j][3]);
                        else wgmma_step(acc, a[h][j], smem_desc(base + h * HALF_BYTES + j * 32));
                    }
                    wg_commit();
                    if (h == 1 && s + 1 == STEPS) break;
                    // The next half step's A is made while these run, once its buffer's readers
                    // (the half step before) are done.
                    wg_wait<1>();
                    keep(a[1 - h]);
                    if (h == 0) {
                        make_a(ring[u], 1, a[1]);
                        if (s + PREFETCH < STEPS) load_w(s + PREFETCH, ring[u]);
                    } else {
                        // Stage s + 1 landed (this thread's copies, then everyone's); every reader of
                        // stage s - 1 is done (each warpgroup waited for its half steps before this one).
                        cp_async_wait<STAGES - 3>();
                        fence_async_shared();
                        __syncthreads();
                        if (s + STAGES - 1 < STEPS) copy_x(s + STAGES - 1);
                        cp_async_commit();
                        make_a(ring[(u + 1) % PREFETCH], 0, a[0]);
                    }
                }
            }
        }
        wg_wait<0>();
#pragma unroll
        for (int i = 0; i < ACC; ++i) keep(acc[i]);
        keep(a[0]);
        keep(a[1]);

        // D: element i of a thread is row 16w + g + 8((i%4)/2), token 8(i/4) + 2t + i%2.
#pragma unroll
        for (int i = 0; i < ACC; ++i) {
            const long long tok = tok0 + 8 * (i / 4) + 2 * t + (i % 2);
            if (tok < tokens) y[tok * N + row0 + 8 * ((i % 4) / 2)] = out_h(acc[i]);
        }
        __syncthreads();  // the ring is refilled by the next tile
    }
}
