"""scripts/ncu_sass_summary.py on small SASS source pages written as Nsight Compute writes them
(a kernel-name row, then the header): the opcode shares, the waits grouped by barrier offset
(a try-wait and the branch that loops on it make one site; the tries are the try-wait's count),
and a page without stall samples or without a source page at all."""

import csv
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "ncu_sass_summary.py")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "# Samples", "Instructions Executed"]


def write_page(path, rows, stalls=True):
    header = HEADER if stalls else [h for h in HEADER if not h.startswith("Warp Stall")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "void kernel<(int)1>(Args)"])
        w.writerow(header)
        for i, (source, samples, executed) in enumerate(rows):
            cells = {"Address": hex(0x1000 + 16 * i), "Source": source,
                     "Warp Stall Sampling (All Samples)": samples,
                     "Warp Stall Sampling (Not-issued Samples)": samples, "# Samples": samples,
                     "Instructions Executed": executed}
            w.writerow([cells[h] for h in header])


def run(path):
    out = subprocess.run([sys.executable, SCRIPT, str(path)], capture_output=True, text=True,
                         check=True)
    return out.stdout


PAGE = [
    ("      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR18+0x18a00], R23 ;", 10, 300),
    ("@!P1  BRA 0x7effcb7b0020 ;", 290, 300),
    ("      HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;", 100, 400),
    ("      WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", 200, 100),
    ("      FFMA R1, R2, R3, R4 ;", 50, 1000),
    ("      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R9+URZ+0x18a20], R2 ;", 40, 50),
    ("@!P1  BRA 0x2000 ;", 60, 50),
    ("      BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;", 150, 100),
    ("      MUFU.EX2 R5, R5 ;", 100, 700),
]  # 1000 samples, 3000 instructions


def test_opcodes_and_waits(tmp_path):
    path = tmp_path / "page.csv"
    write_page(path, PAGE)
    text = run(path)
    assert "executed warp instructions 3,000; by opcode (share, stall-sample share):" in text
    lines = text.splitlines()
    ffma = next(line for line in lines if line.split()[0] == "FFMA")
    assert ffma.split()[1:] == ["33.3%", "5.0%"]
    bra = next(line for line in lines if line.split()[0] == "BRA")
    assert bra.split()[1:] == ["11.7%", "35.0%"]  # 350 of 3000 executed, 350 of 1000 samples
    waits = lines[lines.index("waits (share of the 1,000 stall samples; times executed):") + 1:]
    assert [w.split() for w in waits] == [
        ["mbarrier", "wait", "+0x18a00", "30.0%", "300"],  # try-wait 10 + its branch 290
        ["warpgroup", "product", "wait", "20.0%", "100"],
        ["named", "barrier", "15.0%", "100"],
        ["mbarrier", "wait", "+0x18a20", "10.0%", "50"],
    ]


def test_without_stall_samples(tmp_path):
    path = tmp_path / "page.csv"
    write_page(path, PAGE, stalls=False)
    text = run(path)
    assert "by opcode (share; no stall samples collected):" in text
    assert "waits" not in text
    assert next(line for line in text.splitlines() if line.split()[0] == "FFMA").split()[1:] == [
        "33.3%"]


def test_without_a_source_page(tmp_path):
    path = tmp_path / "page.csv"
    path.write_text('==ERROR== the report has no source page\n')
    assert "no SASS source page" in run(path)
