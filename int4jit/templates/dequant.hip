// Dequantise canonical INT4 weights into a dense row-major [N, K] matrix (prefill: one pass per
// call, then a dense matmul):  W[n,k] = (q[n,k] - z[n,k/g]) * s[n,k/g]   in fp32, stored as fp16
// or bf16. A thread takes WPT 32-bit words of w (8 weights of one row, one group, each), BS words
// apart so each load and each 16-byte store of a warp is contiguous; all WPT loads are issued
// before the first is used (one 4-byte load a thread kept too few bytes in flight on small
// matrices). Arguments as the GEMV kernels take them; x is not read.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr bool OUT_BF16 = ${OUT_BF16};
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int BS = ${BS};
constexpr int WPT = ${WPT};          // words a thread
constexpr int NG = K / GROUP;
constexpr long long WORDS = N * (K / 8);

static_assert(K % 16 == 0 && GROUP % 8 == 0, "a word of 8 weights lies in one group of one row");

__device__ __forceinline__ u16 to_out(float v) { return OUT_BF16 ? f_to_bf16(v) : f_to_h(v); }

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    I4_GRID_LAUNCH_DEPENDENTS();
    I4_GRID_WAIT();
    const long long first = (long long)blockIdx.x * BS * WPT + threadIdx.x;
    u32 q[WPT];
    u16 sv[WPT];
    u8 zv[WPT];
#pragma unroll
    for (int j = 0; j < WPT; ++j) {
        const long long i = first + (long long)j * BS;
        if (i >= WORDS) break;
        const long long gi = i / (K / 8) * NG + (int)(i % (K / 8)) * 8 / GROUP;
        q[j] = ((const u32*)w)[i];
        sv[j] = load_cached_u16(scales + gi);
        zv[j] = SYMMETRIC ? (u8)8 : load_cached_u8(zeros + gi);
    }
#pragma unroll
    for (int j = 0; j < WPT; ++j) {
        const long long i = first + (long long)j * BS;
        if (i >= WORDS) break;
        const float s = SCALE_BF16 ? bf16_to_f(sv[j]) : h_to_f(sv[j]);
        const float z = (float)zv[j];
        u32 packed[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const float lo = ((float)((q[j] >> (8 * b)) & 0xFu) - z) * s;
            const float hi = ((float)((q[j] >> (8 * b + 4)) & 0xFu) - z) * s;
            packed[b] = (u32)to_out(lo) | ((u32)to_out(hi) << 16);
        }
        ((u32x4*)y)[i] = u32x4{packed[0], packed[1], packed[2], packed[3]};
    }
}
