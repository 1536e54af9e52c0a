// INT4 weight-only GEMV on tensor cores (NVIDIA sm_80+, mma.sync m16n8k16 f16/bf16 -> f32).
//   y[m,n] = sum_k x[m,k] * (q[n,k] - z[n,k/g]) * s[n,k/g]     exact products, fp32 sums
// 1..8 tokens (M), x and y in fp16 or bf16 (BF16), scales in either (SCALE_BF16).
// Layout (ONNX Runtime MatMulNBits): w uint8 [N, K/2], low nibble = even k; scales [N, K/g];
// zeros uint8 [N, K/g] (absent when symmetric: zero point 8); x [M, K]; y [M, N]. K % 32 == 0.
//
// Work split. A block of KSPLIT warps owns TW tiles of 16 rows; its warps split K by steps of
// 128 elements. In a step, lane (g = lane/4, t = lane%4) reads 32-element chunk 4*step + t of
// rows g and g+8 of each tile (one 16-byte load per row) and the matching 64 bytes of x.
//
// Arithmetic per 32-bit word of 8 nibbles: four LOP3s give (1024+q) / (1024+16q) pairs, one
// fp16 subtraction (or FMA by 1/16) each makes q - z exactly, and two mma steps multiply them
// into fp32 with x (A = weights: rows g/g+8; B = x pairs). Products are exact, sums are fp32.
// bf16 (7 mantissa bits) makes 128 + q from each nibble shifted down, and one bf16 FMA q - z.
// Which B lanes carry x decides what D holds:
//   GROUP >= 128: every lane (lane group g: token g), so D column m sums the four chunks of the
//                 step (one group) for token m -> scale once.
//   GROUP <  128: only lane (g == t), so D column n holds chunk n alone (the diagonal trick)
//                 and each chunk (or half chunk, GROUP 16) is scaled on its own. One token.
//   SCALED (GROUP < 128, several tokens): every lane, and A = (q - z) * s rounded once to the
//                 activation type (~2^-11 relative a weight in fp16, 2^-8 in bf16), so D column m
//                 is token m's sum over K with no scaling after the mma.
//
// STREAMING (the variant field `streaming`): each load slot is refilled with the next batch's data
// as soon as its mma steps are issued, so loads stay in flight while the warp computes; x is
// staged in shared memory (XSMEM, where it fits); weight misses ask L2 for 256-byte fetches.
//
// RAW_A: A is the raw (1024 + q) / (64 + q) pairs the LOP3s make (no subtraction), so
// D = sum x q + 1024 sum x_even + 64 sum x_odd over the group or chunk. The offsets are the same
// for every row: a second mma per step with a constant A (1024 / 64 on rows g, 1 on rows g+8)
// gives C = 1024 sum x_even + 64 sum x_odd and S = sum x in every lane, and the fold takes
// D - C - z S. Exact products still; the sums lose ~7 bits of fp32 to the 1024 offset. bf16:
// A = 128 + q on both nibbles, C = 128 S. One token only (C and S are per token).
// XPERM: x is staged in shared memory already paired as the mma's B wants it (no PRMT per step).
// XAHEAD (the variant field `xahead`, several tokens): a warp's next step's x is loaded into
// registers while this step computes, instead of at the top of the step that uses it.
// WIDE_SCALES: on the diagonal, a lane folds two adjacent chunks of a row; with whole steps their
// scales are adjacent (and aligned) in the row, so they come in one load (docs/performance.md).
//
// PDL (sm_90): the kernel may start while the previous one drains; it asks L2 for its first
// PREFETCH batches of weights (no predecessor writes them; a prefetch returns no data, so nothing
// stale can be read), waits for the previous grid before any load, and lets the next kernel
// launch once its own loads are done.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr int M = ${M};                  // tokens
constexpr bool BF16 = ${BF16};           // x, y and the mma in bf16 (else fp16)
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int KSPLIT = ${KSPLIT};        // warps of a block; they split K
constexpr int KC = ${KCLUSTER};          // blocks of a cluster that split one row block's K (sm_90)
constexpr int KSPLIT_ALL = KSPLIT * KC;  // warps that split one row block's K
constexpr int TW = ${TW};                // 16-row tiles per warp
constexpr int UNROLL = ${UNROLL};        // steps whose loads are in flight together
constexpr bool CONTIG = ${CONTIG};       // a warp takes a contiguous range of steps (else every KSPLIT_ALL-th)
constexpr bool STREAMING = ${STREAMING}; // reload each load slot as soon as it is used; 256-byte L2 fetches
constexpr bool XSMEM = ${XSMEM};         // x staged in shared memory once per block (else read per step)
constexpr bool RAW_A = ${RAW_A};         // A = 1024 + q / 64 + q; the offsets come off after the mma
constexpr bool XPERM = XSMEM;            // staged x is already paired for B
constexpr bool XWARP = XSMEM && !RAW_A;  // each warp stages its own steps' x, before its weights
constexpr int PREFETCH = ${PREFETCH};    // batches of weights asked into L2 before the grid-dependency wait
constexpr bool EARLY = ${EARLY};         // first weights loaded before the wait; dependents launched at start
constexpr bool XAHEAD = ${XAHEAD};       // several tokens: x of a warp's next step loaded while this one computes
constexpr bool DIAG = GROUP < 128 && M == 1;    // the diagonal trick (one token)
constexpr bool SCALED = GROUP < 128 && M > 1;   // A = (q - z) * s (several tokens)
// On the diagonal with whole steps, a lane's two chunks' scales of a row are adjacent: one load.
constexpr bool WIDE_SCALES = DIAG && K % 128 == 0;
static_assert(!XSMEM || STREAMING, "x is staged in shared memory on streaming builds only");
static_assert(!EARLY || STREAMING, "early loads are the streaming build's first batch");
constexpr int BS = 32 * KSPLIT;
constexpr int ROWS_PER_BLOCK = 16 * TW;
constexpr int CHUNKS = K / 32;           // 16-byte loads per row
constexpr int STEPS = (CHUNKS + 3) / 4;  // 128 elements per step
constexpr int WARP_STEPS = (STEPS + KSPLIT_ALL - 1) / KSPLIT_ALL;
constexpr int STEP_STRIDE = CONTIG ? 1 : KSPLIT_ALL;  // between a warp's consecutive steps
constexpr int NG = K / GROUP;
constexpr long long ROW_BYTES = K / 2;
constexpr int SEGS = GROUP == 16 ? 2 : 1;          // groups per chunk
constexpr int SEG_WORDS = 4 / SEGS;                // 8-element words per group segment
constexpr u32 MAGIC_1024 = 0x64006400u;            // fp16 1024.0 in both halves
constexpr u32 SIXTEENTH = 0x2C002C00u;             // fp16 0.0625 in both halves
constexpr u32 MAGIC_64 = 0x54005400u;              // fp16 64.0: its mantissa bits 4-7 count ones
constexpr u32 H2_ONES = 0x3C003C00u;               // fp16 1.0 in both halves
constexpr int ZE = RAW_A && DIAG ? 2 : 1;          // zero points a lane folds per row and segment
constexpr u32 MAGIC_128 = 0x43004300u;             // bf16 128.0 in both halves
constexpr u32 BF2_ONES = 0x3F803F80u;              // bf16 1.0 in both halves
constexpr int MT = M > 1 ? 2 : 1;                  // tokens a lane folds (D columns 2t, 2t+1)
constexpr int BLOCK_SUMS = M * ROWS_PER_BLOCK;     // a block's sums: token m, row i at m * ROWS_PER_BLOCK + i

