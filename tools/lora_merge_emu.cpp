// Host emulation of the LoRA merge kernels (cuda/dit/lora_merge.cu): the kernels' own source
// compiled as C++, one std::thread per CUDA thread and one block at a time (so `__shared__` is a
// static shared by the block's threads; a barrier is __syncthreads), on shapes that are not
// multiples of the tile or the rank chunk. Checked bit for bit against the host merge's
// arithmetic (src/lora/merge.rs: products and sums rounded in fp32, rank in order, · alpha/rank,
// · scale, a sum from zero, one rounding), for the low-rank, LoHa and Kronecker kernels, one term
// and three through the fp32 sum, bf16 and f32 weights; the controls (BUG 1) must differ.
//   g++ -O2 -std=c++20 -pthread -ffp-contract=off -Wno-unknown-pragmas -I cuda tools/lora_merge_emu.cpp -o /tmp/lme && /tmp/lme
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "cuda_host.h"

#define LORA_EMU 1
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
dim3e blockDim;
std::barrier<>* block_barrier = nullptr;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
namespace moss_elem {
inline float ld(const float* p, long i) { return p[i]; }
inline float ld(const __nv_bfloat16* p, long i) { return __bfloat162float(p[i]); }
inline void st(float* p, long i, float v) { p[i] = v; }
inline void st(__nv_bfloat16* p, long i, float v) { p[i] = __float2bfloat16_rn(v); }
}  // namespace moss_elem

#include "dit/lora_merge.cu"

// Run `k` on a grid, block after block, each block's threads at once.
static void launch(dim3e grid, unsigned threads, const std::function<void()>& k) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            std::barrier<> bar(threads);
            block_barrier = &bar;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; t++)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    k();
                });
            for (auto& t : ts) t.join();
        }
}

