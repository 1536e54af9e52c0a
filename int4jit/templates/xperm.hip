// x' for the prefill GEMM (gemm_sm90.hip): x [tokens, K] laid out as the GEMM's shared memory
// takes it, so one bulk copy fills a stage. Per token tile of TOK rows (rows past the last token
// are zeros) and step of 128 k, a block of TOK x 256 bytes: two 64-k halves of TOK rows x 128
// bytes; in a step, k in the order the GEMM's A fragments take it,
//   x'[16 j + 8 hi + 2 t + e] = x[32 t + 8 w + 4 e + 2 h + hi]   (j = 2 w + h),
// and the 16-byte chunk c of row r of a half stored at chunk c ^ (r % 8) (the 128-byte swizzle).
// One thread a 16-byte chunk of x', in x' order (so a warp stores 512 contiguous bytes): chunk p
// of row r of a half holds the swizzled chunk c = p ^ (r % 8), whose 8 values come from the
// 16-byte pieces t = 0..3 of word w = 2 half + c / 4 (one 16-byte load each; the four threads of
// a row that share w share the loads, through L1).
// The arguments follow the GEMM's: x, three unused, y is the GEMM's workspace: x', then the
// partial sums (GEMM_GRID blocks of PARTIAL_BYTES), then one flag a GEMM block, zeroed here.
// Launched stream-ordered (after any kernel). Every block of this grid is resident at once (4 an
// SM), so letting the GEMM launch at the start (PDL) takes no room from them: its blocks take SMs
// as these exit, load their first weights, and wait for this grid's writes (griddepcontrol.wait).

constexpr int K = ${K};
constexpr int BS = ${BS};
constexpr int TOK = ${TOK};
constexpr int STEPS = K / 128;
constexpr int GEMM_GRID = ${GEMM_GRID};
constexpr long long PARTIAL_BYTES = ${PARTIAL_BYTES};

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT, const u16* I4_RESTRICT, const u8* I4_RESTRICT,
               u16* I4_RESTRICT y, long long tokens) {
    I4_GRID_LAUNCH_DEPENDENTS();
    const long long rows = (tokens + TOK - 1) / TOK * TOK;
    const long long first = (long long)blockIdx.x * BS + threadIdx.x;
    if (first < GEMM_GRID)
        ((unsigned*)((char*)y + rows * K * 2 + GEMM_GRID * PARTIAL_BYTES))[first] = 0u;
    const long long chunks = rows * (K / 8);  // 16-byte chunks of x'
    for (long long i = first; i < chunks; i += (long long)gridDim.x * BS) {
        const int p = (int)(i % 8), r = (int)(i / 8 % TOK), half = (int)(i / (8 * TOK) % 2);
        const long long step_of_all = i / (16 * TOK);  // (token tile, step)
        const long long row = step_of_all / STEPS * TOK + r;
        const int step = (int)(step_of_all % STEPS), c = p ^ (r % 8);
        const int w = 2 * half + c / 4, h = c / 2 % 2, hi = c % 2;
        u32 o[4] = {};
        if (row < tokens) {
            const u16* src = x + row * K + step * 128 + 8 * w;
            const u32 sel = hi ? 0x7632u : 0x5410u;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const u32x4 in = load_cached16(src + 32 * t);
                o[t] = prmt(h ? in.y : in.x, h ? in.w : in.z, sel);
            }
        }
        ((u32x4*)y)[i] = u32x4{o[0], o[1], o[2], o[3]};
    }
}
