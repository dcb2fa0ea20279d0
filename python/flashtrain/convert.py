"""Hugging Face checkpoints (GPT-2, Llama) to llm.c checkpoints and back; NumPy only.

A Hugging Face checkpoint is a directory as ``save_pretrained`` writes it: ``config.json`` and
one or more ``*.safetensors`` files. Ours are llm.c files (src/models/checkpoint.h): GPT-2 magic
20240326 (version 3 fp32, 5 bf16) and LLaMA-3 magic 20240803 (same versions).

What changes on the way:
- GPT-2: Hugging Face's Conv1D weights are stored [in, out]; ours (nn.Linear) [out, in], so
  every GPT-2 matrix is transposed. The embedding is tied to the head in both. Our files pad the
  vocabulary to a multiple of 128 rows (50257 -> 50304) with zeros; the padding is dropped on the
  way back.
- Llama: Hugging Face rotates the halves of each head (pairs i, i + D/2: "rotate_half"); Meta's
  and our RoPE rotate interleaved pairs (2i, 2i + 1). The q and k projection rows of every head
  are permuted between the two orders, which gives the same attention scores. Our LLaMA head is
  never tied: a tied checkpoint's embedding is copied into the head, and on the way back a head
  equal to the embedding bit for bit is written tied again. Our header keeps the MLP width as
  (multiple_of, ffn_dim_multiplier): a pair that reproduces intermediate_size is found.
- dtypes: float32 and bf16 are copied bit for bit (``--dtype auto`` keeps the source's),
  float16 widens to float32; converting float32 to bf16 rounds to nearest even.

So HF -> ours -> HF and ours -> HF -> ours give back the same tensors bit for bit.

Command line (also ``scripts/hf_convert.py`` and the ``flashtrain-convert`` entry point):
    python -m flashtrain.convert hf-to-llmc HF_DIR OUT.bin [--dtype auto|fp32|bf16]
    python -m flashtrain.convert llmc-to-hf IN.bin HF_DIR [--dtype auto|fp32|bf16]
"""

import argparse
import glob
import json
import os
import struct
import sys

import numpy as np

GPT2_MAGIC = 20240326
LLAMA3_MAGIC = 20240803
VERSION_FP32, VERSION_BF16 = 3, 5
# Llama 3.1's RoPE frequency scaling, the only scaling our model has (src/nn/rope.cpp).
LLAMA31_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}

__all__ = ["hf_to_llmc", "llmc_to_hf", "read_llmc", "write_llmc", "read_safetensors",
           "write_safetensors", "main"]


class ConversionError(ValueError):
    """A checkpoint that cannot be converted (what and why are in the message)."""


# ---------------------------------------------------------------- dtypes (bf16 as uint16 bits)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as src/core/bf16.h does; NaN stays a (quiet) NaN."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def to_dtype(x, dtype):
    """x (float32 array, or uint16 holding bf16) as 'fp32' or 'bf16' (uint16)."""
    is_bf16 = x.dtype == np.uint16
    if dtype == "bf16":
        return x if is_bf16 else f32_to_bf16(x)
    return bf16_to_f32(x) if is_bf16 else x.astype(np.float32, copy=False)


def dtype_of(tensors):
    return "bf16" if any(t.dtype == np.uint16 for t in tensors.values()) else "fp32"


# ---------------------------------------------------------------- safetensors files

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def read_safetensors(path):
    """{name: array} of one .safetensors file, memory-mapped; BF16 comes as uint16 bits."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise ConversionError(f"{path}: tensor {name} has dtype {info['dtype']} (supported: "
                                  f"{', '.join(_ST_DTYPES)})")
        begin, end = info["data_offsets"]
        out[name] = data[begin:end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: float32 array or uint16 bf16 bits} as one .safetensors file."""
    names = sorted(tensors)
    header, offset = {}, 0
    for name in names:
        t = tensors[name]
        kind = "BF16" if t.dtype == np.uint16 else "F32"
        header[name] = {"dtype": kind, "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    header["__metadata__"] = metadata or {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).astype(
                tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)