static_assert(K % 32 == 0, "the tensor-core kernel needs K % 32 == 0");
static_assert(KC == 1 || __CUDA_ARCH__ >= 900, "a K split over the blocks of a cluster needs sm_90");
static_assert(GROUP % 16 == 0, "a group holds whole 8-element half-words");
static_assert(GROUP < 128 || K % 128 == 0, "GROUP >= 128 implies whole steps");
static_assert(M >= 1 && M <= 8, "one mma column block: up to 8 tokens");
static_assert(!RAW_A || M == 1, "raw_a is one token's");
static_assert(!XAHEAD || M > 1, "xahead is several tokens' (one token reads x from shared memory or per step)");
static_assert(!XSMEM || M == 1, "x staging is one token's");

// A scale as fp32, and fp32 as the output type.
__device__ __forceinline__ float scale_f(u16 s) { return SCALE_BF16 ? bf16_to_f(s) : h_to_f(s); }
__device__ __forceinline__ u16 out_h(float f) { return BF16 ? f_to_bf16(f) : f_to_h(f); }
// SCALED: a scale in the activation type, in both halves; an A pair (q - z) times it.
__device__ __forceinline__ u32 scale_pair(u16 s) {
    if constexpr (SCALE_BF16 == BF16) return s * 0x00010001u;
    return (BF16 ? f_to_bf16(scale_f(s)) : f_to_h(scale_f(s))) * 0x00010001u;
}
__device__ __forceinline__ u32 tc_scale(u32 a, u32 s2) {
    if constexpr (!SCALED) return a;
    return BF16 ? bf2_fma(a, s2, 0x80008000u) : h2_fma(a, s2, 0x80008000u);
}

