// Host emulation of the Hopper fused-epilogue GEMMs (cuda/common/sm90a/gemm_tile.cuh with
// cuda/dit/sm90a/linear_situ_glu.cu and linear_qkv_norm_rope.cu): the kernels' own source compiled
// as C++, one std::thread per CUDA thread, a cluster's CTAs at once. Emulated: TMA boxes (128-byte
// swizzle, zero fill past the edges, multicast into the CTAs of a mask), mbarriers (arrivals,
// transaction bytes, phases; a wait that never ends is reported as a deadlock), remote arrivals,
// cluster barriers, warp shuffles, and wgmma from the shared-memory descriptors, run at the wait
// that retires its group (so a stage handed back to the producer too early is overwritten before
// the products read it). Checked bit for bit against the same arithmetic written plainly on the
// host (products summed in K order in fp32, rounded to bf16, then the epilogue's formula), bf16
// and e4m3, on shapes with a partial row tile and odd counts of row and column tiles, grids of a
// few CTAs that walk several tiles each; every planted control must differ.
//   g++ -O2 -std=c++20 -pthread -ffp-contract=off -Wno-unknown-pragmas -I cuda -I cuda/common -I cuda/dit tools/gemm_tile_emu.cpp -o /tmp/gte && /tmp/gte
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cuda_host.h"

#define GEMM_EMU 1
#define __grid_constant__
#define __cluster_dims__(...)
#define __launch_bounds__(...)
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
    uint32_t x, y;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
struct float2 {
    float x, y;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

// ---- the emulated machine: a cluster's CTAs, their shared memory, mbarriers, warps ----
namespace emu {
constexpr int MAX_CTAS = 2, THREADS = 384;
struct Bar {
    int count = 0, pending = 0;
    long tx = 0;
    unsigned phase = 0;
};
struct Cluster {
    int ctas = 1;
    std::vector<char> smem[MAX_CTAS];
    char* base[MAX_CTAS] = {};
    std::map<uint32_t, Bar> bars[MAX_CTAS];
    std::mutex mu;
    std::condition_variable cv;
    std::unique_ptr<std::barrier<>> all;                 // the cluster barrier
    std::unique_ptr<std::barrier<>> warp[MAX_CTAS][12];  // a warp's shuffles
    std::unique_ptr<std::barrier<>> named[MAX_CTAS][3];  // bar.sync 1, 2 of 128 threads
    std::unique_ptr<std::barrier<>> wgroup[MAX_CTAS][3];  // a warpgroup's .sync.aligned wgmma steps
    uint32_t slot[MAX_CTAS][12][32];
    bool dead = false;
    long where[MAX_CTAS][THREADS] = {};  // the mbarrier wait of each thread (2·address + parity; −1 the closing barrier), for the deadlock report
};
Cluster* cl = nullptr;
thread_local int rank = 0;
inline Cluster& C() { return *cl; }
[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "gemm_tile_emu: %s (cta %d, thread %u)\n", what, rank, threadIdx.x);
    std::exit(1);
}
// Completes the barrier's phase when nothing is pending (caller holds the lock).
inline void settle(Bar& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.phase++;
        b.pending = b.count;
        C().cv.notify_all();
    }
}
inline Bar& bar(int cta, uint32_t addr) {
    auto it = C().bars[cta].find(addr);
    if (it == C().bars[cta].end()) fail("mbarrier used before its init");
    return it->second;
}
inline void arrive(int cta, uint32_t addr, long tx) {
    std::lock_guard<std::mutex> g(C().mu);
    Bar& b = bar(cta, addr);
    b.tx += tx;
    if (--b.pending < 0) fail("more arrivals than the mbarrier's count");
    settle(b);
}
inline void complete_tx(int cta, uint32_t addr, long bytes) {
    std::lock_guard<std::mutex> g(C().mu);
    Bar& b = bar(cta, addr);
    b.tx -= bytes;
    settle(b);
}
}  // namespace emu
inline char* gemm_emu_smem() { return emu::C().base[emu::rank]; }