def read_hf_dir(directory):
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise ConversionError(f"{directory}: no config.json (expected a save_pretrained folder)")
    with open(config_path) as f:
        config = json.load(f)
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise ConversionError(f"{directory}: no *.safetensors files")
    tensors = {}
    for path in files:
        tensors.update(read_safetensors(path))
    for name, t in tensors.items():
        if t.dtype in (np.float16, np.float64):
            tensors[name] = t.astype(np.float32)
    return config, tensors


# ---------------------------------------------------------------- llm.c checkpoints


def llama_ffn_hidden(width, multiple_of, ffn_dim_multiplier):
    """models::llama_ffn_hidden, with the multiplier as the header stores it (float32)."""
    hidden = 2 * (4 * width) // 3
    m = float(np.float32(ffn_dim_multiplier))
    if 0 < m <= 16.0:
        hidden = int(m * hidden)
    if multiple_of < 1:
        return hidden
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama_ffn_params(width, ffn_hidden):
    """(multiple_of, ffn_dim_multiplier) for which llama_ffn_hidden gives ffn_hidden: Meta's
    usual pairs first, else multiple_of 1 and the float32 multiplier that lands on it."""
    for multiple_of in (1024, 512, 256, 128, 64, 32, 16, 8):
        for m in (1.3, 1.5, 1.0, 2.0, 1.2, 1.25, 4.0, 3.0):
            if llama_ffn_hidden(width, multiple_of, m) == ffn_hidden:
                return multiple_of, m
    base = 2 * (4 * width) // 3
    m = np.float32(ffn_hidden / base)
    for _ in range(64):
        got = llama_ffn_hidden(width, 1, m)
        if got == ffn_hidden:
            return 1, float(m)
        m = np.nextafter(m, np.float32(np.inf if got < ffn_hidden else -np.inf))
    raise ConversionError(f"no (multiple_of, ffn_dim_multiplier) gives MLP width {ffn_hidden} "
                          f"for width {width}")


def padded_vocab(vocab):
    return (vocab + 127) // 128 * 128


def _layer_kinds(family):
    if family == "gpt2":
        return ("norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias")
    return ("norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight",
            "mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight")


def file_layout(cfg):
    """[(name, shape)] in the file's order (src/models/checkpoint.cpp, file_layout)."""
    C, L, V = cfg["width"], cfg["layers"], cfg["vocab"]
    D = C // cfg["heads"]
    qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * D
    F = cfg["ffn"]
    shapes = {"norm1.weight": (C,), "norm1.bias": (C,), "attn.qkv.weight": (qkv, C),
              "attn.qkv.bias": (qkv,), "attn.proj.weight": (C, cfg["heads"] * D),
              "attn.proj.bias": (C,), "norm2.weight": (C,), "norm2.bias": (C,),
              "mlp.fc.weight": (F, C), "mlp.fc.bias": (F,), "mlp.gate.weight": (F, C),
              "mlp.proj.weight": (C, F), "mlp.proj.bias": (C,)}
    gpt2 = cfg["family"] == "gpt2"
    out = [("wte", (cfg["padded_vocab"] if gpt2 else V, C))]
    if gpt2:
        out.append(("wpe", (cfg["context"], C)))
    for kind in _layer_kinds(cfg["family"]):
        out += [(f"h.{layer}.{kind}", shapes[kind]) for layer in range(L)]
    out.append(("normf.weight", (C,)))
    out.append(("normf.bias", (C,)) if gpt2 else ("head.weight", (V, C)))
    return out


