"""Measures the two GPU ceilings the performance notes divide by: the cuBLAS bf16 matrix rate
(8192^3 products on random data, through torch.matmul) and the device-to-device copy
bandwidth (bytes read + written). Median of 10 timed runs after 3 warm-ups, CUDA events.
"""
import json
import statistics

import torch


def timed(fn, repeats=10, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(times)


def main():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t_mm = timed(lambda: a @ b)
    src = torch.randn(1 << 30, device="cuda", dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    t_copy = timed(lambda: dst.copy_(src))
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "bf16_matmul_tflops": round(2 * n**3 / t_mm / 1e12, 1),
                      "copy_tb_per_s": round(2 * src.numel() * 4 / t_copy / 1e12, 2)}))


if __name__ == "__main__":
    main()