static std::mt19937 rng(7);
static std::vector<float> normals(size_t n, float std) {
    std::normal_distribution<float> d(0.f, std);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// One term, as the host computes it: rows × cols of the delta (before alpha/rank and scale).
struct Term {
    int kind;  // 0 low rank, 1 LoHa, 2 kron
    std::vector<float> a, b, c, d;
    int r = 0, r2 = 0, ac = 0, br = 0, bc = 0;
    long row0 = 0;
    float fs = 1, scale = 1;
};
static float product(const std::vector<float>& u, const std::vector<float>& v, int r, long cols, long i, long j) {
    float o = 0;
    for (int k = 0; k < r; k++) o = o + u[i * r + k] * v[k * cols + j];
    return o;
}
static float delta(const Term& t, long cols, long i, long j) {
    switch (t.kind) {
    case 0: return product(t.a, t.b, t.r, cols, i, j);
    case 1: return product(t.a, t.b, t.r, cols, i, j) * product(t.c, t.d, t.r2, cols, i, j);
    default: {
        long gi = t.row0 + i;
        return t.a[(gi / t.br) * t.ac + j / t.bc] * t.b[(gi % t.br) * t.bc + j % t.bc];
    }
    }
}
template <typename TW>
static std::vector<TW> host_merge(std::vector<TW> w, const std::vector<Term>& terms, long rows, long cols) {
    std::vector<float> sum(rows * cols, 0.f);
    for (auto& t : terms)
        for (long i = 0; i < rows; i++)
            for (long j = 0; j < cols; j++) {
                float x = delta(t, cols, i, j);
                if (t.fs != 1.f) x = x * t.fs;
                sum[i * cols + j] = sum[i * cols + j] + t.scale * x;
            }
    for (long e = 0; e < rows * cols; e++) moss_elem::st(w.data(), e, moss_elem::ld(w.data(), e) + sum[e]);
    return w;
}
// The kernels of `ctl` (0 production, 1 control), one launch per term, as src/backend/cuda/lora.rs.
template <typename TW>
static std::vector<TW> device_merge(std::vector<TW> w, const std::vector<Term>& terms, long rows, long cols, int ctl) {
    std::vector<float> acc(rows * cols, NAN);
    dim3e tiles{(unsigned)((cols + 63) / 64), (unsigned)((rows + 63) / 64), 1};
    for (size_t k = 0; k < terms.size(); k++) {
        const Term& t = terms[k];
        int mode = (k > 0) | ((k + 1 == terms.size()) << 1);
        TW* W = w.data();
        float* A = terms.size() > 1 ? acc.data() : nullptr;
        if (t.kind == 0)
            launch(tiles, 256, [&] {
                if (ctl) lora_lowrank_impl<TW, 0, 1>(W, A, t.a.data(), t.b.data(), nullptr, nullptr, rows, cols, t.r, 0, t.fs, t.scale, mode);
                else lora_lowrank_impl<TW, 0, 0>(W, A, t.a.data(), t.b.data(), nullptr, nullptr, rows, cols, t.r, 0, t.fs, t.scale, mode);
            });
        else if (t.kind == 1)
            launch(tiles, 256, [&] {
                if (ctl) lora_lowrank_impl<TW, 1, 1>(W, A, t.a.data(), t.b.data(), t.c.data(), t.d.data(), rows, cols, t.r, t.r2, t.fs, t.scale, mode);
                else lora_lowrank_impl<TW, 1, 0>(W, A, t.a.data(), t.b.data(), t.c.data(), t.d.data(), rows, cols, t.r, t.r2, t.fs, t.scale, mode);
            });
        else
            launch({3, 1, 1}, 256, [&] {
                if (ctl) lora_kron_impl<TW, 1>(W, A, t.a.data(), t.b.data(), rows, cols, t.row0, t.ac, t.br, t.bc, t.fs, t.scale, mode);
                else lora_kron_impl<TW, 0>(W, A, t.a.data(), t.b.data(), rows, cols, t.row0, t.ac, t.br, t.bc, t.fs, t.scale, mode);
            });
    }
    return w;
}

template <typename TW>
static bool check(const char* what, const std::vector<Term>& terms, long rows, long cols) {
    std::vector<TW> w(rows * cols);
    auto v = normals(rows * cols, 0.02f);
    for (long e = 0; e < rows * cols; e++) moss_elem::st(w.data(), e, v[e]);
    auto want = host_merge(w, terms, rows, cols);
    auto got = device_merge(w, terms, rows, cols, 0);
    auto ctl = device_merge(w, terms, rows, cols, 1);
    auto differ = [&](const std::vector<TW>& x) {
        long n = 0;
        for (long e = 0; e < rows * cols; e++) n += std::memcmp(&x[e], &want[e], sizeof(TW)) != 0;
        return n;
    };
    long bad = differ(got), caught = differ(ctl), moved = 0;
    for (long e = 0; e < rows * cols; e++) moved += std::memcmp(&w[e], &want[e], sizeof(TW)) != 0;
    bool ok = bad == 0 && caught > 0 && moved > rows * cols / 2;
    std::printf("%-36s %s: %ld of %ld differ from the host merge; control: %ld differ; %ld changed by the merge\n",
                what, ok ? "ok  " : "FAIL", bad, rows * cols, caught, moved);
    return ok;
}

int main() {
    const long rows = 200, cols = 130;  // 4 x 3 tiles, ragged; ranks not multiples of 16
    Term lr{0, normals(rows * 37, 0.1f), normals(37 * cols, 0.3f)};
    lr.r = 37, lr.fs = 0.5f, lr.scale = 0.8f;
    Term loha{1, normals(rows * 5, 0.3f), normals(5 * cols, 0.3f), normals(rows * 19, 0.3f), normals(19 * cols, 0.3f)};
    loha.r = 5, loha.r2 = 19, loha.fs = 2.f, loha.scale = -0.7f;
    Term kron{2, normals(4 * 5, 1.f), normals(60 * 26, 0.01f)};  // rows 40..239 of a 240 x 130 kron
    kron.ac = 5, kron.br = 60, kron.bc = 26, kron.row0 = 40, kron.scale = 1.3f;
    bool ok = true;
    ok &= check<__nv_bfloat16>("low rank, bf16", {lr}, rows, cols);
    ok &= check<__nv_bfloat16>("LoHa, bf16", {loha}, rows, cols);
    ok &= check<__nv_bfloat16>("kron rows 40.., bf16", {kron}, rows, cols);
    ok &= check<__nv_bfloat16>("three terms through the sum, bf16", {lr, loha, kron}, rows, cols);
    ok &= check<float>("low rank, f32", {lr}, rows, cols);
    ok &= check<float>("two terms through the sum, f32", {kron, lr}, rows, cols);
    std::printf(ok ? "lora merge emulation: all ok\n" : "lora merge emulation: FAILED\n");
    return ok ? 0 : 1;
}