namespace moss_wg {
inline uint32_t saddr(const void* p) { return (uint32_t)((const char*)p - emu::C().base[emu::rank]); }
template <int N>
inline void regs_dec() {}
template <int N>
inline void regs_inc() {}
template <int K>
inline void pin_all(float (&)[K]) {}
inline uint32_t pack_bf16(float lo, float hi) { return __float2bfloat16_rn(lo).bits | (uint32_t)__float2bfloat16_rn(hi).bits << 16; }
inline uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) |
           (1ull << 62);
}
// wgmma: recorded at issue, run when a wait retires its group (the hardware reads shared memory
// until then).
struct Op {
    float* d;
    uint64_t da, db;
    int acc, fp8;
};
thread_local std::vector<Op> open_group;
thread_local std::vector<std::vector<Op>> groups;
inline float e4m3(uint8_t c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.f + m / 8.f, e - 7);
    return s ? -v : v;
}
// Element (row, k) of a K-major operand with 128-byte rows, 8-row groups sbo apart, 128-byte swizzle.
inline float operand(uint64_t dsc, int row, int k, int fp8) {
    const uint32_t start = (uint32_t)(dsc & 0x3FFF) << 4, sbo = (uint32_t)((dsc >> 32) & 0x3FFF) << 4;
    if (((dsc >> 62) & 3) != 1) emu::fail("a descriptor without the 128-byte swizzle");
    const uint32_t lin = start + (row / 8) * sbo + (row % 8) * 128 + k * (fp8 ? 1 : 2);
    const uint32_t phys = lin ^ (((lin >> 7) & 7) << 4);
    const char* p = emu::C().base[emu::rank] + phys;
    if (fp8) return e4m3((uint8_t)*p);
    uint16_t b;
    std::memcpy(&b, p, 2);
    return __bfloat162float({b});
}
inline void run(const Op& op) {
    const int w = (threadIdx.x & 127) >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, kn = op.fp8 ? 32 : 16;
    for (int i = 0; i < 32; i++)
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < 2; e++) {
                const int row = 16 * w + g + 8 * r, col = 8 * i + 2 * t + e;
                float s = op.acc ? op.d[4 * i + 2 * r + e] : 0.f;
                for (int k = 0; k < kn; k++) s = s + operand(op.da, row, k, op.fp8) * operand(op.db, col, k, op.fp8);
                op.d[4 * i + 2 * r + e] = s;
            }
}
inline void wgmma_ss_n256(float (&d)[128], uint64_t da, uint64_t db, int acc) { open_group.push_back({d, da, db, acc, 0}); }
inline void wgmma_ss_n256_e4m3(float (&d)[128], uint64_t da, uint64_t db, int acc) { open_group.push_back({d, da, db, acc, 1}); }
// The fence, commit and wait are .sync.aligned: the warpgroup's threads meet there (an emulated
// thread cannot release a stage while another of its warp has yet to read it).
inline void wg_sync() { emu::C().wgroup[emu::rank][threadIdx.x / 128]->arrive_and_wait(); }
inline void wg_fence() { wg_sync(); }
inline void wg_commit() {
    groups.push_back(open_group);
    open_group.clear();
    wg_sync();
}
template <int N>
inline void wg_wait() {
    while ((int)groups.size() > N) {
        for (auto& op : groups.front()) run(op);
        groups.erase(groups.begin());
    }
    wg_sync();
}
}  // namespace moss_wg