// Weights; streaming builds add a 256-byte L2 fetch hint (a miss brings the neighbouring sectors).
__device__ __forceinline__ u32x4 load_weights16(const void* p) {
    if constexpr (STREAMING) return load_stream16_l2_256(p);
    else return load_stream16(p);
}

// x. EARLY: this grid is resident while the previous one writes x, so x is read coherently
// (from L2, after the wait); otherwise through the read-only path. FIRST keeps a load in program
// order with the other volatile loads (issued ahead of them).
template <bool FIRST>
__device__ __forceinline__ u32x4 load_x16(const void* p) {
    if constexpr (EARLY) return load_coherent16(p);
    else if constexpr (FIRST) return load_first16(p);
    else return load_cached16(p);
}

// Zero point z as the fp16x2 words that turn (1024 + q) and (1024 + 16q) into q - z; bf16:
// -(128 + z) in both, for 128 + q.
__device__ __forceinline__ void tc_zero_words(u32 z, u32& zlo, u32& zhi_neg) {
    if constexpr (BF16) {
        zlo = zhi_neg = (0xC300u | z) * 0x00010001u;
    } else {
        zlo = (0x6400u | z) * 0x00010001u;
        zhi_neg = (0xD400u + (z << 4)) * 0x00010001u;
    }
}

// The nibble masks live in constant memory: LOP3 reads one operand from there, so no register
// holds (or is re-loaded with) a 32-bit constant per use.
__constant__ u32 TC_MASK[2] = {0x000F000Fu, 0x00F000F0u};

// bf16: nibbles i and i + 4 of a word as the pair (128 + q_i, 128 + q_i+4), exact.
__device__ __forceinline__ u32 bf16_nibble_pair(u32 q, int i) { return ((q >> (4 * i)) & TC_MASK[0]) | MAGIC_128; }

// One 8-nibble word of rows g (qa) and g+8 (qb) against x pairs (x0,x4) (x1,x5) (x2,x6) (x3,x7).
__device__ __forceinline__ void tc_word(float d[4], u32 qa, u32 qb, u32 za_lo, u32 za_hi, u32 zb_lo,
                                        u32 zb_hi, u32 x04, u32 x15, u32 x26, u32 x37, u32 sa2 = 0, u32 sb2 = 0) {
    if constexpr (BF16) {
        // Nibble pair i (k_i, k_i+4) as (128 + q) - (128 + z), exact in bf16.
        u32 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            a[i] = tc_scale(bf2_fma(bf16_nibble_pair(qa, i), BF2_ONES, za_lo), sa2);
            b[i] = tc_scale(bf2_fma(bf16_nibble_pair(qb, i), BF2_ONES, zb_lo), sb2);
        }
        mma_16816_bf16(d, a[0], b[0], a[1], b[1], x04, x15);
        mma_16816_bf16(d, a[2], b[2], a[3], b[3], x26, x37);
        return;
    }
    const u32 qa2 = qa >> 8, qb2 = qb >> 8, lo = TC_MASK[0], hi = TC_MASK[1];
    mma_16816(d, tc_scale(h2_sub((qa & lo) | MAGIC_1024, za_lo), sa2), tc_scale(h2_sub((qb & lo) | MAGIC_1024, zb_lo), sb2),
              tc_scale(h2_fma((qa & hi) | MAGIC_1024, SIXTEENTH, za_hi), sa2),
              tc_scale(h2_fma((qb & hi) | MAGIC_1024, SIXTEENTH, zb_hi), sb2), x04, x15);
    mma_16816(d, tc_scale(h2_sub((qa2 & lo) | MAGIC_1024, za_lo), sa2), tc_scale(h2_sub((qb2 & lo) | MAGIC_1024, zb_lo), sb2),
              tc_scale(h2_fma((qa2 & hi) | MAGIC_1024, SIXTEENTH, za_hi), sa2),
              tc_scale(h2_fma((qb2 & hi) | MAGIC_1024, SIXTEENTH, zb_hi), sb2), x26, x37);
}

