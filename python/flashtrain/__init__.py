"""flashtrain from Python.

- ``flashtrain.attention``: our attention kernels (``forward``/``backward``) on any DLPack array:
  NumPy on the CPU; PyTorch, CuPy or JAX arrays on the CPU or the GPU.
- ``flashtrain.torch``: ``flash_attn_func`` / ``flash_attn_varlen_func`` with flash-attn's
  arguments, a ``torch.library`` custom op that autograd and ``torch.compile`` understand.
- ``flashtrain.convert``: Hugging Face safetensors checkpoints (GPT-2, Llama) to llm.c
  checkpoints and back (NumPy only, no compiled module).

Submodules load on first use, so that ``flashtrain.convert`` works without the compiled module
and nothing imports PyTorch unless ``flashtrain.torch`` is used. docs/PYTHON.md has the details.
"""

import importlib

__all__ = ["attention", "convert", "torch"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
