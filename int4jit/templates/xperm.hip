// x' for the prefill GEMM (gemm_sm90.hip): x [tokens, K] laid out as the GEMM's shared memory
// takes it, so one bulk copy fills a stage. Per token tile of TOK rows (rows past the last token
// are zeros) and step of 128 k, a block of TOK x 256 bytes: two 64-k halves of TOK rows x 128
// bytes; in a step, k in the order the GEMM's A fragments take it,
//   x'[16 j + 8 hi + 2 t + e] = x[32 t + 8 w + 4 e + 2 h + hi]   (j = 2 w + h),
// and the 16-byte chunk c of row r of a half stored at chunk c ^ (r % 8) (the 128-byte swizzle).
// One thread a (row, step, w): four 16-byte loads (chunk t, word w), four 16-byte stores.
// The arguments follow the GEMM's: x, three unused, y is the GEMM's workspace: x', then the
// partial sums (GEMM_GRID blocks of PARTIAL_BYTES), then one flag a GEMM block, zeroed here.

constexpr int K = ${K};
constexpr int BS = ${BS};
constexpr int TOK = ${TOK};
constexpr int STEPS = K / 128;
constexpr int PIECES = K / 32;  // (step, w) of a row
constexpr int GEMM_GRID = ${GEMM_GRID};
constexpr long long PARTIAL_BYTES = ${PARTIAL_BYTES};

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT, const u16* I4_RESTRICT, const u8* I4_RESTRICT,
               u16* I4_RESTRICT y, long long tokens) {
    const long long rows = (tokens + TOK - 1) / TOK * TOK;
    const long long first = (long long)blockIdx.x * BS + threadIdx.x;
    if (first < GEMM_GRID)
        ((unsigned*)((char*)y + rows * K * 2 + GEMM_GRID * PARTIAL_BYTES))[first] = 0u;
    for (long long i = first; i < rows * PIECES; i += (long long)gridDim.x * BS) {
        const long long row = i / PIECES;
        const int step = (int)(i % PIECES) / 4, w = (int)(i % 4), r = (int)(row % TOK);
        u32x4 in[4] = {};
        if (row < tokens) {
            const u16* src = x + row * K + step * 128 + 8 * w;
#pragma unroll
            for (int t = 0; t < 4; ++t) in[t] = load_cached16(src + 32 * t);
        }
        // This (w, step)'s 32 outputs lie in half w / 2, chunks 4 (w % 2) + 2 h + hi of row r.
        char* half = (char*)y + ((row / TOK * STEPS + step) * 2 + w / 2) * (long long)(TOK * 128) + r * 128;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const u32 sel = hi ? 0x7632u : 0x5410u;
                u32 o[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) o[t] = prmt(h ? in[t].y : in[t].x, h ? in[t].w : in[t].z, sel);
                const int c = 4 * (w % 2) + 2 * h + hi;
                *(u32x4*)(half + ((c ^ (r % 8)) << 4)) = u32x4{o[0], o[1], o[2], o[3]};
            }
        }
    }
}