// RAW_A: the same word with A = (1024 + q) on even k and (64 + q) on odd k, one LOP3 per pair
// (bf16: 128 + q on both, the nibble shifted down first).
__device__ __forceinline__ void tc_word_raw(float d[4], u32 qa, u32 qb, u32 x04, u32 x15, u32 x26, u32 x37) {
    if constexpr (BF16) {
        u32 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            a[i] = bf16_nibble_pair(qa, i);
            b[i] = bf16_nibble_pair(qb, i);
        }
        mma_16816_bf16(d, a[0], b[0], a[1], b[1], x04, x15);
        mma_16816_bf16(d, a[2], b[2], a[3], b[3], x26, x37);
        return;
    }
    const u32 qa2 = qa >> 8, qb2 = qb >> 8, lo = TC_MASK[0], hi = TC_MASK[1];
    mma_16816(d, (qa & lo) | MAGIC_1024, (qb & lo) | MAGIC_1024, (qa & hi) | MAGIC_64, (qb & hi) | MAGIC_64, x04, x15);
    mma_16816(d, (qa2 & lo) | MAGIC_1024, (qb2 & lo) | MAGIC_1024, (qa2 & hi) | MAGIC_64, (qb2 & hi) | MAGIC_64, x26, x37);
}

// RAW_A: the offsets of a step, shared by every row, from one mma per word with the lane's x
// (unmasked) as A — even-k pairs on rows g, odd-k pairs on rows g+8 — and B = ones where the
// lane's chunk counts (all, or its diagonal column). Sums E (even k) and O (odd k) of the
// lane's D columns become C = 1024 E + 64 O (bf16: 128 (E + O)) in cs[seg][0..1] and S = E + O
// in cs[seg][2..3].
__device__ __forceinline__ void tc_offsets(float (&cs)[SEGS][4], const u32 (&xp)[4][4], u32 keep) {
    const u32 ones = (BF16 ? BF2_ONES : H2_ONES) & keep;
#pragma unroll
    for (int seg = 0; seg < SEGS; ++seg) {
        float eo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int jj = 0; jj < SEG_WORDS; ++jj) {
            const int j = seg * SEG_WORDS + jj;
            if constexpr (BF16) mma_16816_bf16(eo, xp[j][0], xp[j][1], xp[j][2], xp[j][3], ones, ones);
            else mma_16816(eo, xp[j][0], xp[j][1], xp[j][2], xp[j][3], ones, ones);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            cs[seg][e] = BF16 ? 128.0f * (eo[e] + eo[2 + e]) : fmaf(1024.0f, eo[e], 64.0f * eo[2 + e]);
            cs[seg][2 + e] = eo[e] + eo[2 + e];
        }
    }
}

// Eight x values (x0..x7) as the B pairs of one nibble word: (x0,x4) (x1,x5) (x2,x6) (x3,x7).
__device__ __forceinline__ u32x4 tc_pair_x(u32x4 v) {
    return u32x4{prmt(v.x, v.z, 0x5410), prmt(v.x, v.z, 0x7632), prmt(v.y, v.w, 0x5410), prmt(v.y, v.w, 0x7632)};
}

// x of this lane's chunk c of a step (token g's with several tokens; lanes past the last token
// read it again, and their D columns are never stored), as loaded: four 16-byte words.
__device__ __forceinline__ void tc_x_load(u32x4 (&v)[4], const u16* I4_RESTRICT x, const u32x4* xs, int c, int g) {
    if constexpr (M > 1) x += (long long)min(g, M - 1) * K;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = XSMEM ? xs[4 * min(c, CHUNKS - 1) + j] : load_x16<false>(x + 32 * min(c, CHUNKS - 1) + 8 * j);
}

// Chunk c's x (from tc_x_load) paired as the nibble words are: (x0,x4) (x1,x5) (x2,x6) (x3,x7),
// unmasked. Returns the mask tc_mask_pairs applies before x becomes B: all ones, or zero where
// the lane supplies no B values (diagonal) or has no chunk (partial step, SCALED).
__device__ __forceinline__ u32 tc_x_pairs(u32 (&xp)[4][4], const u32x4 (&v)[4], int c, int g, int t) {
    const u32 keep = DIAG ? (c < CHUNKS && g == t ? 0xFFFFFFFFu : 0u) : !SCALED || c < CHUNKS ? 0xFFFFFFFFu : 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32x4 p = XPERM ? v[j] : tc_pair_x(v[j]);
        xp[j][0] = p.x; xp[j][1] = p.y; xp[j][2] = p.z; xp[j][3] = p.w;
    }
    return keep;
}

__device__ __forceinline__ void tc_mask_pairs(u32 (&xp)[4][4], u32 keep) {
    if constexpr (DIAG || SCALED) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) xp[j][i] &= keep;
    }
}