namespace moss_tma {
// The emulator's tensor map: a row-major 2-D tensor {dim0 columns (contiguous), dim1 rows} and the box.
struct TmaMap {
    const char* base;
    long dim0, dim1, row_bytes;
    int elem, box0, box1;
};
inline void mbar_init(uint32_t addr, uint32_t count) {
    std::lock_guard<std::mutex> g(emu::C().mu);
    emu::C().bars[emu::rank][addr] = {(int)count, (int)count, 0, 0};
}
inline void mbar_init_fence() {}
inline void mbar_expect_tx(uint32_t addr, uint32_t bytes) { emu::arrive(emu::rank, addr, bytes); }
inline void mbar_arrive(uint32_t addr) { emu::arrive(emu::rank, addr, 0); }
inline void mbar_arrive_cluster(uint32_t addr, uint32_t cta) {
    if ((int)cta >= emu::C().ctas) emu::fail("a remote arrival past the cluster");
    emu::arrive((int)cta, addr, 0);
}
inline void mbar_wait(uint32_t addr, uint32_t parity) {
    emu::C().where[emu::rank][threadIdx.x] = addr * 2 + parity;
    std::unique_lock<std::mutex> g(emu::C().mu);
    const bool done = emu::C().cv.wait_for(g, std::chrono::seconds(30), [&] {
        return emu::C().dead || (emu::bar(emu::rank, addr).phase & 1) != parity;
    });
    if (!done || emu::C().dead) {
        if (!emu::C().dead) {  // the first to give up reports the barriers and who waits where
            for (int c = 0; c < emu::C().ctas; c++)
                for (auto& [ad, b] : emu::C().bars[c])
                    std::fprintf(stderr, "cta %d mbarrier @%u: phase %u, %d arrivals and %ld bytes pending\n", c, ad, b.phase, b.pending, b.tx);
            for (int c = 0; c < emu::C().ctas; c++)
                for (int t = 0; t < emu::THREADS; t++)
                    if (emu::C().where[c][t] >= 0)
                        std::fprintf(stderr, "cta %d thread %d waits on @%ld parity %ld\n", c, t, emu::C().where[c][t] / 2, emu::C().where[c][t] % 2);
        }
        emu::C().dead = true;
        emu::C().cv.notify_all();
        emu::fail("deadlock: an mbarrier wait that never completes");
    }
}
// The box at (column c0, row c1) into CTA cta's shared memory at dst, swizzled, then its bytes
// completed on that CTA's barrier.
inline void box(int cta, uint32_t dst, const TmaMap* m, int c0, int c1, uint32_t bar) {
    if (dst % 128 != 0 || m->box0 * m->elem != 128) emu::fail("a box that is not 128-byte rows at a 128-byte offset");
    char* s = emu::C().base[cta];
    for (int r = 0; r < m->box1; r++)
        for (int b = 0; b < 128; b++) {
            const long row = (long)c1 + r, col = (long)c0 + b / m->elem;
            const uint32_t lin = dst + r * 128 + b, phys = lin ^ (((lin >> 7) & 7) << 4);
            const bool in = row >= 0 && row < m->dim1 && col >= 0 && col < m->dim0;
            s[phys] = in ? m->base[row * m->row_bytes + (long)c0 * m->elem + b] : 0;
        }
    emu::complete_tx(cta, bar, (long)m->box1 * 128);
}
inline void tma_load(uint32_t dst, const TmaMap* m, int c0, int c1, uint32_t bar) { box(emu::rank, dst, m, c0, c1, bar); }
inline void tma_load_multicast(uint32_t dst, const TmaMap* m, int c0, int c1, uint32_t bar, uint16_t mask) {
    for (int cta = 0; cta < emu::C().ctas; cta++)
        if (mask >> cta & 1) box(cta, dst, m, c0, c1, bar);
    if (mask >> emu::C().ctas) emu::fail("a multicast mask past the cluster");
}
inline void prefetch_map(const TmaMap*) {}
inline void cluster_sync() {
    emu::C().where[emu::rank][threadIdx.x] = -1;
    emu::C().all->arrive_and_wait();
}
}  // namespace moss_tma

inline uint32_t shfl(uint32_t v, int src) {
    auto& c = emu::C();
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    c.slot[emu::rank][w][l] = v;
    c.warp[emu::rank][w]->arrive_and_wait();
    const uint32_t r = c.slot[emu::rank][w][src];
    c.warp[emu::rank][w]->arrive_and_wait();
    return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) { return __uint_as_float(shfl(__float_as_uint(v), (threadIdx.x % 32) ^ o)); }
inline uint32_t __shfl_xor_sync(unsigned, uint32_t v, int o) { return shfl(v, (threadIdx.x % 32) ^ o); }
inline int __shfl_xor_sync(unsigned, int v, int o) { return (int)shfl((uint32_t)v, (threadIdx.x % 32) ^ o); }

// bar.sync 1 + c, 128: the in-consumer epilogue's warpgroup barrier around its staging rows.
inline void named_sync128(int id) { emu::C().named[emu::rank][id]->arrive_and_wait(); }

#include "dit/sm90a/linear_situ_glu.cu"
#include "dit/sm90a/linear_qkv_norm_rope.cu"

// CTAs a cluster and the rows of the x map's box, as the host launches the kernels.
#define EMU_CLUSTER moss_gemm::CLUSTER
#define EMU_X_BOX_ROWS moss_gemm::X_BOX_ROWS

