// Host emulation of cuda/gdr.cu (the chunk-parallel gated delta rule): the kernel bodies compiled as
// C++ with one std::thread per CUDA thread (barriers for __syncthreads and warp shuffles,
// synchronous cp.async), checked against the plain per-token recurrence in double, for index and
// synchronisation bugs before a device run. f32 only.
//   g++ -O2 -std=c++20 -pthread -I cuda bench/gdr_emu.cpp -o /tmp/gdr_emu && /tmp/gdr_emu
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#define GDR_EMU 1
#define __device__
#define __forceinline__ inline
using std::min;
struct dim3e {
    unsigned x = 0, y = 0, z = 0;
};
thread_local dim3e threadIdx;
dim3e blockIdx, gridDim;
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

namespace emu {
float* smem = nullptr;
std::barrier<>* bar = nullptr;
std::vector<std::unique_ptr<std::barrier<>>> wbar;
float slot[32][32];
}  // namespace emu
#define GDR_SMEM(name) float* name = emu::smem
inline void __syncthreads() { emu::bar->arrive_and_wait(); }
inline float shfl(float v, int src_lane) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu::slot[w][l] = v;
    emu::wbar[w]->arrive_and_wait();
    float r = emu::slot[w][src_lane];
    emu::wbar[w]->arrive_and_wait();
    return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) { return shfl(v, (threadIdx.x % 32) ^ o); }
inline float __shfl_up_sync(unsigned, float v, int o) {
    int l = threadIdx.x % 32;
    float r = shfl(v, l >= o ? l - o : l);
    return r;
}
namespace moss_elem {
inline float ld(const float* p, long i) { return p[i]; }
inline void st(float* p, long i, float v) { p[i] = v; }
inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
}  // namespace moss_elem
namespace moss_mma {
inline void cp_async16(void* d, const void* s, bool) { std::memcpy(d, s, 16); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
}  // namespace moss_mma

#include "gdr.cu"

// Run `body` as a grid (gx, gy) of 256-thread blocks, one block at a time.
static void launch(unsigned gx, unsigned gy, size_t smem_floats, const std::function<void()>& body) {
    const int nt = 256;
    std::vector<float4> sm(smem_floats / 4 + 1);
    gridDim = {gx, gy, 1};
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            blockIdx = {bx, by, 0};
            // poison shared memory: reads of unwritten slots show up as NaN
            std::fill((float*)sm.data(), (float*)sm.data() + smem_floats, NAN);
            emu::smem = (float*)sm.data();
            std::barrier<> b(nt);
            emu::bar = &b;
            emu::wbar.clear();
            for (int w = 0; w < nt / 32; w++) emu::wbar.emplace_back(new std::barrier<>(32));
            std::vector<std::thread> th;
            for (int t = 0; t < nt; t++)
                th.emplace_back([&, t] {
                    threadIdx = {(unsigned)t, 0, 0};
                    body();
                });
            for (auto& t : th) t.join();
        }
}

