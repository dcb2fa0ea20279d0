"""flashtrain.convert: Hugging Face safetensors folders (GPT-2, Llama) to llm.c checkpoints and
back. Round trips are bit-exact (HF -> ours -> HF and ours -> HF -> ours, fp32 and bf16, tied and
untied); the files are readable by the safetensors package and by flashtrain's own loader; and the
converted model computes what the Hugging Face layout computes: a float64 NumPy forward in Hugging
Face's conventions (Conv1D, rotate-half RoPE) against `flashtrain debug-step`'s logits."""

import json
import math
import os
import subprocess

import numpy as np
import pytest

from flashtrain import convert

safetensors_numpy = pytest.importorskip("safetensors.numpy")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def gpt2_hf(rng, vocab=300, context=32, width=32, layers=2, heads=4):
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": vocab,
              "n_positions": context, "n_embd": width, "n_layer": layers, "n_head": heads,
              "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True}
    t = {"transformer.wte.weight": (vocab, width), "transformer.wpe.weight": (context, width),
         "transformer.ln_f.weight": (width,), "transformer.ln_f.bias": (width,)}
    for layer in range(layers):
        p = f"transformer.h.{layer}."
        t.update({p + "ln_1.weight": (width,), p + "ln_1.bias": (width,),
                  p + "attn.c_attn.weight": (width, 3 * width), p + "attn.c_attn.bias": (3 * width,),
                  p + "attn.c_proj.weight": (width, width), p + "attn.c_proj.bias": (width,),
                  p + "ln_2.weight": (width,), p + "ln_2.bias": (width,),
                  p + "mlp.c_fc.weight": (width, 4 * width), p + "mlp.c_fc.bias": (4 * width,),
                  p + "mlp.c_proj.weight": (4 * width, width), p + "mlp.c_proj.bias": (width,)})
    return config, random_tensors(rng, t)


def llama_hf(rng, vocab=260, context=64, width=64, layers=2, heads=4, kv_heads=2, ffn=176,
             tied=False, rope_scaling=False):
    rope = {"rope_theta": 500000.0, "rope_type": "llama3" if rope_scaling else "default"}
    if rope_scaling:
        rope.update(convert.LLAMA31_ROPE_SCALING)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
              "max_position_embeddings": context, "hidden_size": width,
              "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-5, "rope_parameters": rope,
              "tie_word_embeddings": tied, "hidden_act": "silu"}
    d = width // heads
    t = {"model.embed_tokens.weight": (vocab, width), "model.norm.weight": (width,)}
    if not tied:
        t["lm_head.weight"] = (vocab, width)
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t.update({p + "input_layernorm.weight": (width,),
                  p + "post_attention_layernorm.weight": (width,),
                  p + "self_attn.q_proj.weight": (heads * d, width),
                  p + "self_attn.k_proj.weight": (kv_heads * d, width),
                  p + "self_attn.v_proj.weight": (kv_heads * d, width),
                  p + "self_attn.o_proj.weight": (width, heads * d),
                  p + "mlp.gate_proj.weight": (ffn, width), p + "mlp.up_proj.weight": (ffn, width),
                  p + "mlp.down_proj.weight": (width, ffn)})
    return config, random_tensors(rng, t)


