#!/usr/bin/env python3
"""Hugging Face safetensors checkpoints (GPT-2, Llama) to llm.c checkpoints and back.

    scripts/hf_convert.py hf-to-llmc HF_DIR OUT.bin [--dtype auto|fp32|bf16]
    scripts/hf_convert.py llmc-to-hf IN.bin HF_DIR [--dtype auto|fp32|bf16]

The conversion is python/flashtrain/convert.py (NumPy only); this script runs it from the source
tree without installing the package. docs/PYTHON.md says what changes on the way.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from flashtrain.convert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