// Run `kernel` on a persistent grid of `blocks` CTAs, one cluster at a time, each CTA's 384 threads at once.
static void launch(int blocks, const std::function<void()>& kernel) {
    const int ctas = EMU_CLUSTER;
    gridDim = {(unsigned)blocks, 1, 1};
    for (int c0 = 0; c0 < blocks; c0 += ctas) {
        emu::Cluster c;
        c.ctas = ctas;
        for (int r = 0; r < ctas; r++) {
            c.smem[r].assign(DIT_SITU_GEMM_SMEM + 1024, (char)0x5a);  // stale bytes, not zeros
            c.base[r] = c.smem[r].data() + ((1024 - ((uintptr_t)c.smem[r].data() & 1023)) & 1023);
            for (int w = 0; w < 12; w++) c.warp[r][w] = std::make_unique<std::barrier<>>(32);
            for (int n = 1; n < 3; n++) c.named[r][n] = std::make_unique<std::barrier<>>(128);
            for (int g = 0; g < 3; g++) c.wgroup[r][g] = std::make_unique<std::barrier<>>(128);
        }
        c.all = std::make_unique<std::barrier<>>(ctas * emu::THREADS);
        emu::cl = &c;
        std::vector<std::thread> ts;
        for (int r = 0; r < ctas; r++)
            for (int t = 0; t < emu::THREADS; t++)
                ts.emplace_back([&, r, t] {
                    emu::rank = r;
                    threadIdx = {(unsigned)t, 0, 0};
                    blockIdx = {(unsigned)(c0 + r), 0, 0};
                    moss_wg::groups.clear();
                    moss_wg::open_group.clear();
                    kernel();
                });
        for (auto& t : ts) t.join();
        emu::cl = nullptr;
    }
}
// min(SMs, tiles) blocks rounded down to whole clusters (at least one), as the host launches them.
static int grid_of(int tiles, int sms) { return std::max(std::min(tiles, sms) / EMU_CLUSTER, 1) * EMU_CLUSTER; }

// ---- data and the plain reference ----
static std::mt19937 rng(11);
static float bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
struct Operand {  // a [rows, k] matrix as the kernel reads it: bf16, or e4m3 codes with row scales
    int rows, k;
    bool fp8;
    std::vector<__nv_bfloat16> b;
    std::vector<uint8_t> q;
    std::vector<float> scale;
    Operand(int rows_, int k_, bool fp8_) : rows(rows_), k(k_), fp8(fp8_) {
        std::normal_distribution<float> d(0.f, 1.f);
        std::uniform_int_distribution<int> code(0, 255);
        std::uniform_real_distribution<float> sc(0.002f, 0.02f);
        if (fp8) {
            for (long i = 0; i < (long)rows * k; i++) {
                int c = code(rng);
                if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
                q.push_back((uint8_t)c);
            }
            for (int r = 0; r < rows; r++) scale.push_back(sc(rng));
        } else {
            for (long i = 0; i < (long)rows * k; i++) b.push_back(__float2bfloat16_rn(d(rng)));
        }
    }
    float at(int r, int kk) const { return fp8 ? moss_wg::e4m3(q[(long)r * k + kk]) : __bfloat162float(b[(long)r * k + kk]); }
    moss_tma::TmaMap map(int box_rows) const {
        const int elem = fp8 ? 1 : 2;
        return {fp8 ? (const char*)q.data() : (const char*)b.data(), k, rows, (long)k * elem, elem, 128 / elem, box_rows};
    }
};
// u[r][c] = Σ_k x[r][k]·w[c][k] in fp32, k in order (the emulated wgmma's order); short_k: the last K step left out.
static std::vector<float> product(const Operand& x, const Operand& w, bool short_k) {
    const int kend = short_k ? x.k - (x.fp8 ? 128 : 64) : x.k;
    std::vector<float> u((long)x.rows * w.rows);
    for (int r = 0; r < x.rows; r++)
        for (int c = 0; c < w.rows; c++) {
            float s = 0.f;
            for (int k = 0; k < kend; k++) s = s + x.at(r, k) * w.at(c, k);
            u[(long)r * w.rows + c] = s;
        }
    return u;
}