def random_tensors(rng, shapes):
    """Weights of order-1 pre-activations (std 1/sqrt(fan-in)); norm weights near 1."""
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            base = 1.0 if "ln" in name or "norm" in name else 0.0
            out[name] = (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = shape[0] if ".c_" in name else shape[1]
            out[name] = (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)
    return out


def save_hf(directory, config, tensors, bf16=False):
    """A save_pretrained-like folder: fp32 through the safetensors package, bf16 (which NumPy
    lacks) as bits through our writer."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    path = os.path.join(directory, "model.safetensors")
    if bf16:
        convert.write_safetensors(path, {k: convert.f32_to_bf16(v) for k, v in tensors.items()})
    else:
        safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})


def load_hf(directory):
    config, tensors = convert.read_hf_dir(directory)
    return config, {k: np.asarray(v) for k, v in tensors.items()}


def assert_same_tensors(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        assert np.array_equal(got[name].view(np.uint8), np.ascontiguousarray(want[name]).view(
            np.uint8)), name


MODELS = {
    "gpt2": lambda rng: gpt2_hf(rng),
    "llama": lambda rng: llama_hf(rng),
    "llama-tied-scaled": lambda rng: llama_hf(rng, tied=True, rope_scaling=True, ffn=200),
}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("bf16", [False, True])
def test_hf_to_ours_to_hf_is_bit_exact(tmp_path, model, bf16):
    config, tensors = MODELS[model](np.random.default_rng(0))
    save_hf(tmp_path / "hf", config, tensors, bf16)
    written = convert.hf_to_llmc(str(tmp_path / "hf"), str(tmp_path / "ours.bin"))
    assert written["family"] == ("gpt2" if model == "gpt2" else "llama3")
    hf_back = convert.llmc_to_hf(str(tmp_path / "ours.bin"), str(tmp_path / "back"))
    _, want = load_hf(tmp_path / "hf")
    config_back, got = load_hf(tmp_path / "back")
    assert_same_tensors(got, want)
    assert hf_back["dtype"] == ("bfloat16" if bf16 else "float32")
    for key, value in config.items():
        assert config_back[key] == value, key
    # Our files are what models::load_checkpoint expects: the header's sizes add up.
    cfg, ours = convert.read_llmc(str(tmp_path / "ours.bin"))
    assert ours["wte"].dtype == (np.uint16 if bf16 else np.float32)
    if model == "gpt2":
        assert cfg["padded_vocab"] == 384 and not np.any(ours["wte"][300:])


@pytest.mark.parametrize("model", list(MODELS))
def test_ours_to_hf_to_ours_is_bit_exact(tmp_path, model):
    config, tensors = MODELS[model](np.random.default_rng(1))
    save_hf(tmp_path / "hf", config, tensors)
    convert.hf_to_llmc(str(tmp_path / "hf"), str(tmp_path / "a.bin"))
    for dtype in ("fp32", "bf16"):
        a = tmp_path / f"a_{dtype}.bin"
        convert.hf_to_llmc(str(tmp_path / "hf"), str(a), dtype=dtype)
        convert.llmc_to_hf(str(a), str(tmp_path / f"hf_{dtype}"))
        convert.hf_to_llmc(str(tmp_path / f"hf_{dtype}"), str(tmp_path / f"b_{dtype}.bin"))
        assert (tmp_path / f"b_{dtype}.bin").read_bytes() == a.read_bytes(), dtype


def test_files_read_by_the_safetensors_package(tmp_path):
    config, tensors = llama_hf(np.random.default_rng(2))
    save_hf(tmp_path / "hf", config, tensors)
    convert.hf_to_llmc(str(tmp_path / "hf"), str(tmp_path / "ours.bin"))
    convert.llmc_to_hf(str(tmp_path / "ours.bin"), str(tmp_path / "back"))
    theirs = safetensors_numpy.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert_same_tensors(theirs, tensors)
    convert.llmc_to_hf(str(tmp_path / "ours.bin"), str(tmp_path / "back16"), dtype="bf16")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "back16" / "model.safetensors"), "numpy") as f:
        for name in tensors:
            s = f.get_slice(name)
            assert s.get_dtype() == "BF16" and tuple(s.get_shape()) == tensors[name].shape


def test_rope_permutation_preserves_attention_scores():
    """q.k of Hugging Face's rotate-half RoPE on HF rows equals q.k of the interleaved RoPE on
    the permuted rows, at every pair of positions."""
    rng = np.random.default_rng(3)
    heads, d, width, T = 2, 16, 24, 9
    wq, wk = rng.standard_normal((2, heads * d, width))
    x = rng.standard_normal((T, width))
    angle = np.arange(T)[:, None] * 500000.0 ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(angle), np.sin(angle)

    def hf_rope(y):  # y [T, heads, d]: rotate_half
        c, s = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]
        half = np.concatenate([-y[..., d // 2:], y[..., :d // 2]], -1)
        return y * c + half * s

    def meta_rope(y):  # interleaved pairs, as src/nn/rope.cpp
        y0, y1 = y[..., 0::2], y[..., 1::2]
        c, s = cos[:, None], sin[:, None]
        return np.stack([c * y0 - s * y1, s * y0 + c * y1], -1).reshape(y.shape)

    def scores(q, k):
        return np.einsum("ihd,jhd->hij", q, k)

    hf = scores(hf_rope((x @ wq.T).reshape(T, heads, d)), hf_rope((x @ wk.T).reshape(T, heads, d)))
    mq, mk = (convert.rotate_half_to_interleaved(w, heads) for w in (wq, wk))
    meta = scores(meta_rope((x @ mq.T).reshape(T, heads, d)),
                  meta_rope((x @ mk.T).reshape(T, heads, d)))
    assert np.allclose(hf, meta, rtol=1e-12, atol=1e-12)
    assert not np.allclose(hf, scores(meta_rope((x @ wq.T).reshape(T, heads, d)),
                                      meta_rope((x @ wk.T).reshape(T, heads, d))))
    assert np.array_equal(convert.interleaved_to_rotate_half(mq, heads), wq)


@pytest.mark.parametrize("width,ffn", [(4096, 14336), (2048, 8192), (64, 176), (64, 200),
                                       (128, 512), (96, 97)])
def test_llama_mlp_width_is_reproduced(width, ffn):
    multiple_of, multiplier = convert.llama_ffn_params(width, ffn)
    assert convert.llama_ffn_hidden(width, multiple_of, multiplier) == ffn


def test_unsupported_checkpoints_say_why(tmp_path):
    config, tensors = gpt2_hf(np.random.default_rng(4))
    for key, value, message in (("activation_function", "relu", "gelu_new"),
                                ("layer_norm_epsilon", 1e-6, "1e-5"),
                                ("model_type", "bert", "not supported")):
        save_hf(tmp_path / key, {**config, key: value}, tensors)
        with pytest.raises(convert.ConversionError, match=message):
            convert.hf_to_llmc(str(tmp_path / key), str(tmp_path / "x.bin"))
    config, tensors = llama_hf(np.random.default_rng(5))
    save_hf(tmp_path / "yarn", {**config, "rope_parameters": {"rope_type": "yarn"}}, tensors)
    with pytest.raises(convert.ConversionError, match="yarn"):
        convert.hf_to_llmc(str(tmp_path / "yarn"), str(tmp_path / "x.bin"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_hf(tmp_path / "missing", config, tensors)
    with pytest.raises(convert.ConversionError, match="up_proj.weight is missing"):
        convert.hf_to_llmc(str(tmp_path / "missing"), str(tmp_path / "x.bin"))
    (tmp_path / "short.bin").write_bytes(b"\0" * 1024)
    with pytest.raises(convert.ConversionError, match="not an llm.c model checkpoint"):
        convert.llmc_to_hf(str(tmp_path / "short.bin"), str(tmp_path / "out"))


def test_command_line(tmp_path):
    config, tensors = gpt2_hf(np.random.default_rng(6))
    save_hf(tmp_path / "hf", config, tensors)
    script = os.path.join(REPO, "scripts", "hf_convert.py")
    run = subprocess.run(["python3", script, "hf-to-llmc", str(tmp_path / "hf"),
                          str(tmp_path / "o.bin"), "--dtype", "bf16"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert "gpt2, 2 layers" in run.stdout
    run = subprocess.run(["python3", script, "llmc-to-hf", str(tmp_path / "missing.bin"),
                          str(tmp_path / "x")], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.startswith("error: ")


# ---------------------------------------------------------------- what the converted model computes


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def causal_attention(q, k, v):
    """q [T, H, D], k and v [T, Hkv, D]; float64."""
    T, H, D = q.shape
    k, v = (np.repeat(t, H // t.shape[1], axis=1) for t in (k, v))
    s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v).reshape(T, H * D)


def gpt2_logits(config, t, tokens):
    """Hugging Face's GPT-2 in float64: Conv1D weights [in, out], tied head."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    T, C, H = len(tokens), config["n_embd"], config["n_head"]
    x = t["transformer.wte.weight"][tokens] + t["transformer.wpe.weight"][:T]
    for layer in range(config["n_layer"]):
        p = f"transformer.h.{layer}."
        h = layer_norm(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"])
        qkv = h @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(T, H, C // H) for a in np.split(qkv, 3, axis=-1))
        x = x + causal_attention(q, k, v) @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        h = layer_norm(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"])
        u = h @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"]
        u = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
        x = x + u @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    x = layer_norm(x, t["transformer.ln_f.weight"], t["transformer.ln_f.bias"])
    return x @ t["transformer.wte.weight"].T


def llama_logits(config, t, tokens):
    """Hugging Face's Llama in float64: rotate-half RoPE, grouped-query attention, SwiGLU."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    T, C, H = len(tokens), config["hidden_size"], config["num_attention_heads"]
    Hkv, D, eps = config["num_key_value_heads"], C // H, config["rms_norm_eps"]
    theta = config["rope_parameters"]["rope_theta"]
    angle = np.arange(T)[:, None] * theta ** (-np.arange(0, D, 2) / D)[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, -1)[:, None]
    sin = np.concatenate([np.sin(angle)] * 2, -1)[:, None]

    def rope(y):
        return y * cos + np.concatenate([-y[..., D // 2:], y[..., :D // 2]], -1) * sin

    def rms(x, w):
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w

    x = t["model.embed_tokens.weight"][tokens]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q = rope((h @ t[p + "self_attn.q_proj.weight"].T).reshape(T, H, D))
        k = rope((h @ t[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D))
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        x = x + causal_attention(q, k, v) @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"])
        g = h @ t[p + "mlp.gate_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ t[p + "mlp.up_proj.weight"].T)) @ \
            t[p + "mlp.down_proj.weight"].T
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return rms(x, t["model.norm.weight"]) @ head.T


def cli():
    path = os.environ.get("FLASHTRAIN_CLI", os.path.join(REPO, "build", "flashtrain"))
    if not os.access(path, os.X_OK):
        pytest.skip(f"no flashtrain CLI at {path} (set FLASHTRAIN_CLI)")
    return path


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_converted_model_computes_the_hugging_face_logits(tmp_path, model):
    binary = cli()
    rng = np.random.default_rng(7)
    config, tensors = MODELS[model](rng)
    save_hf(tmp_path / "hf", config, tensors)
    convert.hf_to_llmc(str(tmp_path / "hf"), str(tmp_path / "ours.bin"))
    vocab = config["vocab_size"]
    tokens = rng.integers(0, vocab, size=(2, 21)).astype(np.int32)
    np.save(tmp_path / "x.npy", tokens)
    np.save(tmp_path / "y.npy", np.roll(tokens, -1, axis=1))
    run = subprocess.run([binary, "debug-step", "--load", str(tmp_path / "ours.bin"), "--tokens",
                          str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
                          "--out-dir", str(tmp_path / "dump"), "--steps", "0", "--device", "cpu",
                          "--attention", "flash"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    ours = np.load(tmp_path / "dump" / "logits.npy").reshape(2, 21, -1)[..., :vocab]
    forward = gpt2_logits if model == "gpt2" else llama_logits
    want = np.stack([forward(config, tensors, row) for row in tokens])
    err = np.linalg.norm(ours - want) / np.linalg.norm(want)
    assert err < 1e-5, err
