"""CUDA-event timing shared by the PyTorch sides of the stage benchmarks."""
import time

import torch


def cuda_ms(fn, reps, warmup=1):
    """fn `warmup` times untimed, then `reps` timed runs (CUDA events on a GPU, the wall clock on
    the CPU): (median ms, every ms sorted, the last output)."""
    out = None
    for _ in range(warmup):
        out = fn()
    gpu = torch.cuda.is_available()
    ts = []
    for _ in range(reps):
        if gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            out = fn()
            ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2], ts, out