static int failures = 0;
static void report(const char* what, const std::vector<__nv_bfloat16>& got, const std::vector<float>& want, bool control) {
    long diff = 0, first = -1;
    for (size_t i = 0; i < want.size(); i++)
        if (got[i].bits != __float2bfloat16_rn(want[i]).bits || std::isnan(want[i])) {
            if (first < 0) first = (long)i;
            diff++;
        }
    const bool ok = control ? diff > 0 : diff == 0;
    if (!ok) failures++;
    std::printf("%-58s %s  %ld of %zu outputs differ%s\n", what, ok ? "ok  " : "FAIL", diff, want.size(),
                control ? " (a control: must differ)" : "");
    if (!ok && !control && first >= 0)
        std::printf("    first at %ld: got %g, want %g\n", first, __bfloat162float(got[first]), bf(want[first]));
}

// ---- SiTU-GLU: out[r, j] = situ_fast(bf16(u[r, j]), bf16(u[r, F + j])) ----
static void situ_case(int m, int f, int k, bool fp8, int sms) {
    Operand x(m, k, fp8), w(2 * f, k, fp8);
    const auto tx = x.map(EMU_X_BOX_ROWS), tw = w.map(128);
    const int tiles = ((m + 127) / 128) * (f / 128), blocks = grid_of(tiles, sms);
    const auto u = product(x, w, false);
    std::vector<float> want((long)m * f);
    for (int r = 0; r < m; r++)
        for (int j = 0; j < f; j++) {
            float h = u[(long)r * 2 * f + j], g = u[(long)r * 2 * f + f + j];
            if (fp8) {
                h = h * x.scale[r] * w.scale[j];
                g = g * x.scale[r] * w.scale[f + j];
            }
            want[(long)r * f + j] = situ_fast<0>(bf(h), bf(g));
        }
    for (int bug = 0; bug < 3; bug++) {
        std::vector<__nv_bfloat16> out((long)m * f, __nv_bfloat16{0x7fc0});
        float* xs = fp8 ? x.scale.data() : nullptr;
        float* ws = fp8 ? w.scale.data() : nullptr;
        launch(blocks, [&] {
            if (fp8) {
                if (bug == 0) moss_dit_linear_situ_glu_fp8(tx, tw, out.data(), xs, ws, m, f, k);
                if (bug == 1) moss_dit_linear_situ_glu_fp8_swapped_control(tx, tw, out.data(), xs, ws, m, f, k);
                if (bug == 2) moss_dit_linear_situ_glu_fp8_short_k_control(tx, tw, out.data(), xs, ws, m, f, k);
            } else {
                if (bug == 0) moss_dit_linear_situ_glu(tx, tw, out.data(), m, f, k);
                if (bug == 1) moss_dit_linear_situ_glu_swapped_control(tx, tw, out.data(), m, f, k);
                if (bug == 2) moss_dit_linear_situ_glu_short_k_control(tx, tw, out.data(), m, f, k);
            }
        });
        char what[160];
        std::snprintf(what, sizeof what, "situ_glu%s M=%d F=%d K=%d, %d CTAs%s", fp8 ? "_fp8" : "", m, f, k, blocks,
                      bug == 1 ? ", swapped control" : bug == 2 ? ", short-K control" : "");
        report(what, out, want, bug != 0);  // a control must differ from the production formula
    }
}

