"""scripts/kernel_hashes.py on cubins made here (64-bit ELF files with .text sections), extracted
by a stand-in for cuobjdump: which family each kernel belongs to, that the code of a family and
nothing else moves its hash, that a variant with the same code is flagged, and the errors."""

import os
import stat
import struct

import repo_module

kernel_hashes = repo_module.load("scripts/kernel_hashes.py")

TMA_FWD = "_ZN2ft9attention4cuda10tma_detail18tma_forward_kernelILi6ELb0EEEvNS2_14TmaForwardArgsE"
TMA_BWD = "_ZN2ft9attention4cuda14tma_bwd_detail19tma_backward_kernelILi3ELb1EEEvNS2_15TmaBackwardArgsE"
PREPROCESS = "_ZN2ft9attention4cuda31backward_preprocess_bf16_kernelILi16EEEvPK13__nv_bfloat16"


def elf(sections):
    """A minimal 64-bit little-endian ELF file with the named sections (name -> bytes)."""
    names = [""] + list(sections) + [".shstrtab"]
    shstrtab = b"".join(n.encode() + b"\0" for n in names)
    offsets, at = [], 0
    for n in names:
        offsets.append(at)
        at += len(n) + 1
    body, placed = b"", []
    for n in names[1:-1]:
        placed.append((64 + len(body), len(sections[n])))
        body += sections[n]
    placed.append((64 + len(body), len(shstrtab)))
    body += shstrtab
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(names),
                          len(names) - 1)
    table = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for i, (offset, size) in enumerate(placed, start=1):
        table += struct.pack("<IIQQQQIIQQ", offsets[i], 1, 0, 0, offset, size, 0, 0, 1, 0)
    return header + body + table


def fake_cuobjdump(tmp_path, cubins):
    """A cuobjdump whose -xelf writes `cubins` (file name -> bytes) into the working directory,
    chosen by the binary's name (the binaries here are empty files)."""
    store = tmp_path / "cubins"
    store.mkdir(exist_ok=True)
    for binary, files in cubins.items():
        (store / binary).mkdir()
        for name, data in files.items():
            (store / binary / name).write_bytes(data)
        (tmp_path / binary).write_bytes(b"")
    tool = tmp_path / "bin" / "cuobjdump"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f'#!/bin/sh\ncp "{store}"/"$(basename "$3")"/* .\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(tool.parent)


def test_kernels_fall_into_their_families():
    assert kernel_hashes.family_of(TMA_FWD) == "tma_fwd"
    assert kernel_hashes.family_of(TMA_BWD) == "tma_bwd"
    assert kernel_hashes.family_of("_ZN2ft9attention4cuda12wgmma_detail20wgmma_backward_kernelI") == "wgmma"
    assert kernel_hashes.family_of("_ZN2ft9attention4cuda21flash_forward_kernelILi64E") == "mma"
    assert kernel_hashes.family_of(PREPROCESS) == "other"


def test_text_sections_are_read_and_other_sections_ignored(tmp_path):
    path = tmp_path / "a.cubin"
    path.write_bytes(elf({".text." + TMA_FWD: b"\x01\x02", ".nv.info." + TMA_FWD: b"\x09",
                          ".text." + PREPROCESS: b"\x03"}))
    assert dict(kernel_hashes.text_sections(str(path))) == {TMA_FWD: b"\x01\x02", PREPROCESS: b"\x03"}


def test_only_the_changed_family_differs_and_equal_code_is_flagged(tmp_path, monkeypatch, capsys):
    main = {"fwd.cubin": elf({".text." + TMA_FWD: b"\x01" * 16}),
            "bwd.cubin": elf({".text." + TMA_BWD: b"\x02" * 16, ".text." + PREPROCESS: b"\x03"})}
    branch = dict(main, **{"fwd.cubin": elf({".text." + TMA_FWD: b"\x01" * 15 + b"\x07"})})
    # The same code with other metadata (a rebuilt object): the same hashes.
    rebuilt = dict(main, **{"fwd.cubin": elf({".text." + TMA_FWD: b"\x01" * 16,
                                              ".nv.info." + TMA_FWD: b"\x05"})})
    tools = fake_cuobjdump(tmp_path, {"main": main, "branch": branch, "rebuilt": rebuilt})
    monkeypatch.setenv("PATH", tools + os.pathsep + os.environ["PATH"])
    args = [f"{n}={tmp_path / n}" for n in ("main", "branch", "rebuilt")]
    assert kernel_hashes.main(args) == 0
    out = capsys.readouterr().out
    assert "branch differs from main in: tma_fwd\n" in out
    assert "branch: tma kernels unlike main's: fwd 6 (1 of 2 the same)" in out
    assert "WARNING: rebuilt has the same device code as main" in out
    assert "wgmma=none" in out


