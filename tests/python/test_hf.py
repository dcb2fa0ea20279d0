"""Hugging Face transformers against flashtrain through the converter: a GPT-2 and a Llama with
random weights, built here, saved with save_pretrained and converted to llm.c checkpoints, give
transformers' logits through `flashtrain debug-step` (fp32, 1e-5); the same models trained by
`flashtrain train` for 10 steps and converted back load into transformers and give flashtrain's
logits; and save_pretrained -> ours -> HF loads back the original weights bit for bit.

Skips without PyTorch and transformers or without the CLI (FLASHTRAIN_CLI, default
build/flashtrain). FLASHTRAIN_HF_DEVICE=cuda runs flashtrain's side on the GPU."""

import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from flashtrain import convert  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEVICE = os.environ.get("FLASHTRAIN_HF_DEVICE", "cpu")
VOCAB = 50257  # GPT-2's, so that `flashtrain train` reads the shipped shards
FP32_BOUND = 1e-5


def cli():
    path = os.environ.get("FLASHTRAIN_CLI", os.path.join(REPO, "build", "flashtrain"))
    if not os.access(path, os.X_OK):
        pytest.skip(f"no flashtrain CLI at {path} (set FLASHTRAIN_CLI)")
    return path


def build(family):
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2,
                                         n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128,
                                          intermediate_size=352, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=128, rms_norm_eps=1e-5,
                                          rope_theta=500000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    # Wider than the default init (std 0.02), so that attention is far from uniform and a
    # wrong RoPE order or mask shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5 if "wte" not in name else 1.0)
    return model.float().eval()


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(tokens).long()).logits.double().numpy()


def debug_step_logits(tmp_path, checkpoint, tokens):
    np.save(tmp_path / "x.npy", tokens)
    np.save(tmp_path / "y.npy", np.roll(tokens, -1, axis=1))
    out = tmp_path / "dump"
    run = subprocess.run([cli(), "debug-step", "--load", str(checkpoint), "--tokens",
                          str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
                          "--out-dir", str(out), "--steps", "0", "--device", DEVICE,
                          "--attention", "flash"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    B, T = tokens.shape
    return np.load(out / "logits.npy").reshape(B, T, -1)[..., :VOCAB].astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_converted_models_agree_with_transformers(tmp_path, family):
    model = build(family)
    model.save_pretrained(tmp_path / "hf")
    convert.hf_to_llmc(str(tmp_path / "hf"), str(tmp_path / "ours.bin"))
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 64)).astype(np.int32)
    want = hf_logits(model, tokens)
    got = debug_step_logits(tmp_path, tmp_path / "ours.bin", tokens)
    assert rel(got, want) < FP32_BOUND

    # save_pretrained -> ours -> HF gives back the same weights, bit for bit.
    convert.llmc_to_hf(str(tmp_path / "ours.bin"), str(tmp_path / "back"))
    back = type(model).from_pretrained(tmp_path / "back")
    theirs = model.state_dict()
    for name, t in back.state_dict().items():
        assert torch.equal(t, theirs[name]), name

    # Trained here for 10 steps and converted back: transformers computes what we compute.
    run = subprocess.run([cli(), "train", "--load", str(tmp_path / "ours.bin"), "--steps", "10",
                          "--batch-size", "2", "--seq-len", "64", "--lr", "1e-3", "--device",
                          DEVICE, "--attention", "flash", "--val-data", "",
                          "--train-data", os.path.join(REPO, "data", "tinyshakespeare_train.bin"),
                          "--save", str(tmp_path / "trained.bin")],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    convert.llmc_to_hf(str(tmp_path / "trained.bin"), str(tmp_path / "trained_hf"))
    trained = type(model).from_pretrained(tmp_path / "trained_hf").float().eval()
    ours_trained = debug_step_logits(tmp_path, tmp_path / "trained.bin", tokens)
    theirs_trained = hf_logits(trained, tokens)
    assert rel(ours_trained, want) > 1e-3  # training changed the model
    assert rel(theirs_trained, ours_trained) < FP32_BOUND