// ---- q|k|v with per-head RMSNorm + RoPE of q and k (the quad's order of the sum of squares) ----
static std::vector<float> qkv_reference(const std::vector<float>& u, const Operand& x, const Operand& w, int m, int d,
                                        const std::vector<__nv_bfloat16>& wq, const std::vector<__nv_bfloat16>& wk,
                                        const std::vector<__nv_bfloat16>& cs, const std::vector<__nv_bfloat16>& sn, float eps,
                                        int bug) {
    const int n3 = 3 * d;
    std::vector<float> want((long)m * n3);
    for (int r = 0; r < m; r++)
        for (int h0 = 0; h0 < n3; h0 += 128) {
            float a[128];
            for (int c = 0; c < 128; c++) {
                float v = u[(long)r * n3 + h0 + c];
                if (x.fp8) v = v * (x.scale[r] * w.scale[h0 + c]);
                a[c] = bf(v);
            }
            const int part = h0 / d;
            if (part == 2) {
                for (int c = 0; c < 128; c++) want[(long)r * n3 + h0 + c] = a[c];
                continue;
            }
            float p[4];
            for (int t = 0; t < 4; t++) {
                float ss = 0.f;
                for (int i = 0; i < 16; i++) ss += a[8 * i + 2 * t] * a[8 * i + 2 * t] + a[8 * i + 2 * t + 1] * a[8 * i + 2 * t + 1];
                p[t] = ss;
            }
            const float ss = (p[0] + p[1]) + (p[2] + p[3]);
            const float inv = rsqrtf(ss / 128.f + eps);
            const auto& wt = (part == 0 || bug == 1) ? wq : wk;
            for (int j = 0; j < 64; j++) {
                const float ya = a[j] * inv * __bfloat162float(wt[j]), yb = a[j + 64] * inv * __bfloat162float(wt[j + 64]);
                const float co = __bfloat162float(cs[(long)r * 64 + j]), si = (bug == 2 ? -1.f : 1.f) * __bfloat162float(sn[(long)r * 64 + j]);
                want[(long)r * n3 + h0 + j] = ya * co - yb * si;
                want[(long)r * n3 + h0 + j + 64] = yb * co + ya * si;
            }
        }
    return want;
}
static void qkv_case(int m, int d, int k, bool fp8, int sms) {
    Operand x(m, k, fp8), w(3 * d, k, fp8);
    const auto tx = x.map(EMU_X_BOX_ROWS), tw = w.map(128);
    std::normal_distribution<float> nd(1.f, 0.3f);
    std::uniform_real_distribution<float> ang(-3.14159f, 3.14159f);
    std::vector<__nv_bfloat16> wq(128), wk(128), cs((long)m * 64), sn((long)m * 64);
    for (auto& v : wq) v = __float2bfloat16_rn(nd(rng));
    for (auto& v : wk) v = __float2bfloat16_rn(nd(rng));
    for (long i = 0; i < (long)m * 64; i++) {
        const float a = ang(rng);
        cs[i] = __float2bfloat16_rn(std::cos(a));
        sn[i] = __float2bfloat16_rn(std::sin(a));
    }
    const float eps = 1e-6f;
    const int tiles = ((m + 127) / 128) * (3 * d / 256), blocks = grid_of(tiles, sms);
    const auto u = product(x, w, false);
    const auto want = qkv_reference(u, x, w, m, d, wq, wk, cs, sn, eps, 0);
    for (int bug = 0; bug < 3; bug++) {
        std::vector<__nv_bfloat16> out((long)m * 3 * d, __nv_bfloat16{0x7fc0});
        float* xs = fp8 ? x.scale.data() : nullptr;
        float* ws = fp8 ? w.scale.data() : nullptr;
        launch(blocks, [&] {
            if (fp8) {
                if (bug == 0) moss_dit_linear_qkv_norm_rope_fp8(tx, tw, out.data(), xs, ws, wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
                if (bug == 1) moss_dit_linear_qkv_norm_rope_fp8_k_weight_control(tx, tw, out.data(), xs, ws, wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
                if (bug == 2) moss_dit_linear_qkv_norm_rope_fp8_sign_control(tx, tw, out.data(), xs, ws, wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
            } else {
                if (bug == 0) moss_dit_linear_qkv_norm_rope(tx, tw, out.data(), wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
                if (bug == 1) moss_dit_linear_qkv_norm_rope_k_weight_control(tx, tw, out.data(), wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
                if (bug == 2) moss_dit_linear_qkv_norm_rope_sign_control(tx, tw, out.data(), wq.data(), wk.data(), cs.data(), sn.data(), m, d, k, eps);
            }
        });
        char what[160];
        std::snprintf(what, sizeof what, "qkv_norm_rope%s M=%d D=%d K=%d, %d CTAs%s", fp8 ? "_fp8" : "", m, d, k, blocks,
                      bug == 1 ? ", k-weight control" : bug == 2 ? ", sign control" : "");
        report(what, out, want, bug != 0);
    }
}

int main() {
    // 333 rows: 3 row tiles, the last partial; F = 384 / D = 256: 3 column tiles; 4 or 6 CTAs walk
    // several tiles each (the ring and the staging wrap across tiles).
    situ_case(333, 384, 192, false, 4);
    situ_case(333, 512, 128, false, 6);
    situ_case(200, 256, 256, true, 4);
    qkv_case(333, 256, 192, false, 4);
    qkv_case(130, 512, 128, false, 6);
    qkv_case(333, 256, 256, true, 4);
    if (failures) std::printf("%d FAILED\n", failures);
    else std::printf("all passed\n");
    return failures ? 1 : 0;
}