static double run_case(int L, int Hk, int Hv, int dk, int dv, bool bug, unsigned seed) {
    using namespace moss_gdr;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(L * Hk * dk), k(L * Hk * dk), v(L * Hv * dv), g(L * Hv), beta(L * Hv);
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : g) x = -std::exp(nd(rng) - 2.5f);
    for (auto& x : beta) x = 1.f / (1.f + std::exp(-1.5f * nd(rng)));
    int nc = (L + GC - 1) / GC;
    long nb = (long)nc * Hv;
    // scratch poisoned with NaN: a read of anything not written must show
    std::vector<float> Kd(nb * GC * GD, NAN), Wk(nb * GC * GD, NAN), U0(nb * GC * GD, NAN), U(nb * GC * GD, NAN),
        S(nb * GD * GD, NAN), Wqk(nb * GC * GC, NAN), gam(nb * GC, NAN), out(L * Hv * dv, NAN);
    launch(nb, 1, 2 * GC * PKS + GC * AS + 4 * GC, [&] {
        prep_impl<float>(Kd.data(), Wk.data(), U0.data(), Wqk.data(), gam.data(), q.data(), k.data(), v.data(),
                         g.data(), beta.data(), L, Hk, Hv, dk, dv);
    });
    int ncb = (dv + SQ_CB - 1) / SQ_CB;
    launch(Hv * ncb, 1, 2 * (2 * GC * SQ_LD + GC * SQ_UL) + GD * SQ_UL + GC * SQ_UL,
           [&] { seq_impl(S.data(), U.data(), Wk.data(), Kd.data(), U0.data(), gam.data(), nc, Hv, ncb); });
    launch(nb, (dv + OC - 1) / OC, GC * PKS + GD * OL + 2 * GC * OL + GC, [&] {
        if (bug)
            out_impl<float, 1>(out.data(), q.data(), S.data(), U.data(), Wqk.data(), gam.data(), L, Hk, Hv, dk, dv);
        else
            out_impl<float, 0>(out.data(), q.data(), S.data(), U.data(), Wqk.data(), gam.data(), L, Hk, Hv, dk, dv);
    });
    // reference: the per-token recurrence in double
    double num = 0, den = 0;
    for (int h = 0; h < Hv; h++) {
        int kh = h / (Hv / Hk);
        std::vector<double> s(dk * dv, 0.0), qn(dk), kn(dk), u(dv);
        for (int t = 0; t < L; t++) {
            double sq = 0, sk = 0;
            for (int a = 0; a < dk; a++) {
                sq += (double)q[(t * Hk + kh) * dk + a] * q[(t * Hk + kh) * dk + a];
                sk += (double)k[(t * Hk + kh) * dk + a] * k[(t * Hk + kh) * dk + a];
            }
            for (int a = 0; a < dk; a++) {
                qn[a] = q[(t * Hk + kh) * dk + a] / std::sqrt(sq + 1e-6) / std::sqrt((double)dk);
                kn[a] = k[(t * Hk + kh) * dk + a] / std::sqrt(sk + 1e-6);
            }
            double dec = std::exp((double)g[t * Hv + h]);
            for (auto& x : s) x *= dec;
            for (int j = 0; j < dv; j++) {
                double acc = 0;
                for (int a = 0; a < dk; a++) acc += kn[a] * s[a * dv + j];
                u[j] = beta[t * Hv + h] * (v[(t * Hv + h) * dv + j] - acc);
            }
            for (int a = 0; a < dk; a++)
                for (int j = 0; j < dv; j++) s[a * dv + j] += kn[a] * u[j];
            for (int j = 0; j < dv; j++) {
                double o = 0;
                for (int a = 0; a < dk; a++) o += qn[a] * s[a * dv + j];
                double got = out[(t * Hv + h) * dv + j];
                if (std::isnan(got)) got = 1e30;
                num += (got - o) * (got - o);
                den += o * o;
            }
        }
    }
    return std::sqrt(num / den);
}

int main() {
    struct C {
        int L, Hk, Hv, dk, dv;
    } cs[] = {{200, 2, 4, 128, 128}, {64, 1, 2, 128, 128}, {130, 1, 2, 16, 24}, {77, 2, 2, 128, 40}};
    int bad = 0;
    for (auto c : cs) {
        double e = run_case(c.L, c.Hk, c.Hv, c.dk, c.dv, false, 1);
        double eb = run_case(c.L, c.Hk, c.Hv, c.dk, c.dv, true, 1);
        bool ok = e < 1e-5 && (c.L <= 64 || eb > 1e-2);
        bad += !ok;
        printf("L=%d Hk=%d Hv=%d dk=%d dv=%d: rel L2 %.3e (bound 1e-5), planted bug %.3e %s\n", c.L, c.Hk, c.Hv, c.dk,
               c.dv, e, eb, ok ? "ok" : "FAIL");
    }
    return bad != 0;
}
