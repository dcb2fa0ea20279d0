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


def test_parts_name_every_bar():
    """bench/bars.sh runs what --part prints: every attention bar's case, every training row."""
    cases = run("--part", "attention").stdout.strip().split(",")
    assert cases == ["hero-causal", "gpt2", "hero-window-docs", "llama-long", "hero-d256"]
    runs = run("--part", "compile").stdout.split() + run("--part", "long").stdout.split()
    assert sorted(runs) == sorted(["gpt2_bf16_b16_compile", "llama1b_bf16_compile", "llama1b_32k",
                                   "llama1b_32k_compile", "llama1b_64k", "llama1b_128k"])
    assert run("--part", "nope").returncode != 0
    done = run()
    assert done.returncode != 0 and "--part" in done.stderr


def test_long_rows(tmp_path):
    """Issue 17's long rows: ours trained (a summary with a finite loss; the peak from the
    memory line, or from the step lines of older logs), PyTorch eager's running out of memory
    reported as a result, a run without a summary or with a NaN loss as not trained."""
    (tmp_path / "ceilings.json").write_text('{"gpu": "NVIDIA H200", "bf16_matmul_tflops": 743}\n')
    (tmp_path / "ft_llama1b_32k.log").write_text(
        "step   10/10 | train loss 9.9 | (917.55 ms | 35713 tok/s | peak used: 63417 MB | ...)\n"
        "steps 10 | final train loss 9.91239 | 35559 tok/s | 921.485 ms/step\n"
        "memory:    ...; peak used 63417 MB over the run, 63000 MB over the timed steps\n")
    write_jsonl(tmp_path / "torch_llama1b_32k.json", [
        {"gpu": "NVIDIA H200", "error": "out of memory", "steps_run": 0,
         "peak_allocated_mb": 126000}])
    (tmp_path / "ft_llama1b_64k.log").write_text(
        "step    6/6 | train loss 11.7 | (3421.18 ms | 19156 tok/s | peak used: 106036 MB | ...)\n"
        "steps 6 | final train loss 11.7089 | 19080 tok/s | 3434.64 ms/step\n")
    (tmp_path / "ft_llama1b_128k.log").write_text(
        "step    4/4 | train loss nan | (14645.65 ms | 8950 tok/s | peak used: 51661 MB | ...)\n"
        "steps 4 | final train loss nan | 8924 tok/s | 14686.6 ms/step\n")
    report, _ = verdicts(str(tmp_path))
    assert report["gpus"] == ["NVIDIA H200"]
    rows = {r["row"]: r for r in report["long"]}
    assert rows["llama1b_32k"]["trained"]
    assert rows["llama1b_32k"]["ours"] == "35,559 tok/s, 63,417 MB"
    assert rows["llama1b_32k"]["peer"] == "PyTorch eager: out of memory (126,000 MB allocated)"
    assert rows["llama1b_64k"]["trained"]
    assert rows["llama1b_64k"]["ours"] == "19,080 tok/s, 106,036 MB"
    assert not rows["llama1b_128k"]["trained"]
    table = run(str(tmp_path)).stdout
    assert "| 17 | llama1b_128k | no summary (see the log) | - | **no** |" in table


def test_bars_sh_checks_its_parts_before_running_any():
    """bench/bars.sh: --help names every part; an unknown part stops it before any bench runs
    (no GPU needed to get that far)."""
    script = os.path.join(REPO, "bench", "bars.sh")
    done = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for part in ("attention", "compile", "long"):
        assert f"bench/bars.sh {part}" in done.stdout
    done = subprocess.run([script, "attention", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown part 'nope'" in done.stderr
    assert "== part" not in done.stdout
    done = subprocess.run([script], capture_output=True, text=True)
    assert done.returncode == 2 and "bench/bars.sh attention" in done.stderr
