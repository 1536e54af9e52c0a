// AMD prelude (hiprtc): half2 values travel as 32-bit words, bit-cast to clang's
// packed _Float16 vectors for math. Wave size and the dot product depend on the target.
#define I4_WARP ${WARP}
#define I4_HAS_DOT2 ${HAS_DOT2}
#define I4_RESTRICT __restrict__

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef _Float16 f16x2 __attribute__((ext_vector_type(2)));
struct __attribute__((aligned(16))) u32x4 { u32 x, y, z, w; };
struct __attribute__((aligned(8))) u32x2 { u32 x, y; };

__device__ __forceinline__ f16x2 as_f16x2(u32 v) { return __builtin_bit_cast(f16x2, v); }
__device__ __forceinline__ u32 as_u32(f16x2 v) { return __builtin_bit_cast(u32, v); }

// Weights are read once: non-temporal loads keep them from evicting x.
typedef u32 u32v4 __attribute__((ext_vector_type(4)));
typedef u32 u32v2 __attribute__((ext_vector_type(2)));
__device__ __forceinline__ u32x4 load_stream16(const void* p) {
    const u32v4 v = __builtin_nontemporal_load((const u32v4*)p);
    return {v.x, v.y, v.z, v.w};
}
__device__ __forceinline__ u32x2 load_stream8(const void* p) {
    const u32v2 v = __builtin_nontemporal_load((const u32v2*)p);
    return {v.x, v.y};
}
__device__ __forceinline__ u32x4 load_cached16(const void* p) { return *(const u32x4*)p; }
__device__ __forceinline__ u16 load_cached_u16(const u16* p) { return *p; }
__device__ __forceinline__ u8 load_cached_u8(const u8* p) { return *p; }

__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) { return as_u32(as_f16x2(a) - as_f16x2(b)); }
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    return as_u32(as_f16x2(a) * as_f16x2(b) + as_f16x2(c));
}
__device__ __forceinline__ float h_to_f(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
__device__ __forceinline__ u16 f_to_h(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
__device__ __forceinline__ float bf16_to_f(u16 h) { return __builtin_bit_cast(float, (u32)h << 16); }
__device__ __forceinline__ float bits_to_f(u32 v) { return __builtin_bit_cast(float, v); }
__device__ __forceinline__ float fma_f32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// fp32 -> bf16, round to nearest even (finite values).
__device__ __forceinline__ u16 f_to_bf16(float f) {
    const u32 u = __builtin_bit_cast(u32, f);
    return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float warp_xor(float v, int mask) { return __shfl_xor(v, mask, I4_WARP); }

// Dot product of 16-element pieces, accumulated in fp32.
typedef float dot_acc_t;
__device__ __forceinline__ dot_acc_t dot_zero() { return 0.0f; }
#if I4_HAS_DOT2
// v_dot2_f32_f16: two fp16 products added into an fp32 accumulator.
__device__ __forceinline__ dot_acc_t dot2(dot_acc_t acc, u32 w, u32 x) {
    return __builtin_amdgcn_fdot2(as_f16x2(w), as_f16x2(x), acc, false);
}
#else
// Targets without dot2 (gfx900, gfx1010): widen and use fp32 FMA.
__device__ __forceinline__ dot_acc_t dot2(dot_acc_t acc, u32 w, u32 x) {
    f16x2 a = as_f16x2(w), b = as_f16x2(x);
    return __builtin_fmaf((float)a.y, (float)b.y, __builtin_fmaf((float)a.x, (float)b.x, acc));
}
#endif
__device__ __forceinline__ float dot_finish(dot_acc_t acc) { return acc; }
// Programmatic dependent launch is CUDA's (sm_90+); HIP launches stay stream-ordered.
#define I4_GRID_WAIT()
#define I4_GRID_LAUNCH_DEPENDENTS()