// One step of one 16-row tile: rows g and g+8, two mma steps per word pair, D scaled per group
// into acc[row g, g+8][token 2t, 2t+1 (several tokens) or the one token].
__device__ __forceinline__ void tc_tile(float (&acc)[2][MT], const u32 (&wq)[2][4], const u16 (&sc)[2][DIAG ? 2 : 1][SEGS],
                                        const u8 (&zp)[2][ZE][SEGS], const u32 (&xp)[4][4], const float (&cs)[SEGS][4]) {
    if constexpr (RAW_A) {
#pragma unroll
        for (int seg = 0; seg < SEGS; ++seg) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int jj = 0; jj < SEG_WORDS; ++jj) {
                const int j = seg * SEG_WORDS + jj;
                tc_word_raw(d, wq[0][j], wq[1][j], xp[j][0], xp[j][1], xp[j][2], xp[j][3]);
            }
            // D - C - z S per D column; columns 2t, 2t+1 on the diagonal, else column 2t only.
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < (DIAG ? 2 : 1); ++e) {
                    const float z = SYMMETRIC ? 8.0f : (float)zp[h][e][seg];
                    acc[h][0] += (d[2 * h + e] - fmaf(z, cs[seg][2 + e], cs[seg][e])) * scale_f(sc[h][e][seg]);
                }
        }
        return;
    }
#pragma unroll
    for (int seg = 0; seg < SEGS; ++seg) {
        u32 za_lo, za_hi, zb_lo, zb_hi;
        tc_zero_words(SYMMETRIC ? 8u : (u32)zp[0][0][seg], za_lo, za_hi);
        tc_zero_words(SYMMETRIC ? 8u : (u32)zp[1][0][seg], zb_lo, zb_hi);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const u32 sa2 = SCALED ? scale_pair(sc[0][0][seg]) : 0u, sb2 = SCALED ? scale_pair(sc[1][0][seg]) : 0u;
#pragma unroll
        for (int jj = 0; jj < SEG_WORDS; ++jj) {
            const int j = seg * SEG_WORDS + jj;
            tc_word(d, wq[0][j], wq[1][j], za_lo, za_hi, zb_lo, zb_hi, xp[j][0], xp[j][1], xp[j][2], xp[j][3], sa2, sb2);
        }
        // d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
        if constexpr (SCALED) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < MT; ++e) acc[h][e] += d[2 * h + e];
        } else if constexpr (DIAG) {
            acc[0][0] += d[0] * scale_f(sc[0][0][seg]) + d[1] * scale_f(sc[0][1][seg]);
            acc[1][0] += d[2] * scale_f(sc[1][0][seg]) + d[3] * scale_f(sc[1][1][seg]);
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < MT; ++e) acc[h][e] += d[2 * h + e] * scale_f(sc[h][0][0]);
        }
    }
}