def read_llmc(path):
    """(config, {name: array}) of an llm.c checkpoint; bf16 files give uint16 bits."""
    with open(path, "rb") as f:
        ints = struct.unpack("<256i", f.read(1024))
        magic, version = ints[0], ints[1]
        if magic == GPT2_MAGIC:
            cfg = dict(family="gpt2", context=ints[2], vocab=ints[3], layers=ints[4],
                       heads=ints[5], kv_heads=ints[5], width=ints[6], padded_vocab=ints[7])
            cfg["ffn"] = 4 * cfg["width"]
        elif magic == LLAMA3_MAGIC:
            floats = struct.unpack("<256f", f.read(1024))
            cfg = dict(family="llama3", context=ints[2], vocab=ints[3], layers=ints[4],
                       heads=ints[5], kv_heads=ints[6], width=ints[7], multiple_of=ints[8],
                       rope_scaling=bool(ints[9]), ffn_dim_multiplier=floats[0],
                       norm_eps=floats[1], rope_theta=floats[2])
            cfg["padded_vocab"] = padded_vocab(cfg["vocab"])
            cfg["ffn"] = llama_ffn_hidden(cfg["width"], cfg["multiple_of"],
                                          cfg["ffn_dim_multiplier"])
        else:
            raise ConversionError(f"{path}: not an llm.c model checkpoint (magic {magic}; "
                                  f"expected {GPT2_MAGIC} or {LLAMA3_MAGIC})")
        if version not in (VERSION_FP32, VERSION_BF16):
            raise ConversionError(f"{path}: unsupported version {version} (3 = fp32, 5 = bf16)")
        header_bytes = f.tell()
    dtype = np.uint16 if version == VERSION_BF16 else np.float32
    layout = file_layout(cfg)
    expected = header_bytes + sum(int(np.prod(s)) for _, s in layout) * np.dtype(dtype).itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise ConversionError(f"{path}: {actual} bytes, its header implies {expected} "
                              "(truncated, or not this model)")
    data = np.memmap(path, dtype=dtype, mode="r", offset=header_bytes)
    tensors, at = {}, 0
    for name, shape in layout:
        n = int(np.prod(shape))
        tensors[name] = data[at:at + n].reshape(shape)
        at += n
    return cfg, tensors


