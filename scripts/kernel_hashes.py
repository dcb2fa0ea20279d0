#!/usr/bin/env python3
"""Which kernel families differ between builds.

For each binary, a short hash of the machine code of each family of kernels (the `.text.*`
sections of the cubins that `cuobjdump -xelf all` extracts), one line per binary; then, for each
binary after the first, the families whose code differs from the first's. Two builds of the same
kernel source give the same code, so a variant reported as "same device code" runs the same
kernels as the first and no timing can show its change (session 51 timed two branches whose
builds had kept main's forward objects).

Where a tma family differs, the next line names its kernels whose code differs, by plan (the
index into tma_plans.h's table) and segment ids: "fwd 6" is tma_forward_kernel<6, false>, "fwd
6+seg" the same plan with segment ids; a kernel that is in one build only counts as differing.
A change meant for some plans can so be checked to have left the others' code as it was.

A binary that cuobjdump cannot read (a wrapper script that runs a binary with fixed flags, as a
variant of scripts/gpu_variants.sh may be) is named as not compared and left out; the first
binary read is the one the others are compared with.

Usage: scripts/kernel_hashes.py NAME=BINARY [NAME=BINARY ...]
Families: tma_fwd (tma_forward_kernel), tma_bwd (tma_backward_kernel), wgmma (wgmma_*_kernel),
mma (flash_forward_kernel, flash_backward_kernel), other (every other kernel).
Exit 0 (also when cuobjdump is not found: it says so); 2: bad arguments.
"""
import glob
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_ptxas import tma_instance  # noqa: E402  (the tma kernels' names, parsed once)

FAMILIES = [
    ("tma_fwd", ("tma_forward_kernel",)),
    ("tma_bwd", ("tma_backward_kernel",)),
    ("wgmma", ("wgmma_forward_kernel", "wgmma_backward_kernel")),
    ("mma", ("flash_forward_kernel", "flash_backward_kernel")),
]


def tma_label(kernel):
    """"fwd 6", "bwd 3+seg", ... for a tma kernel's (direction, plan, segment ids)."""
    direction, plan, segments = kernel
    return f"{'fwd' if direction == 'forward' else 'bwd'} {plan}" + ("+seg" if segments else "")


def family_of(function):
    for family, marks in FAMILIES:
        if any(mark in function for mark in marks):
            return family
    return "other"


def text_sections(cubin):
    """(function, code) for each .text section of a 64-bit little-endian ELF file (a cubin)."""
    data = open(cubin, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{cubin}: not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    for h in headers:
        start = names_at + h[0]
        name = data[start:data.index(b"\0", start)].decode()
        if name.startswith(".text."):
            yield name[len(".text."):], data[h[4]:h[4] + h[5]]


def hashes_of(binary, cuobjdump):
    """(a hash per family, a hash per tma kernel by its (direction, plan, segment ids))."""
    digests = {family: hashlib.md5() for family, _ in FAMILIES + [("other", ())]}
    kernels = {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(binary)], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        code = []
        for cubin in glob.glob(os.path.join(tmp, "*.cubin")):
            code.extend(text_sections(cubin))
    seen = set()
    for function, text in sorted(code):
        seen.add(family_of(function))
        digests[family_of(function)].update(function.encode() + b"\0" + text)
        kernel = tma_instance(function)
        if kernel is not None:
            kernels[kernel] = hashlib.md5(text).hexdigest()
    families = {f: (d.hexdigest()[:8] if f in seen else "none") for f, d in digests.items()}
    return families, kernels


def main(args):
    pairs = [a.split("=", 1) for a in args]
    if not pairs or any(len(p) != 2 or not p[0] or not os.path.isfile(p[1]) for p in pairs):
        print("usage: scripts/kernel_hashes.py NAME=BINARY [NAME=BINARY ...] (each BINARY a file)",
              file=sys.stderr)
        return 2
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path="/usr/local/cuda/bin")
    if cuobjdump is None:
        print("kernel hashes: cuobjdump not found, device code not compared")
        return 0
    table, kernels, read = {}, {}, []
    for name, binary in pairs:
        try:
            table[name], kernels[name] = hashes_of(binary, cuobjdump)
        except subprocess.CalledProcessError as e:
            print(f"kernel hashes: {name}: cuobjdump could not read {binary} (exit {e.returncode}; "
                  "not an executable with device code, e.g. a wrapper script): not compared")
            continue
        read.append(name)
        print(f"kernel hashes: {name}: " + " ".join(f"{f}={h}" for f, h in table[name].items()))
    if not read:
        return 0
    first = read[0]
    for name in read[1:]:
        differ = [f for f in table[name] if table[name][f] != table[first][f]]
        if differ:
            print(f"kernel hashes: {name} differs from {first} in: {' '.join(differ)}")
            both = set(kernels[name]) | set(kernels[first])
            unlike = sorted(k for k in both if kernels[name].get(k) != kernels[first].get(k))
            if unlike:
                print(f"kernel hashes: {name}: tma kernels unlike {first}'s: "
                      f"{', '.join(map(tma_label, unlike))} "
                      f"({len(both) - len(unlike)} of {len(both)} the same)")
        else:
            print(f"kernel hashes: WARNING: {name} has the same device code as {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
