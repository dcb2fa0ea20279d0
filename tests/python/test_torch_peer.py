"""bench/torch_peer.py's step-profile attribution on synthetic profiler events: each kernel goes
to the row of the labelled region around the op that launched it, the region's own GPU-side
annotation (which the profiler links to the range and which spans the range's kernels) is not
counted again, backward ops go to their forward op's row by sequence number, and what no region
names goes by name pattern. Needs PyTorch (the module imports it); skipped without."""

from types import SimpleNamespace

import pytest

import repo_module

pytest.importorskip("torch")


def load_peer():
    return repo_module.load("bench/torch_peer.py")


_clock = [0]


def op(name, parent=None, kernels=(), seq=-1, self_us=0.0):
    """A CPU event as torch.profiler's FunctionEvent shows it to attribute()."""
    _clock[0] += 1
    return SimpleNamespace(
        name=name, device_type="DeviceType.CPU", time_range=SimpleNamespace(start=_clock[0]),
        sequence_nr=seq, cpu_parent=parent, self_cpu_time_total=self_us,
        kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels])


def test_kernels_go_to_their_region_once():
    peer = load_peer()
    qkv = op("gemm qkv", kernels=[("gemm qkv", 100.0)])  # the range's GPU annotation
    mm = op("aten::mm", parent=qkv, kernels=[("sm90_xmma_gemm_bf16", 80.0)], seq=7)
    optimizer = op("optimizer", kernels=[("optimizer", 500.0)])
    adam = op("aten::_fused_adamw_", parent=optimizer,
              kernels=[("fused_adamw_kernel", 20.0), ("fused_adamw_kernel", 10.0)])
    rows = peer.attribute([qkv, mm, optimizer, adam], on_gpu=True)
    assert rows["gemm qkv"] == [1, 80.0]
    assert rows["optimizer"] == [2, 30.0]


def test_backward_by_sequence_number_and_patterns():
    peer = load_peer()
    region = op("gemm mlp-up")
    fwd = op("aten::addmm", parent=region, kernels=[("gemm_kernel", 50.0)], seq=11)
    bwd_node = op("autograd::engine::evaluate_function: AddmmBackward0", seq=11)
    bwd = op("aten::mm", parent=bwd_node, kernels=[("gemm_kernel", 90.0)])
    attention = op("aten::_cudnn_attention_backward",
                   kernels=[("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma", 70.0)])
    stray = op("aten::fill_", kernels=[("vectorized_elementwise_kernel", 5.0)])
    rows = peer.attribute([region, fwd, bwd_node, bwd, attention, stray], on_gpu=True)
    assert rows["gemm mlp-up"] == [2, 140.0]
    assert rows["attention backward"] == [1, 70.0]
    assert sum(calls for calls, _ in rows.values()) == 3  # the fill is left to "other"