def write_llmc(path, cfg, tensors, dtype):
    """Writes our tensors (names of file_layout) as an llm.c checkpoint in 'fp32' or 'bf16'."""
    version = VERSION_BF16 if dtype == "bf16" else VERSION_FP32
    if cfg["family"] == "gpt2":
        ints = [GPT2_MAGIC, version, cfg["context"], cfg["vocab"], cfg["layers"], cfg["heads"],
                cfg["width"], cfg["padded_vocab"]]
        header = struct.pack("<256i", *(ints + [0] * (256 - len(ints))))
    else:
        ints = [LLAMA3_MAGIC, version, cfg["context"], cfg["vocab"], cfg["layers"], cfg["heads"],
                cfg["kv_heads"], cfg["width"], cfg["multiple_of"], int(cfg["rope_scaling"]), 3, 1]
        floats = [cfg["ffn_dim_multiplier"], cfg["norm_eps"], cfg["rope_theta"]]
        header = struct.pack("<256i", *(ints + [0] * (256 - len(ints))))
        header += struct.pack("<256f", *(floats + [0.0] * (256 - len(floats))))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for name, shape in file_layout(cfg):
            t = tensors[name]
            if tuple(t.shape) != tuple(shape):
                raise ConversionError(f"{name}: shape {tuple(t.shape)}, the file needs {shape}")
            t = to_dtype(np.ascontiguousarray(t), dtype)
            f.write(t.astype(t.dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)


# ---------------------------------------------------------------- GPT-2


def _hf_gpt2_prefix(tensors):
    """'transformer.' as save_pretrained writes it, '' in OpenAI's original files."""
    return "transformer." if "transformer.wte.weight" in tensors else ""


def _get(tensors, name, source):
    if name not in tensors:
        raise ConversionError(f"{source}: tensor {name} is missing")
    return tensors[name]


def _gpt2_config_from_hf(hf, source):
    def need(key, want, what):
        value = hf.get(key, want)
        if value != want:
            raise ConversionError(f"{source}: {key} = {value!r}; our GPT-2 has {what} ({want!r})")

    need("activation_function", "gelu_new", "GELU with the tanh approximation")
    need("scale_attn_by_inverse_layer_idx", False, "no per-layer attention scaling")
    need("scale_attn_weights", True, "scores scaled by 1/sqrt(head dim)")
    need("tie_word_embeddings", True, "the head tied to the embedding")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        raise ConversionError(f"{source}: layer_norm_epsilon = {hf['layer_norm_epsilon']}; our "
                              "GPT-2 (and its file header) uses 1e-5")
    width = hf["n_embd"]
    if hf.get("n_inner") not in (None, 4 * width):
        raise ConversionError(f"{source}: n_inner = {hf['n_inner']}; our GPT-2 MLP is 4 x width")
    return dict(family="gpt2", context=hf["n_positions"], vocab=hf["vocab_size"],
                layers=hf["n_layer"], heads=hf["n_head"], kv_heads=hf["n_head"], width=width,
                ffn=4 * width, padded_vocab=padded_vocab(hf["vocab_size"]))


def gpt2_from_hf(hf, hft, source):
    cfg = _gpt2_config_from_hf(hf, source)
    p = _hf_gpt2_prefix(hft)

    def get(name):
        return _get(hft, p + name, source)

    wte = get("wte.weight")
    padded = np.zeros((cfg["padded_vocab"], cfg["width"]), dtype=wte.dtype)
    padded[:cfg["vocab"]] = wte
    out = {"wte": padded, "wpe": get("wpe.weight"), "normf.weight": get("ln_f.weight"),
           "normf.bias": get("ln_f.bias")}
    # Conv1D weights are [in, out]: ours are [out, in].
    pairs = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv": "attn.c_attn",
             "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for layer in range(cfg["layers"]):
        for ours, theirs in pairs.items():
            w = get(f"h.{layer}.{theirs}.weight")
            out[f"h.{layer}.{ours}.weight"] = w if ours.startswith("norm") else w.T
            out[f"h.{layer}.{ours}.bias"] = get(f"h.{layer}.{theirs}.bias")
    return cfg, out


def gpt2_to_hf(cfg, t):
    V = cfg["vocab"]
    if np.any(np.asarray(t["wte"][V:]) != 0):
        print(f"note: the embedding's padded rows {V}..{cfg['padded_vocab'] - 1} are not zero; "
              "Hugging Face's GPT-2 has no such rows and they are dropped", file=sys.stderr)
    out = {"transformer.wte.weight": t["wte"][:V], "transformer.wpe.weight": t["wpe"],
           "transformer.ln_f.weight": t["normf.weight"],
           "transformer.ln_f.bias": t["normf.bias"]}
    pairs = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv": "attn.c_attn",
             "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for layer in range(cfg["layers"]):
        for ours, theirs in pairs.items():
            w = t[f"h.{layer}.{ours}.weight"]
            out[f"transformer.h.{layer}.{theirs}.weight"] = w if ours.startswith("norm") else w.T
            out[f"transformer.h.{layer}.{theirs}.bias"] = t[f"h.{layer}.{ours}.bias"]
    hf = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
          "n_positions": cfg["context"], "n_ctx": cfg["context"], "n_embd": cfg["width"],
          "n_layer": cfg["layers"], "n_head": cfg["heads"], "n_inner": None, "vocab_size": V,
          "tie_word_embeddings": True, "scale_attn_weights": True,
          "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
          "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0}
    if V == 50257:
        hf.update(bos_token_id=50256, eos_token_id=50256)
    return hf, out


# ---------------------------------------------------------------- Llama


def rotate_half_to_interleaved(w, heads):
    """Rows of a q/k projection [heads * D, C]: Hugging Face's order (pair i, i + D/2) to Meta's
    interleaved pairs (2i, 2i + 1); the inverse of convert_llama_weights_to_hf's permute."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, 2, d // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def interleaved_to_rotate_half(w, heads):
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def _rope_from_hf(hf, source):
    """(theta, Llama 3.1 scaling on/off) from transformers 5's rope_parameters or 4's
    rope_theta + rope_scaling."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return theta, False
    if kind != "llama3":
        raise ConversionError(f"{source}: RoPE scaling {kind!r} is not supported (ours: none, or "
                              f"Llama 3.1's 'llama3' with {LLAMA31_ROPE_SCALING})")
    values = {**scaling, **params}
    for key, want in LLAMA31_ROPE_SCALING.items():
        if float(values.get(key, -1)) != want:
            raise ConversionError(f"{source}: llama3 RoPE scaling with {key} = {values.get(key)}"
                                  f"; ours has {want}")
    return theta, True


def _llama_config_from_hf(hf, source):
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if hf.get("head_dim", width // heads) != width // heads:
        raise ConversionError(f"{source}: head_dim {hf['head_dim']} != hidden_size / heads "
                              f"({width // heads}); ours derives it from the width")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key, False):
            raise ConversionError(f"{source}: {key} = true; our LLaMA has no biases")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"{source}: hidden_act = {hf['hidden_act']!r}; ours is SwiGLU (silu)")
    theta, scaling = _rope_from_hf(hf, source)
    multiple_of, multiplier = llama_ffn_params(width, hf["intermediate_size"])
    return dict(family="llama3", context=hf["max_position_embeddings"], vocab=hf["vocab_size"],
                layers=hf["num_hidden_layers"], heads=heads, kv_heads=kv_heads, width=width,
                multiple_of=multiple_of, ffn_dim_multiplier=multiplier,
                ffn=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-5),
                rope_theta=theta, rope_scaling=scaling, padded_vocab=padded_vocab(hf["vocab_size"]))