// The block's rows, accumulated into acc. TAIL: the last block, whose rows past N read row
// N-1 (always valid) and are never stored; every other block addresses its rows as constant
// offsets from one pointer per lane, so the loads need no per-row arithmetic.
// A batch is UNROLL steps of TW tiles: UNROLL * TW load slots (rows g and g+8 of a tile).
// STREAMING: each slot is reloaded with the next batch's data as soon as it has been used, so a
// warp's loads stay in flight while it computes (same registers); else a batch's loads are all
// issued, then all used. XSMEM: x staged in shared memory while the first batch is in flight.
template <bool TAIL>
__device__ __forceinline__ void tc_rows(float (&acc)[TW][2][MT], const u16* I4_RESTRICT x, const u8* I4_RESTRICT w,
                                        const u16* I4_RESTRICT scales, const u8* I4_RESTRICT zeros,
                                        long long row0, int ks, int g, int t, u32x4* xs) {
    long long rows[TW][2];
#pragma unroll
    for (int tw = 0; tw < TW; ++tw)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long r = row0 + 16 * tw + 8 * h + g;
            rows[tw][h] = TAIL ? (r < N ? r : N - 1) : r;
        }
    const u8* wbase = w + rows[0][0] * ROW_BYTES + 16 * t;
    const u16* sbase = scales + rows[0][0] * NG;
    const u8* zbase = zeros + rows[0][0] * NG;
    auto row_off = [&](int tw, int h) { return TAIL ? rows[tw][h] - rows[0][0] : 16 * tw + 8 * h; };
    // The chunk whose scales a lane applies to D (or SCALED, to A): its own (GROUP >= 128: all
    // four share the group) or, on the diagonal, chunks 2t and 2t+1 of the step (lanes t >= 2 hold zeros).
    const int fold_chunk = DIAG ? 2 * (t & 1) : t;

    const int s_begin = CONTIG ? ks * WARP_STEPS : ks;
    const int s_end = CONTIG ? min(s_begin + WARP_STEPS, STEPS) : STEPS;
    constexpr int BATCH = STEP_STRIDE * UNROLL;  // steps between a warp's consecutive batches
    u32 wq[UNROLL][TW][2][4];
    u16 sc[UNROLL][TW][2][DIAG ? 2 : 1][SEGS];
    u8 zp[UNROLL][TW][2][ZE][SEGS];
    // in_range: the caller knows the step exists (no clamping, so addresses advance linearly).
    auto load_slot = [&](int s0, int u, int tw, bool in_range) {
        const int st = in_range ? s0 + u * STEP_STRIDE : min(s0 + u * STEP_STRIDE, STEPS - 1);  // a step past the end is loaded, not used
        const bool whole = in_range && K % 128 == 0;  // every chunk of the step exists
        // On a partial last step a lane past the last chunk re-reads it; its x is masked to zero.
        const int c_off = K % 128 == 0 ? 0 : min(4 * st + t, CHUNKS - 1) - (4 * st + t);
        // Chunk e of those this lane folds D columns for (their scales, and with RAW_A zeros).
        auto fold_at = [&](int e) { return whole ? 4 * st + fold_chunk + e : min(4 * st + fold_chunk + e, CHUNKS - 1); };
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u8* src = wbase + row_off(tw, h) * ROW_BYTES + 64LL * st + 16 * c_off;
            const u32x4 v = load_weights16(src);
            wq[u][tw][h][0] = v.x; wq[u][tw][h][1] = v.y; wq[u][tw][h][2] = v.z; wq[u][tw][h][3] = v.w;
            const u16* srow = sbase + row_off(tw, h) * NG;
            if constexpr (WIDE_SCALES) {
                // The two chunks' scales are adjacent in the row (and aligned): one load.
                auto& s = sc[u][tw][h];
                const u16* p = srow + 32 * fold_at(0) / GROUP;
                if constexpr (GROUP == 16) {
                    const u32x2 v = load_cached8(p);
                    s[0][0] = (u16)v.x; s[0][1] = (u16)(v.x >> 16); s[1][0] = (u16)v.y; s[1][1] = (u16)(v.y >> 16);
                } else if constexpr (GROUP == 32) {
                    const u32 v = load_cached_u32(p);
                    s[0][0] = (u16)v; s[1][0] = (u16)(v >> 16);
                } else {
                    s[0][0] = s[1][0] = load_cached_u16(p);  // both chunks in one group
                }
            } else {
#pragma unroll
                for (int e = 0; e < (DIAG ? 2 : 1); ++e)
#pragma unroll
                    for (int seg = 0; seg < SEGS; ++seg)
                        sc[u][tw][h][e][seg] = load_cached_u16(srow + (32 * fold_at(e) + 16 * seg) / GROUP);
            }
            if constexpr (!SYMMETRIC) {
                // Zero points of the lane's own chunk (they go into A), or with RAW_A of the
                // chunks whose D columns it folds, like the scales.
#pragma unroll
                for (int e = 0; e < ZE; ++e) {
                    const int zc = RAW_A ? fold_at(e) : 4 * st + t + c_off;
#pragma unroll
                    for (int seg = 0; seg < SEGS; ++seg)
                        zp[u][tw][h][e][seg] = load_cached_u8(zbase + row_off(tw, h) * NG + (32 * zc + 16 * seg) / GROUP);
                }
            }
            // STREAMING: one issue fence per slot, on an address (ptxas then keeps the refill's loads here).
            if constexpr (STREAMING) {
                if (h == 0) issue_barrier((u32)(unsigned long long)src);
            }
        }
    };
    // Issue every load of a batch before using any of them.
    auto load_batch = [&](int s0) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int tw = 0; tw < TW; ++tw) load_slot(s0, u, tw, false);
    };
    if constexpr (XWARP) {
        // Each warp stages the x of its own steps, paired, through registers (no block barrier),
        // its x loads issued ahead of its first weights (volatile loads keep that order); EARLY:
        // the first weights go before the grid-dependency wait, x after it.
        constexpr int XW_LANE = (16 * WARP_STEPS + 31) / 32;  // 16 x words (8 halves) a step
        int xw[XW_LANE];
        u32x4 xv[XW_LANE];
        if constexpr (EARLY) {
            load_batch(s_begin);
            I4_GRID_WAIT();
        }
#pragma unroll
        for (int r = 0; r < XW_LANE; ++r) {
            const int i = threadIdx.x % 32 + 32 * r, st = s_begin + (i / 16) * STEP_STRIDE;
            xw[r] = i < 16 * WARP_STEPS && st < s_end && 16 * st + i % 16 < K / 8 ? 16 * st + i % 16 : -1;
            xv[r] = load_x16<true>(x + 8 * max(xw[r], 0));
        }
        if constexpr (!EARLY) {
            __syncwarp();  // emits no instruction, but the build measured on the H200 was scheduled with it
            load_batch(s_begin);
        }
#pragma unroll
        for (int r = 0; r < XW_LANE; ++r)
            if (xw[r] >= 0) xs[xw[r]] = tc_pair_x(xv[r]);
        __syncwarp();
    } else {
        // STREAMING: the first batch is loaded before the loop, and x goes into shared memory
        // while it is in flight.
        if constexpr (STREAMING) load_batch(s_begin);
        if constexpr (EARLY) I4_GRID_WAIT();  // x (read below or per step) after the first weights
        if constexpr (XPERM) {
            for (int i = threadIdx.x; i < K / 8; i += BS) xs[i] = tc_pair_x(load_x16<false>(x + 8 * i));
            __syncthreads();
        }
    }
    u32x4 xnext[4];  // XAHEAD only
    if constexpr (XAHEAD) tc_x_load(xnext, x, xs, 4 * s_begin + t, g);
    for (int s0 = s_begin; s0 < s_end; s0 += BATCH) {
        if constexpr (!STREAMING) {
            load_batch(s0);
            u32 all = 0;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                    for (int h = 0; h < 2; ++h) all ^= wq[u][tw][h][0];  // one word per load suffices
            issue_barrier(all);
        }
        const bool more = s0 + BATCH < s_end;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int step = s0 + u * STEP_STRIDE;
            if (step >= s_end) break;
            u32x4 xv[4];
            if constexpr (XAHEAD) {
                // This step's x came a step ahead; the warp's next step's goes out now.
#pragma unroll
                for (int j = 0; j < 4; ++j) xv[j] = xnext[j];
                tc_x_load(xnext, x, xs, 4 * (step + STEP_STRIDE) + t, g);
            } else {
                tc_x_load(xv, x, xs, 4 * step + t, g);
            }
            u32 xp[4][4];
            const u32 keep = tc_x_pairs(xp, xv, 4 * step + t, g, t);
            float cs[SEGS][4];
            if constexpr (RAW_A) tc_offsets(cs, xp, keep);
            tc_mask_pairs(xp, keep);
#pragma unroll
            for (int tw = 0; tw < TW; ++tw) {
                tc_tile(acc[tw], wq[u][tw], sc[u][tw], zp[u][tw], xp, cs);
                if constexpr (STREAMING) {
                    // With one step a batch, `more` means that step exists: no clamping.
                    if (more) load_slot(s0 + BATCH, u, tw, UNROLL == 1);
                }
            }
        }
    }
}

