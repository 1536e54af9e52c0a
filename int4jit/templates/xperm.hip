// x' for the prefill GEMM (gemm_sm90.hip): each 128-element step of a row of x [tokens, K]
// reordered as the GEMM's A fragments take k, so its B tiles are plain 16-byte copies:
//   x'[16 j + 8 hi + 2 t + e] = x[32 t + 8 w + 4 e + 2 h + hi]   (j = 2 w + h, within the step)
// One thread a (token, step, w): four 16-byte loads (chunk t, word w), 64 contiguous bytes out.
// The arguments follow the GEMM's: x, w, scales, zeros unused but x; y is x'.

constexpr int K = ${K};
constexpr int BS = ${BS};
constexpr int PIECES = K / 32;  // (step, w) of a row

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT, const u16* I4_RESTRICT, const u8* I4_RESTRICT,
               u16* I4_RESTRICT y, long long tokens) {
    for (long long i = (long long)blockIdx.x * BS + threadIdx.x; i < tokens * PIECES; i += (long long)gridDim.x * BS) {
        const long long row = i / PIECES;
        const int step = (int)(i % PIECES) / 4, w = (int)(i % 4);
        const u16* src = x + row * K + step * 128 + 8 * w;
        u32x4 in[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) in[t] = load_cached16(src + 32 * t);
        u32x4* dst = (u32x4*)(y + row * K + step * 128 + 32 * w);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const u32 sel = hi ? 0x7632u : 0x5410u;
                u32 o[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const u32 lo_word = h ? in[t].y : in[t].x, hi_word = h ? in[t].w : in[t].z;
                    o[t] = prmt(lo_word, hi_word, sel);
                }
                dst[2 * h + hi] = u32x4{o[0], o[1], o[2], o[3]};
            }
        }
    }
}