def llama_from_hf(hf, hft, source):
    cfg = _llama_config_from_hf(hf, source)

    def get(name):
        return _get(hft, name, source)

    embed = get("model.embed_tokens.weight")
    head = hft.get("lm_head.weight", embed)  # tied checkpoints store the embedding only
    out = {"wte": embed, "normf.weight": get("model.norm.weight"), "head.weight": head}
    for layer in range(cfg["layers"]):
        p, o = f"model.layers.{layer}.", f"h.{layer}."
        q = rotate_half_to_interleaved(get(p + "self_attn.q_proj.weight"), cfg["heads"])
        k = rotate_half_to_interleaved(get(p + "self_attn.k_proj.weight"), cfg["kv_heads"])
        out[o + "attn.qkv.weight"] = np.concatenate([q, k, get(p + "self_attn.v_proj.weight")])
        out[o + "attn.proj.weight"] = get(p + "self_attn.o_proj.weight")
        out[o + "norm1.weight"] = get(p + "input_layernorm.weight")
        out[o + "norm2.weight"] = get(p + "post_attention_layernorm.weight")
        out[o + "mlp.fc.weight"] = get(p + "mlp.up_proj.weight")
        out[o + "mlp.gate.weight"] = get(p + "mlp.gate_proj.weight")
        out[o + "mlp.proj.weight"] = get(p + "mlp.down_proj.weight")
    return cfg, out