// The block's rows (ROWS_PER_BLOCK from row0) into y: the warps' K-split sums are added
// through shared memory (`partial`, row ks * M + m for warp ks and token m; declared beside x so
// the streaming build's layout stays as measured). KC > 1: each block of the cluster puts its
// sums into `cluster_part` of block 0 (distributed shared memory; row rank, token m's row i at
// m * ROWS_PER_BLOCK + i), which adds them after the cluster barrier and stores y. With several
// tokens lane (g, t) holds tokens 2t and 2t + 1.
__device__ __forceinline__ void tc_store(float (&acc)[TW][2][MT], u16* I4_RESTRICT y, long long row0, int ks, int rank,
                                         int g, int t, float (*partial)[ROWS_PER_BLOCK],
                                         float (*cluster_part)[BLOCK_SUMS]) {
    // On the diagonal, lanes t = 0, 1 hold two chunks' sums each and t = 2, 3 hold zeros.
    if constexpr (DIAG) {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int h = 0; h < 2; ++h) acc[tw][h][0] += warp_xor(acc[tw][h][0], 1);
    }
    // f(m, i, v) for the lane's sums: token m, block row i (one token: lanes t == 0 hold it).
    auto each_sum = [&](auto&& f) {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < MT; ++e) {
                    const int m = M > 1 ? 2 * t + e : 0;
                    if (M > 1 ? m < M : t == 0) f(m, 16 * tw + 8 * h + g, acc[tw][h][e]);
                }
    };
    if constexpr (KSPLIT == 1 && KC == 1) {
        each_sum([&](int m, int i, float v) {
            if (row0 + i < N) y[(long long)m * N + row0 + i] = out_h(v);
        });
    } else {
        each_sum([&](int m, int i, float v) { partial[ks * M + m][i] = v; });
        __syncthreads();
        // f(m, i) for each token m and block row i that exists (threads over rows).
        auto each_row = [&](auto&& f) {
#pragma unroll
            for (int r = 0; r < (M * ROWS_PER_BLOCK + BS - 1) / BS; ++r) {
                const int j = threadIdx.x + r * BS;
                const int m = M > 1 ? j / ROWS_PER_BLOCK : 0, i = M > 1 ? j % ROWS_PER_BLOCK : j;
                if (j < M * ROWS_PER_BLOCK && row0 + i < N) f(m, i);
            }
        };
        if constexpr (KC > 1) cluster_wait();  // block 0 has started: its shared memory may be written
        each_row([&](int m, int i) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < KSPLIT; ++k) sum += partial[k * M + m][i];
            if constexpr (KC == 1)
                y[(long long)m * N + row0 + i] = out_h(sum);
            else
                cluster_store(&cluster_part[rank][m * ROWS_PER_BLOCK + i], 0, sum);
        });
        if constexpr (KC > 1) {
            cluster_sync();  // every block's sums are in block 0
            if (rank == 0) {
                each_row([&](int m, int i) {
                    float sum = 0.0f;
#pragma unroll
                    for (int c = 0; c < KC; ++c) sum += cluster_part[c][m * ROWS_PER_BLOCK + i];
                    y[(long long)m * N + row0 + i] = out_h(sum);
                });
            }
        }
    }
}

