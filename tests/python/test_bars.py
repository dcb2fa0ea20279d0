"""bench/bars.py: the issues' bars against a call's bench outputs. On session 44's committed
results (an H100 call: the GPU is named as not the bars' card), each verdict as measured; on
synthetic outputs, the row selection (the first flash configuration, not its deterministic or
packed rows), the deterministic backward's cost table, the memory side of a training bar, and
the errors."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "bench", "bars.py")
CALL3 = os.path.join(REPO, "docs", "results", "session44", "call3_h100")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def verdicts(*dirs):
    done = run("--json", *dirs)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    return report, {r["bar"]: r for r in report["bars"]}


def test_session44_call():
    report, bars = verdicts(CALL3)
    assert report["gpus"] == ["NVIDIA H100 80GB HBM3"]
    assert report["deterministic"] == []  # that call ran without --deterministic
    assert len(bars) == 12
    met = {bar: r["met"] for bar, r in bars.items()}
    assert met["gpt2 bwd >= 1x sdpa-cudnn"] and met["llama-long bwd >= 1x sdpa-cudnn"]
    assert not met["hero-causal fwd >= 1.05x sdpa-cudnn"]
    assert not met["hero-causal bwd >= 1.05x sdpa-cudnn"]
    assert abs(bars["hero-window-docs bwd >= 1.5x flex"]["ratio"] - 6.168 / 4.087) < 2e-3
    assert met["gpt2_bf16_b16_compile >= 1.1x torch.compile tok/s, peak at most its"]
    r32k = bars["llama1b_32k_compile >= 1.1x torch.compile tok/s, peak less than its"]
    assert not r32k["met"] and abs(r32k["ratio"] - 34747 / 32044) < 1e-6
    table = run(CALL3).stdout
    assert "(the bars are defined on the H200)" in table


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_row_selection_and_memory(tmp_path):
    meta = {"meta": True, "gpu": "NVIDIA H200"}
    flash = {"impl": "flash", "case": "gpt2", "dir": "bwd", "deterministic": False}
    write_jsonl(tmp_path / "attention_flashtrain.jsonl", [
        meta,
        dict(flash, config="bwd=128x128/384/tma", median_ms=0.150),
        dict(flash, config="bwd=128x128/384/tma deterministic", deterministic=True,
             median_ms=0.100),
        dict(flash, config="bwd=128x128/384/tma packed", median_ms=0.120),
        dict(flash, config="bwd=64x128/384/tma", median_ms=0.140),
    ])
    write_jsonl(tmp_path / "attention_pytorch.jsonl", [
        meta, {"impl": "sdpa-cudnn", "case": "gpt2", "dir": "bwd", "median_ms": 0.165}])
    (tmp_path / "ft_gpt2_bf16_b16_compile.log").write_text(
        "steps 20 | final train loss 7.9 | 550000 tok/s | 30 ms/step\n"
        "memory:    ...; peak used 9000.5 MB over the run, 9000.5 MB over the timed steps\n")
    write_jsonl(tmp_path / "torch_gpt2_bf16_b16_compile.json", [
        {"gpu": "NVIDIA H200", "tok_per_s": 450000, "timed_peak_allocated_mb": 8648}])
    report, bars = verdicts(str(tmp_path))
    assert report["gpus"] == ["NVIDIA H200"]
    gpt2 = bars["gpt2 bwd >= 1x sdpa-cudnn"]
    assert gpt2["ours"] == "0.150 ms" and gpt2["met"]  # the first configuration's row
    step = bars["gpt2_bf16_b16_compile >= 1.1x torch.compile tok/s, peak at most its"]
    assert step["ratio"] > 1.1 and not step["met"]  # faster, but more memory
    assert "defined on the H200" not in run(str(tmp_path)).stdout
    # The deterministic row is not a bar: it is its own table, its cost against the default's.
    assert report["deterministic"] == [
        {"case": "gpt2", "default_ms": 0.150, "deterministic_ms": 0.100,
         "cost": 0.100 / 0.150}]
    table = run(str(tmp_path)).stdout
    assert "| gpt2 | 0.150 | 0.100 | 0.67x |" in table


def test_errors(tmp_path):
    done = run(str(tmp_path / "missing"))
    assert done.returncode != 0 and "not a directory" in done.stderr
    done = run(str(tmp_path))
    assert done.returncode != 0 and "no bench output found" in done.stderr