def test_tma_kernels_are_named_by_plan_and_segment_ids():
    assert kernel_hashes.tma_label(kernel_hashes.tma_instance(TMA_FWD)) == "fwd 6"
    assert kernel_hashes.tma_label(kernel_hashes.tma_instance(TMA_BWD)) == "bwd 3+seg"
    assert kernel_hashes.tma_instance(PREPROCESS) is None


def test_each_differing_tma_kernel_is_named(tmp_path, monkeypatch, capsys):
    fwd_seg = TMA_FWD.replace("ILi6ELb0E", "ILi6ELb1E")
    fwd_other = TMA_FWD.replace("ILi6ELb0E", "ILi12ELb0E")
    main = {"fwd.cubin": elf({".text." + TMA_FWD: b"\x01" * 8, ".text." + fwd_seg: b"\x02" * 8,
                              ".text." + fwd_other: b"\x03" * 8})}
    # Plan 6 without segment ids changed, plan 12 gone, plan 6 with them as it was.
    branch = {"fwd.cubin": elf({".text." + TMA_FWD: b"\x04" * 8, ".text." + fwd_seg: b"\x02" * 8})}
    tools = fake_cuobjdump(tmp_path, {"main": main, "branch": branch})
    monkeypatch.setenv("PATH", tools + os.pathsep + os.environ["PATH"])
    assert kernel_hashes.main([f"main={tmp_path / 'main'}", f"branch={tmp_path / 'branch'}"]) == 0
    assert ("branch: tma kernels unlike main's: fwd 6, fwd 12 (1 of 3 the same)"
            in capsys.readouterr().out)


def test_a_binary_cuobjdump_cannot_read_is_named_and_left_out(tmp_path, monkeypatch, capsys):
    code = {"fwd.cubin": elf({".text." + TMA_FWD: b"\x01" * 8})}
    tools = fake_cuobjdump(tmp_path, {"main": code, "branch": code})
    # A wrapper script in the variant's place: the stand-in fails on it as cuobjdump does.
    tool = tmp_path / "bin" / "cuobjdump"
    tool.write_text('#!/bin/sh\ncase "$3" in *wrapper) exit 255;; esac\n' + tool.read_text().split("\n", 1)[1])
    (tmp_path / "wrapper").write_text("#!/bin/sh\nexec true\n")
    monkeypatch.setenv("PATH", tools + os.pathsep + os.environ["PATH"])
    args = [f"{n}={tmp_path / n}" for n in ("wrapper", "main", "branch")]
    assert kernel_hashes.main(args) == 0
    out = capsys.readouterr().out
    assert "wrapper: cuobjdump could not read" in out and "not compared" in out
    assert "WARNING: branch has the same device code as main" in out
    assert kernel_hashes.main([f"wrapper={tmp_path / 'wrapper'}"]) == 0
    assert "not compared" in capsys.readouterr().out


def test_bad_arguments_and_a_missing_cuobjdump(tmp_path, monkeypatch, capsys):
    assert kernel_hashes.main([]) == 2
    assert kernel_hashes.main(["no_equals_sign"]) == 2
    assert kernel_hashes.main([f"x={tmp_path / 'absent'}"]) == 2
    (tmp_path / "b").write_bytes(b"")
    monkeypatch.setattr(kernel_hashes.shutil, "which", lambda *a, **k: None)
    assert kernel_hashes.main([f"x={tmp_path / 'b'}"]) == 0
    assert "cuobjdump not found" in capsys.readouterr().out
