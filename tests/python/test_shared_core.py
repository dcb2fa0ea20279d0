"""Both compiled modules, flashtrain._flashtrain (DLPack) and flashtrain._torch_ext (PyTorch), load
one shared library, flashtrain/libflashtrain_core.so (python/CMakeLists.txt), so a process has one
copy of the library's state. Shown on the CPU through the library's memory counters
(``_memory_stats``, in both modules): outputs made through one route are counted, and their
memory given back, in the counters that the other route reads. With a copy of the library in each
module, as before, each route would see only its own. Also: the package's files find the core
through RPATH $ORIGIN alone (no build path), so the installed package can be moved. The PyTorch
tests skip without PyTorch or the extension; the rest run everywhere (CI)."""

import gc
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

attention = pytest.importorskip("flashtrain.attention")
from flashtrain import _flashtrain  # noqa: E402  (after the skip: a build without the module)

try:
    import torch
except ImportError:
    torch = None


def _extension():
    """flashtrain._torch_ext, or the reason it cannot serve this process."""
    if torch is None:
        return None, "PyTorch is not installed"
    try:
        from flashtrain import _torch_build
    except ImportError:
        return None, "flashtrain was built without the PyTorch extension (FLASHTRAIN_TORCH)"
    if _torch_build.TORCH_VERSION != str(torch.__version__):
        return None, (f"the extension was built against torch {_torch_build.TORCH_VERSION}, "
                      f"this is {torch.__version__}")
    from flashtrain import _torch_ext
    return _torch_ext, ""


EXT, WHY_NO_EXT = _extension()
needs_extension = pytest.mark.skipif(EXT is None, reason=WHY_NO_EXT)


def used_bytes(module):
    gc.collect()  # outputs dropped by the test are freed now, not at a later collection
    used, peak_used, peak_reserved = module._memory_stats("cpu")
    assert 0 <= used <= peak_used and peak_used <= peak_reserved
    return used


def inputs(make, dtype):
    rng = np.random.default_rng(7)
    return [make(rng.standard_normal(shape).astype(dtype))
            for shape in ((2, 33, 4, 16), (2, 33, 2, 16), (2, 33, 2, 16))]


def test_memory_stats_count_the_outputs():
    q, k, v = inputs(np.asarray, np.float32)
    before = used_bytes(_flashtrain)
    o, lse = attention.forward(q, k, v, causal=True)
    assert used_bytes(_flashtrain) == before + o.nbytes + lse.nbytes
    del o, lse
    assert used_bytes(_flashtrain) == before


def test_memory_stats_device_is_checked():
    with pytest.raises(ValueError):
        _flashtrain._memory_stats("tpu")


@needs_extension
def test_extension_outputs_are_in_the_modules_counters():
    q, k, v = inputs(torch.from_numpy, np.float32)
    before = used_bytes(_flashtrain)
    assert used_bytes(EXT) == before  # one set of counters, read through both modules
    o, lse = EXT.forward(q, k, v, None, True, 0, 0.0, "flash", None)
    made = o.nbytes + lse.nbytes
    assert used_bytes(_flashtrain) == before + made
    assert used_bytes(EXT) == before + made
    del o, lse  # given back through PyTorch's deleter, into the one library
    assert used_bytes(_flashtrain) == before


@needs_extension
def test_module_outputs_are_in_the_extensions_counters():
    q, k, v = inputs(torch.from_numpy, np.float32)
    before = used_bytes(EXT)
    o, lse = attention._Torch(torch).call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
    dq, dk, dv = _flashtrain.backward(q.numpy(), k.numpy(), v.numpy(), o.numpy(), lse.numpy(),
                                      np.ones(q.shape, np.float32), None, True, 0, 0.0, False,
                                      "flash", None, 0, None, 1, None)
    made = sum(x.nbytes for x in (o, lse, dq, dk, dv))
    assert used_bytes(EXT) == before + made
    del o, lse, dq, dk, dv
    assert used_bytes(EXT) == before


def _dynamic_section(path):
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True,
                         text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", out)
    paths = re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.*)\]", out)
    return needed, paths


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_modules_find_the_core_beside_them():
    package = pathlib.Path(_flashtrain.__file__).parent
    core = package / "libflashtrain_core.so"
    assert core.is_file()
    modules = [pathlib.Path(_flashtrain.__file__)]
    if EXT is not None:
        modules.append(pathlib.Path(EXT.__file__))
    for module in modules:
        needed, paths = _dynamic_section(module)
        assert "libflashtrain_core.so" in needed, module.name
        assert paths == ["$ORIGIN"], module.name  # no build folder's absolute path
    _, core_paths = _dynamic_section(core)
    assert not [p for p in core_paths if os.path.isabs(p)], core_paths
