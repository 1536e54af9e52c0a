// CPU prelude: the API of prelude_cuda.hip / prelude_hip.hip in plain C++20, so a kernel template
// runs on the CPU (int4jit/emulate.py): one OS thread a GPU thread, the blocks one after the
// other, warp-wide steps (shuffles, mma) meeting at a barrier of the warp's threads.
// Vendor semantics kept: fp16/bf16 pair math rounds to nearest even once (computed in double),
// mma sums exact products in double and rounds once to fp32, I4_WARP is the target's wave size.
#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#define I4_WARP ${WARP}
#define I4_HAS_DOT2 ${HAS_DOT2}
#define I4_RESTRICT __restrict
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static __attribute__((section(I4_SMEM_SECTION)))  // the block copy's own
#define __constant__ static
#define __align__(n) alignas(n)
#define __CUDA_ARCH__ 900

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
struct alignas(16) u32x4 { u32 x, y, z, w; };
struct alignas(8) u32x2 { u32 x, y; };
struct alignas(16) float4 { float x, y, z, w; };

// -- the emulated launch: thread and block indices, barriers of a block and of its warps ----
struct i4_dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local i4_dim3 threadIdx, blockIdx;
inline i4_dim3 gridDim, blockDim;

namespace i4emu {
// An mbarrier (Hopper): `pending` arrivals and `tx` bytes to go in the current phase.
struct Mbarrier { u32 count = 0, pending = 0, phase = 0; long long tx = 0; };

struct Block {
    int bs = 0;
    std::unique_ptr<std::barrier<>> all;                 // __syncthreads
    std::vector<std::unique_ptr<std::barrier<>>> warps;  // warp-wide steps
    std::vector<std::unique_ptr<std::barrier<>>> groups; // warpgroup-wide steps (128 threads: wgmma)
    std::vector<std::array<u32, 8>> slots;               // what each thread shows its warp (or warpgroup)
    std::map<u32, Mbarrier> mbarriers;                   // by shared-memory address
    std::mutex mbar_lock;
    std::condition_variable mbar_done;

    explicit Block(int threads) : bs(threads), slots((threads + I4_WARP - 1) / I4_WARP * I4_WARP) { reset(); }
    void reset() {  // full counts again (threads that returned early dropped out of the last block)
        all = std::make_unique<std::barrier<>>(bs);
        warps.clear();
        for (int w0 = 0; w0 < bs; w0 += I4_WARP) warps.push_back(std::make_unique<std::barrier<>>(std::min(I4_WARP, bs - w0)));
        groups.clear();
        for (int w0 = 0; w0 < bs; w0 += 128) groups.push_back(std::make_unique<std::barrier<>>(std::min(128, bs - w0)));
        mbarriers.clear();
    }
};
// The blocks of one cluster (one block without clusters) run at once, a copy of the kernel each
// (its own shared memory: the launcher's i4smem<rank> section, whose start is smem[rank]).
inline std::vector<std::unique_ptr<Block>> blocks;
inline thread_local Block* block = nullptr;
inline thread_local int rank = 0;
inline char* smem[16];
inline char* dynamic_smem[16];  // each rank's dynamic shared memory (DYNAMIC_SMEM)
inline std::unique_ptr<std::barrier<>> cluster;
inline thread_local std::optional<std::barrier<>::arrival_token> cluster_arrival;

// What went wrong in the launch, where a kernel can go on (its result is then wrong): the first
// message, which the launcher returns.
inline std::mutex fault_lock;
inline std::string fault_text;
template <class... A> inline void fault(const char* format, A... args) {
    char text[256];
    std::snprintf(text, sizeof text, format, args...);
    std::lock_guard<std::mutex> hold(fault_lock);
    if (fault_text.empty()) fault_text = text;
}

inline std::barrier<>& warp_barrier() { return *block->warps[threadIdx.x / I4_WARP]; }
inline std::barrier<>& group_barrier() { return *block->groups[threadIdx.x / 128]; }
inline std::array<u32, 8>& slot(int lane) { return block->slots[threadIdx.x / I4_WARP * I4_WARP + lane]; }

// Run clusters ids[0..count) of a grid of `grid` blocks of `bs` threads, `kc` blocks a cluster;
// kernel(rank) runs the kernel copy of the block of that rank.
inline void run(int grid, int bs, int kc, const int* ids, int count, const std::function<void(int)>& kernel) {
    blocks.clear();
    for (int r = 0; r < kc; ++r) blocks.push_back(std::make_unique<Block>(bs));
    cluster = std::make_unique<std::barrier<>>(kc * bs);
    gridDim.x = grid;
    blockDim.x = bs;
    auto next_cluster = [&]() noexcept {
        for (auto& b : blocks) b->reset();
        cluster = std::make_unique<std::barrier<>>(kc * bs);
    };
    std::barrier<decltype(next_cluster)> between(kc * bs, next_cluster);
    std::vector<std::thread> threads;
    for (int t = 0; t < kc * bs; ++t)
        threads.emplace_back([&, t] {
            rank = t / bs;
            threadIdx.x = t % bs;
            for (int i = 0; i < count; ++i) {
                block = blocks[rank].get();
                blockIdx.x = ids[i] * kc + rank;
                kernel(rank);
                warp_barrier().arrive_and_drop();
                group_barrier().arrive_and_drop();
                block->all->arrive_and_drop();
                cluster->arrive_and_drop();
                between.arrive_and_wait();
            }
        });
    for (auto& th : threads) th.join();
}
}  // namespace i4emu