def _short_float(x):
    """The shortest decimal that reads back as the same float32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def llama_to_hf(cfg, t):
    width, heads, kv_heads = cfg["width"], cfg["heads"], cfg["kv_heads"]
    d = width // heads
    tied = np.array_equal(np.asarray(t["wte"]), np.asarray(t["head.weight"]))
    out = {"model.embed_tokens.weight": t["wte"], "model.norm.weight": t["normf.weight"]}
    if not tied:
        out["lm_head.weight"] = t["head.weight"]
    for layer in range(cfg["layers"]):
        p, o = f"model.layers.{layer}.", f"h.{layer}."
        qkv = np.asarray(t[o + "attn.qkv.weight"])
        q, k, v = np.split(qkv, [heads * d, (heads + kv_heads) * d])
        out[p + "self_attn.q_proj.weight"] = interleaved_to_rotate_half(q, heads)
        out[p + "self_attn.k_proj.weight"] = interleaved_to_rotate_half(k, kv_heads)
        out[p + "self_attn.v_proj.weight"] = v
        out[p + "self_attn.o_proj.weight"] = t[o + "attn.proj.weight"]
        out[p + "input_layernorm.weight"] = t[o + "norm1.weight"]
        out[p + "post_attention_layernorm.weight"] = t[o + "norm2.weight"]
        out[p + "mlp.up_proj.weight"] = t[o + "mlp.fc.weight"]
        out[p + "mlp.gate_proj.weight"] = t[o + "mlp.gate.weight"]
        out[p + "mlp.down_proj.weight"] = t[o + "mlp.proj.weight"]
    theta = _short_float(cfg["rope_theta"])
    rope = {"rope_theta": theta, "rope_type": "llama3" if cfg["rope_scaling"] else "default"}
    if cfg["rope_scaling"]:
        rope.update(LLAMA31_ROPE_SCALING)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "hidden_size": width, "intermediate_size": cfg["ffn"],
          "num_hidden_layers": cfg["layers"], "num_attention_heads": heads,
          "num_key_value_heads": kv_heads, "head_dim": d, "vocab_size": cfg["vocab"],
          "max_position_embeddings": cfg["context"], "rms_norm_eps": _short_float(cfg["norm_eps"]),
          "rope_parameters": rope, "rope_theta": theta,
          "rope_scaling": dict(rope) if cfg["rope_scaling"] else None,
          "tie_word_embeddings": bool(tied), "attention_bias": False, "mlp_bias": False,
          "attention_dropout": 0.0}
    return hf, out


# ---------------------------------------------------------------- whole conversions


def _pick_dtype(requested, tensors):
    if requested not in ("auto", "fp32", "bf16"):
        raise ConversionError(f"dtype must be auto, fp32 or bf16, got {requested!r}")
    return dtype_of(tensors) if requested == "auto" else requested


def hf_to_llmc(hf_dir, out_path, dtype="auto"):
    """Converts a Hugging Face GPT-2 or Llama folder into an llm.c checkpoint; returns the
    config written."""
    hf, hft = read_hf_dir(hf_dir)
    kind = hf.get("model_type")
    if kind == "gpt2":
        cfg, tensors = gpt2_from_hf(hf, hft, hf_dir)
    elif kind == "llama":
        cfg, tensors = llama_from_hf(hf, hft, hf_dir)
    else:
        raise ConversionError(f"{hf_dir}: model_type {kind!r} is not supported (gpt2, llama)")
    write_llmc(out_path, cfg, tensors, _pick_dtype(dtype, hft))
    return cfg


def llmc_to_hf(in_path, hf_dir, dtype="auto"):
    """Converts an llm.c checkpoint into a Hugging Face folder (config.json and
    model.safetensors); returns the Hugging Face config written."""
    cfg, tensors = read_llmc(in_path)
    hf, out = (gpt2_to_hf if cfg["family"] == "gpt2" else llama_to_hf)(cfg, tensors)
    file_dtype = _pick_dtype(dtype, tensors)
    hf["dtype"] = hf["torch_dtype"] = "bfloat16" if file_dtype == "bf16" else "float32"
    os.makedirs(hf_dir, exist_ok=True)
    write_safetensors(os.path.join(hf_dir, "model.safetensors"),
                      {k: to_dtype(np.ascontiguousarray(v), file_dtype) for k, v in out.items()})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
        f.write("\n")
    return hf


def main(argv=None):
    parser = argparse.ArgumentParser(prog="flashtrain-convert", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    a = sub.add_parser("hf-to-llmc", help="Hugging Face folder -> llm.c checkpoint")
    a.add_argument("hf_dir")
    a.add_argument("out")
    b = sub.add_parser("llmc-to-hf", help="llm.c checkpoint -> Hugging Face folder")
    b.add_argument("checkpoint")
    b.add_argument("hf_dir")
    for p in (a, b):
        p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                       help="dtype of the output (auto: the input's)")
    args = parser.parse_args(argv)
    try:
        if args.direction == "hf-to-llmc":
            cfg = hf_to_llmc(args.hf_dir, args.out, args.dtype)
            print(f"wrote {args.out}: {cfg['family']}, {cfg['layers']} layers, width "
                  f"{cfg['width']}, heads {cfg['heads']}/{cfg['kv_heads']}, vocab {cfg['vocab']}")
        else:
            hf = llmc_to_hf(args.checkpoint, args.hf_dir, args.dtype)
            print(f"wrote {args.hf_dir}: {hf['model_type']}, {hf['dtype']}")
    except (ConversionError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
