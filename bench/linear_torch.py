"""torch at the DiT's shapes, timed exactly like `moss check`'s timing (CUDA events around each
call, median of 50 after 10 warm-up runs, bf16): torch.matmul x [M, K] @ w[N, K].T (no bias) and
scaled_dot_product_attention over [1, 24, 4224, 128] (torch picks its flash kernel).
Run on the GPU machine:  python3 bench/linear_torch.py
"""
import torch

torch.backends.cuda.matmul.allow_tf32 = False


def median_ms(f, warmup=10, reps=50):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench(m, k, n):
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    ms = median_ms(lambda: torch.matmul(x, w.t()))
    print(f"  torch.matmul {m}x{k} · {k}x{n}: {ms:.4f} ms  ({2 * m * n * k / ms / 1e9:.0f} TFLOP/s)")


def bench_attention(n=4224, h=24, hd=128):
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(1, h, n, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    f = torch.nn.functional.scaled_dot_product_attention
    ms = median_ms(lambda: f(q, k, v))
    print(f"  torch sdpa {n}x{h}x{hd}: {ms:.4f} ms  ({4 * n * n * h * hd / ms / 1e9:.0f} TFLOP/s)")


if __name__ == "__main__":
    print(f"timing: torch {torch.__version__} on {torch.cuda.get_device_name()}, bf16, median of 50 after 10 warm-up runs")
    for m, k, n in [(4224, 3072, 3072), (4224, 3072, 16384)]:
        bench(m, k, n)
    bench_attention()