inline void __syncthreads() { i4emu::block->all->arrive_and_wait(); }
inline void __syncwarp() { i4emu::warp_barrier().arrive_and_wait(); }
template <class A, class B> inline auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) { return a < b ? b : a; }

// -- number formats: IEEE half, bfloat16 -----------------------------------------------------
inline float bits_to_f(u32 v) { float f; std::memcpy(&f, &v, 4); return f; }
inline u32 f_bits(float f) { u32 v; std::memcpy(&v, &f, 4); return v; }
// v rounded to nearest even in a binary format of `mant` stored mantissa bits and exponent bias
// `bias` (normals from 1 - bias to bias): its bits (finite values; beyond the range: infinity).
inline u32 i4_round(double v, int mant, int bias) {
    const int ebits = bias == 15 ? 5 : 8;
    const u32 sign = std::signbit(v) ? 1u << (mant + ebits) : 0u;
    if (std::isnan(v)) return (((1u << ebits) - 1) << mant) | (1u << (mant - 1));
    const double a = std::fabs(v);
    const double min_normal = std::ldexp(1.0, 1 - bias);
    if (a < min_normal) return sign | (u32)std::nearbyint(std::ldexp(a, bias - 1 + mant));
    int e;
    const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    double q = std::nearbyint(std::ldexp(m, mant + 1));
    if (q == std::ldexp(1.0, mant + 1)) { q /= 2; ++e; }
    const int E = e - 1 + bias;
    if (E >= (1 << ebits) - 1) return sign | (((1u << ebits) - 1) << mant);
    return sign | ((u32)E << mant) | ((u32)q - (1u << mant));
}
inline double i4_decode(u32 bits, int mant, int bias) {
    const int ebits = bias == 15 ? 5 : 8;
    const bool neg = bits >> (mant + ebits) & 1;
    const int E = bits >> mant & ((1 << ebits) - 1);
    const u32 f = bits & ((1u << mant) - 1);
    double v = E == 0 ? std::ldexp((double)f, 1 - bias - mant)
             : E == (1 << ebits) - 1 ? (f ? NAN : INFINITY) : std::ldexp((double)(f | 1u << mant), E - bias - mant);
    return neg ? -v : v;
}
inline double h_val(u32 h) { return i4_decode(h & 0xFFFFu, 10, 15); }
inline double bf_val(u32 h) { return i4_decode(h & 0xFFFFu, 7, 127); }
inline float h_to_f(u16 h) { return (float)h_val(h); }
inline u16 f_to_h(float f) { return (u16)i4_round(f, 10, 15); }
inline float bf16_to_f(u16 h) { return bits_to_f((u32)h << 16); }
inline u16 f_to_bf16(float f) {  // as the GPU preludes do it (finite values)
    const u32 u = f_bits(f);
    return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float fma_f32(float a, float b, float c) { return std::fma(a, b, c); }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline u32 h2_pack(double lo, double hi) { return i4_round(lo, 10, 15) | i4_round(hi, 10, 15) << 16; }
inline u32 h2_sub(u32 a, u32 b) { return h2_pack(h_val(a) - h_val(b), h_val(a >> 16) - h_val(b >> 16)); }
inline u32 h2_fma(u32 a, u32 b, u32 c) {
    return h2_pack(h_val(a) * h_val(b) + h_val(c), h_val(a >> 16) * h_val(b >> 16) + h_val(c >> 16));
}
inline u32 bf2_fma(u32 a, u32 b, u32 c) {
    return i4_round(bf_val(a) * bf_val(b) + bf_val(c), 7, 127) | i4_round(bf_val(a >> 16) * bf_val(b >> 16) + bf_val(c >> 16), 7, 127) << 16;
}

// -- loads (plain reads: the CPU has one memory) ----------------------------------------------
inline u32x4 load_stream16(const void* p) { u32x4 v; std::memcpy(&v, p, 16); return v; }
inline u32x2 load_stream8(const void* p) { u32x2 v; std::memcpy(&v, p, 8); return v; }
inline u32x4 load_stream16_l2_256(const void* p) { return load_stream16(p); }
inline u32x4 load_cached16(const void* p) { return load_stream16(p); }
inline u32x4 load_first16(const void* p) { return load_stream16(p); }
inline u32x4 load_coherent16(const void* p) { return load_stream16(p); }
inline u32x2 load_cached8(const void* p) { return load_stream8(p); }
inline u16 load_cached_u16(const u16* p) { return *p; }
inline u32 load_cached_u32(const void* p) { u32 v; std::memcpy(&v, p, 4); return v; }
inline u8 load_cached_u8(const u8* p) { return *p; }
inline void prefetch_l2(const void*) {}
inline void issue_barrier(u32) {}
#define I4_GRID_WAIT()
#define I4_GRID_LAUNCH_DEPENDENTS()

// -- byte permute (PTX prmt.b32, default mode) ------------------------------------------------
inline u32 prmt(u32 a, u32 b, u32 sel) {
    const unsigned long long bytes = (unsigned long long)b << 32 | a;
    u32 d = 0;
    for (int i = 0; i < 4; ++i) {
        const u32 s = sel >> (4 * i) & 0xFu;
        u32 byte = (u32)(bytes >> (8 * (s & 7u))) & 0xFFu;
        if (s & 8u) byte = byte & 0x80u ? 0xFFu : 0u;  // replicate the sign bit
        d |= byte << (8 * i);
    }
    return d;
}

// -- warp-wide steps ---------------------------------------------------------------------------
inline float warp_xor(float v, int mask) {
    const int lane = threadIdx.x % I4_WARP;
    i4emu::slot(lane)[0] = f_bits(v);
    i4emu::warp_barrier().arrive_and_wait();
    const float r = bits_to_f(i4emu::slot(lane ^ mask)[0]);
    i4emu::warp_barrier().arrive_and_wait();
    return r;
}

// mma.sync m16n8k16 row.col: lane (g, t) holds A rows g, g+8 at k 2t, 2t+1 (a0, a1) and 2t+8, 2t+9
// (a2, a3), B column g at k 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1), D rows g, g+8 at columns 2t, 2t+1.
inline void i4_mma(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, bool bf16) {
    if (I4_WARP != 32) std::abort();  // a 32-thread warp's step (no AMD kernel uses it)
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    auto& mine = i4emu::slot(lane);
    mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
    i4emu::warp_barrier().arrive_and_wait();
    auto val = [&](u32 word, int half) { return bf16 ? bf_val(word >> (16 * half)) : h_val(word >> (16 * half)); };
    auto A = [&](int r, int k) { return val(i4emu::slot(4 * (r % 8) + (k % 8) / 2)[(r >= 8) + 2 * (k >= 8)], k % 2); };
    auto B = [&](int k, int c) { return val(i4emu::slot(4 * c + (k % 8) / 2)[4 + (k >= 8)], k % 2); };
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
        double sum = d[i];
        for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, c);
        out[i] = (float)sum;
    }
    i4emu::warp_barrier().arrive_and_wait();
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}
inline void mma_16816(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { i4_mma(d, a0, a1, a2, a3, b0, b1, false); }
inline void mma_16816_bf16(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { i4_mma(d, a0, a1, a2, a3, b0, b1, true); }

// Thread block clusters: a store into block `rank`'s copy of the same shared variable (the same
// offset in its section), and the barrier of every thread of the cluster, whole or in halves.
inline void cluster_store(float* p, u32 rank, float v) {
    std::memcpy((char*)p - i4emu::smem[i4emu::rank] + i4emu::smem[rank], &v, sizeof v);
}
inline void cluster_sync() { i4emu::cluster->arrive_and_wait(); }
inline void cluster_arrive_relaxed() { i4emu::cluster_arrival.emplace(i4emu::cluster->arrive()); }
inline void cluster_wait() { i4emu::cluster->wait(std::move(*i4emu::cluster_arrival)); }

// -- Hopper's asynchronous units, as the prefill GEMM (gemm_sm90.hip) takes them ---------------
// Shared-memory addresses are offsets into the block's dynamic shared memory. An mbarrier phase
// completes when its arrivals and its expected bytes are all in; a bulk copy is a memcpy that
// then counts its bytes; wgmma runs at once (its fence, commit and wait are no-ops), summing
// exact products in double and rounding once to fp32 (as mma above). The partial sums' flags:
// the blocks run in order, so a flag a block waits for is raised already, or never will be.
#define DYNAMIC_SMEM(name) unsigned char* const name = (unsigned char*)i4emu::dynamic_smem[i4emu::rank]
inline u32 smem_address(const void* p) { return (u32)((const char*)p - i4emu::dynamic_smem[i4emu::rank]); }
inline char* smem_pointer(u32 a) { return i4emu::dynamic_smem[i4emu::rank] + a; }
namespace i4emu {
// Under the block's mbarrier lock: the phase completes once nothing is pending.
inline void mbar_settle(Mbarrier& m) {
    if (m.pending == 0 && m.tx == 0) {
        m.phase ^= 1u;
        m.pending = m.count;
        block->mbar_done.notify_all();
    }
}
inline Mbarrier& mbarrier(u32 bar) {
    auto it = block->mbarriers.find(bar);
    if (it == block->mbarriers.end()) {  // no way on from here: the threads would wait for nothing
        std::fprintf(stderr, "emulated kernel: mbarrier at shared offset %u used before mbarrier.init\n", bar);
        std::abort();
    }
    return it->second;
}
}  // namespace i4emu
inline void mbar_init(u32 bar, u32 count) {
    std::lock_guard<std::mutex> hold(i4emu::block->mbar_lock);
    i4emu::block->mbarriers[bar] = i4emu::Mbarrier{count, count, 0, 0};
}
inline void mbar_init_fence() {}
inline void mbar_arrive(u32 bar) {
    std::lock_guard<std::mutex> hold(i4emu::block->mbar_lock);
    auto& m = i4emu::mbarrier(bar);
    --m.pending;
    i4emu::mbar_settle(m);
}
inline void mbar_wait(u32 bar, u32 parity) {  // until the phase of that parity has completed
    std::unique_lock<std::mutex> hold(i4emu::block->mbar_lock);
    auto& m = i4emu::mbarrier(bar);
    i4emu::block->mbar_done.wait(hold, [&] { return m.phase != parity; });
}
inline void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    {
        std::lock_guard<std::mutex> hold(i4emu::block->mbar_lock);
        auto& m = i4emu::mbarrier(bar);
        m.tx += bytes;  // arrive.expect_tx
        --m.pending;
    }
    std::memcpy(smem_pointer(dst), src, bytes);
    std::lock_guard<std::mutex> hold(i4emu::block->mbar_lock);
    auto& m = i4emu::mbarrier(bar);
    m.tx -= bytes;  // complete_tx
    i4emu::mbar_settle(m);
}
inline void flag_raise(unsigned* f) { __atomic_store_n(f, 1u, __ATOMIC_RELEASE); }
inline void flag_wait(const unsigned* f) {
    if (!__atomic_load_n(f, __ATOMIC_ACQUIRE))
        i4emu::fault("block %u waits for a flag no earlier block raised (on a GPU: forever)", blockIdx.x);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float4 __ldcg(const float4* p) { return *p; }
inline void wg_fence() {}
inline void wg_commit() {}
template <int PENDING> inline void wg_wait() {}
template <class T> inline void keep(T&) {}
// wgmma m64n128k16, A from registers, B (128 x 16, K-major) from shared memory by its descriptor
// (K-major, 128-byte swizzle, 8-row groups 1024 bytes apart; the start address in bits 0-13, in
// 16-byte units): warp w of the warpgroup holds A rows 16w.. as mma's A (lane g, t: rows g, g+8
// at k 2t, 2t+1 and 2t+8, 2t+9); element (n, k) of B is at start + 1024 (n / 8) + 128 (n % 8) +
// 2 k, its 16-byte chunk swizzled (address bits 4-6 ^= bits 7-9); thread (w, g, t) holds D
// element i at row 16w + g + 8((i%4)/2), column 8(i/4) + 2t + i%2.
template <bool BF16>
inline void wgmma_m64n128k16(float (&d)[64], const u32 (&a)[4], unsigned long long desc) {
    const int me = threadIdx.x % 128, base = threadIdx.x - me, w = me / 32, g = me % 32 / 4, t = me % 4;
    auto& mine = i4emu::block->slots[threadIdx.x];
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    i4emu::group_barrier().arrive_and_wait();
    auto val = [](u32 word, int half) { return BF16 ? bf_val(word >> (16 * half)) : h_val(word >> (16 * half)); };
    auto A = [&](int r, int k) {  // r within the warp's 16 rows
        return val(i4emu::block->slots[base + 32 * w + 4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2);
    };
    const u32 start = (u32)(desc & 0x3FFFu) << 4;
    auto B = [&](int n, int k) {
        const u32 addr = start + 1024u * (n / 8) + 128u * (n % 8) + 2u * k;
        u16 word;
        std::memcpy(&word, smem_pointer(addr ^ (((addr >> 7) & 7u) << 4)), 2);
        return val(word, 0);
    };
    double arow[2][16];
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 16; ++k) arow[h][k] = A(g + 8 * h, k);
    float out[64];
    for (int i = 0; i < 64; ++i) {
        const int n = 8 * (i / 4) + 2 * t + i % 2;
        double sum = d[i];
        for (int k = 0; k < 16; ++k) sum += arow[(i % 4) / 2][k] * B(n, k);
        out[i] = (float)sum;
    }
    i4emu::group_barrier().arrive_and_wait();
    for (int i = 0; i < 64; ++i) d[i] = out[i];
}

// -- the dot products of the simt kernel (both vendors' forms) ---------------------------------
typedef float dot_acc_t;
inline dot_acc_t dot_zero() { return 0.0f; }
#if I4_HAS_DOT2
// v_dot2_f32_f16 (AMD): both products and the accumulator summed, rounded once.
inline dot_acc_t dot2(dot_acc_t acc, u32 w, u32 x) { return (float)(h_val(w) * h_val(x) + h_val(w >> 16) * h_val(x >> 16) + acc); }
#else
inline dot_acc_t dot2(dot_acc_t acc, u32 w, u32 x) {
    return std::fma((float)h_val(w >> 16), (float)h_val(x >> 16), std::fma((float)h_val(w), (float)h_val(x), acc));
}
#endif
inline float dot_finish(dot_acc_t acc) { return acc; }
