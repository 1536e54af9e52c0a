// Dequantise canonical INT4 weights into a dense row-major [N, K] matrix (prefill: one pass per
// call, then a dense matmul):  W[n,k] = (q[n,k] - z[n,k/g]) * s[n,k/g]   in fp32, stored as fp16
// or bf16. One thread a 32-bit word of w (8 weights of one row, one group), one 16-byte store.
// Arguments as the GEMV kernels take them; x is not read.

constexpr long long N = ${N};
constexpr int K = ${K};
constexpr int GROUP = ${GROUP};
constexpr bool SYMMETRIC = ${SYMMETRIC};
constexpr bool OUT_BF16 = ${OUT_BF16};
constexpr bool SCALE_BF16 = ${SCALE_BF16};
constexpr int BS = ${BS};
constexpr int NG = K / GROUP;
constexpr long long WORDS = N * (K / 8);

static_assert(K % 16 == 0 && GROUP % 8 == 0, "a word of 8 weights lies in one group of one row");

__device__ __forceinline__ u16 to_out(float v) { return OUT_BF16 ? f_to_bf16(v) : f_to_h(v); }

extern "C" __global__ void __launch_bounds__(BS)
${KERNEL_NAME}(const u16* I4_RESTRICT x, const u8* I4_RESTRICT w, const u16* I4_RESTRICT scales,
               const u8* I4_RESTRICT zeros, u16* I4_RESTRICT y) {
    I4_GRID_LAUNCH_DEPENDENTS();
    I4_GRID_WAIT();
    const long long i = (long long)blockIdx.x * BS + threadIdx.x;
    if (i >= WORDS) return;
    const long long n = i / (K / 8);
    const int k0 = (int)(i % (K / 8)) * 8;
    const u32 q = ((const u32*)w)[i];
    const long long gi = n * NG + k0 / GROUP;
    const u16 sv = load_cached_u16(scales + gi);
    const float s = SCALE_BF16 ? bf16_to_f(sv) : h_to_f(sv);
    const float z = SYMMETRIC ? 8.0f : (float)load_cached_u8(zeros + gi);
    u32 packed[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float lo = ((float)((q >> (8 * j)) & 0xFu) - z) * s;
        const float hi = ((float)((q >> (8 * j + 4)) & 0xFu) - z) * s;
        packed[j] = (u32)to_out(lo) | ((u32)to_out(hi) << 16);
    }
    ((u32x4*)y)[i] = u32x4{packed[0], packed[1], packed[2], packed[3]};
}