// Ask L2 for the weights of this warp's first PREFETCH batches (one 64-byte piece of a row per
// step, from lane t == 0). Before the grid-dependency wait: weights are never a predecessor's output.
__device__ __forceinline__ void tc_prefetch(const u8* I4_RESTRICT w, long long row0, int ks, int g, int t) {
    if (t != 0) return;
    const int s_begin = CONTIG ? ks * WARP_STEPS : ks;
    const int s_end = CONTIG ? min(s_begin + WARP_STEPS, STEPS) : STEPS;
#pragma unroll
    for (int b = 0; b < PREFETCH * UNROLL; ++b) {
        const int st = s_begin + b * STEP_STRIDE;
        if (st >= s_end) break;
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long r = min(row0 + 16 * tw + 8 * h + g, N - 1);
                prefetch_l2(w + r * ROW_BYTES + 64LL * st);
            }
    }
}

// KERNEL_ATTRS: the launch bounds (with a register cap for one_wave) and the cluster size.
extern "C" __global__ void ${KERNEL_ATTRS}
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    const int ks = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    // KC > 1: a cluster is KC consecutive blocks; block `rank` of it takes warps
    // rank * KSPLIT .. of the row block's K split.
    const int rank = KC > 1 ? blockIdx.x % KC : 0;
    const long long row0 = (long long)(blockIdx.x / KC) * ROWS_PER_BLOCK;
    __shared__ u32x4 xs[XSMEM ? K / 8 : 1];  // x, when staged (XSMEM)
    __shared__ float partial[KSPLIT > 1 || KC > 1 ? KSPLIT * M : 1][ROWS_PER_BLOCK];  // tc_store's sums
    // KC > 1: block 0's copy receives every block's sums (a one-element array otherwise).
    __shared__ float cluster_sums[KC > 1 ? KC * BLOCK_SUMS : 1];
    float (*cluster_part)[BLOCK_SUMS] = KC > 1 ? (float (*)[BLOCK_SUMS])cluster_sums : nullptr;
    if constexpr (KC > 1) cluster_arrive_relaxed();  // this block has started (tc_store waits for all)
    float acc[TW][2][MT];
#pragma unroll
    for (int tw = 0; tw < TW; ++tw)
#pragma unroll
        for (int e = 0; e < MT; ++e) acc[tw][0][e] = acc[tw][1][e] = 0.0f;
    // EARLY: the next kernel may launch now (its blocks take SM room as this grid's leave), and
    // tc_rows waits for the previous grid after issuing its first weights, before any x.
    if constexpr (EARLY) I4_GRID_LAUNCH_DEPENDENTS();
    if constexpr (PREFETCH > 0) tc_prefetch(w, row0, rank * KSPLIT + ks, g, t);
    if constexpr (!EARLY) I4_GRID_WAIT();  // the previous kernel's writes (x) are visible after this
    if (N % ROWS_PER_BLOCK != 0 && blockIdx.x / KC == gridDim.x / KC - 1)
        tc_rows<true>(acc, x, w, scales, zeros, row0, rank * KSPLIT + ks, g, t, xs);
    else
        tc_rows<false>(acc, x, w, scales, zeros, row0, rank * KSPLIT + ks, g, t, xs);
    // This block's loads are done: the next kernel may launch. Triggering at the start instead
    // measured 1.5 us slower per small call and 4-7% on large ones (docs/performance.md).
    if constexpr (!EARLY) I4_GRID_LAUNCH_DEPENDENTS();
    tc_store(acc, y, row0, ks, rank, g, t, partial, cluster_part);
}
