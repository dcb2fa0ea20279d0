#include "models/checkpoint.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ft::models {
namespace {

constexpr int kVersionFp32 = 3;
constexpr int kVersionBf16 = 5;

// One tensor of the file: the parameter and how many of its leading rows are stored.
struct Entry {
  const Parameter* param;
  int64_t stored_rows;
};

std::vector<Entry> file_layout(const Transformer& model) {
  const ModelConfig& c = model.config();
  auto find = [&](const std::string& name) -> const Parameter* {
    for (const Parameter& p : model.parameters())
      if (p.name == name) return &p;
    throw Error(str("internal error: no parameter ", name));
  };
  std::vector<Entry> out;
  auto whole = [&](const std::string& name) {
    const Parameter* p = find(name);
    out.push_back({p, p->shape()[0]});
  };
  auto per_layer = [&](const std::string& kind) {
    for (int64_t l = 0; l < c.n_layer; ++l) whole("h." + std::to_string(l) + "." + kind);
  };
  if (c.family == Family::gpt2) {
    whole("wte");
    whole("wpe");
    for (const char* kind : {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                             "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                             "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"})
      per_layer(kind);
    whole("normf.weight");
    whole("normf.bias");
  } else {
    out.push_back({find("wte"), c.vocab_size});
    for (const char* kind : {"norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight",
                             "mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight"})
      per_layer(kind);
    whole("normf.weight");
    out.push_back({find("head.weight"), c.vocab_size});
  }
  return out;
}

int64_t row_elems(const Parameter& p) {
  return p.numel() / p.shape()[0];
}

int64_t header_bytes(Family f) {
  return f == Family::gpt2 ? 1024 : 2048;
}

struct Header {
  std::array<int32_t, 256> ints{};
  std::array<float, 256> floats{};
};

Header make_header(const ModelConfig& c, DType file_dtype) {
  Header h;
  const int version = file_dtype == DType::bf16 ? kVersionBf16 : kVersionFp32;
  auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  if (c.family == Family::gpt2) {
    h.ints = {kGpt2CheckpointMagic, version,       i32(c.max_seq_len), i32(c.vocab_size),
              i32(c.n_layer),       i32(c.n_head), i32(c.n_embd),      i32(c.padded_vocab_size)};
  } else {
    h.ints = {kLlama3CheckpointMagic,
              version,
              i32(c.max_seq_len),
              i32(c.vocab_size),
              i32(c.n_layer),
              i32(c.n_head),
              i32(c.n_kv_head),
              i32(c.n_embd),
              i32(c.multiple_of),
              c.rope_scaling,
              3,
              1};
    h.floats[0] = static_cast<float>(c.ffn_dim_multiplier);
    h.floats[1] = static_cast<float>(c.norm_eps);
    h.floats[2] = static_cast<float>(c.rope_theta);
  }
  return h;
}

ModelConfig config_from_header(const Header& h, const std::string& path) {
  ModelConfig c;
  c.name = std::filesystem::path(path).filename().string();
  const int magic = h.ints[0];
  if (magic == kGpt2CheckpointMagic) {
    c.family = Family::gpt2;
    c.max_seq_len = h.ints[2];
    c.vocab_size = h.ints[3];
    c.n_layer = h.ints[4];
    c.n_head = h.ints[5];
    c.n_kv_head = h.ints[5];
    c.n_embd = h.ints[6];
    c.finalize();
    c.padded_vocab_size = h.ints[7];
    FT_CHECK(c.padded_vocab_size >= c.vocab_size, path, ": padded vocab ", c.padded_vocab_size,
             " is smaller than vocab ", c.vocab_size);
  } else if (magic == kLlama3CheckpointMagic) {
    c.family = Family::llama3;
    c.max_seq_len = h.ints[2];
    c.vocab_size = h.ints[3];
    c.n_layer = h.ints[4];
    c.n_head = h.ints[5];
    c.n_kv_head = h.ints[6];
    c.n_embd = h.ints[7];
    c.multiple_of = h.ints[8];
    c.rope_scaling = h.ints[9] != 0;
    c.ffn_dim_multiplier = h.floats[0];
    c.norm_eps = h.floats[1];
    c.rope_theta = h.floats[2];
    c.finalize();
  } else {
    throw Error(str(path, ": not an llm.c model checkpoint (magic ", magic, "; expected ",
                    kGpt2CheckpointMagic, " for GPT-2 or ", kLlama3CheckpointMagic,
                    " for LLaMA-3)"));
  }
  const int version = h.ints[1];
  FT_CHECK(version == kVersionFp32 || version == kVersionBf16, path,
           ": unsupported checkpoint version ", version, " (supported: 3 = fp32, 5 = bf16)");
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str(path, ": bad model shape in header: ", e.what()));
  }
  return c;
}

Header read_header(std::ifstream& in, const std::string& path) {
  Header h;
  in.read(reinterpret_cast<char*>(h.ints.data()), 1024);
  FT_CHECK(in.gcount() == 1024, path, ": truncated checkpoint (", in.gcount(),
           " bytes, the header alone is 1024)");
  if (h.ints[0] == kLlama3CheckpointMagic) {
    in.read(reinterpret_cast<char*>(h.floats.data()), 1024);
    FT_CHECK(in.gcount() == 1024, path, ": truncated LLaMA-3 checkpoint header");
  }
  return h;
}

DType file_dtype_of(const Header& h) {
  return h.ints[1] == kVersionBf16 ? DType::bf16 : DType::f32;
}

// Elements the file stores (file_layout): every parameter, except that LLaMA-3 files hold only
// the real vocabulary's rows of the embedding and of the head.
int64_t stored_elements(const ModelConfig& c) {
  const int64_t unstored_rows = c.family == Family::llama3 ? c.padded_vocab_size - c.vocab_size : 0;
  return c.num_parameters() - 2 * unstored_rows * c.n_embd;
}

// The header's model, checked against the file's size before anything is allocated for it: a
// header can only describe as many weights as the file holds.
ModelConfig read_config(std::ifstream& in, const std::string& path, Header& h) {
  h = read_header(in, path);
  const ModelConfig c = config_from_header(h, path);
  const int64_t expected = header_bytes(c.family) +
                           stored_elements(c) * static_cast<int64_t>(dtype_size(file_dtype_of(h)));
  std::error_code ec;
  const auto actual = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  FT_CHECK(!ec, path, ": cannot read the checkpoint's size (", ec.message(), ")");
  FT_CHECK(actual == expected, path, ": checkpoint holds ", actual, " bytes, its header (",
           c.describe(), ", ", dtype_name(file_dtype_of(h)), ") implies ", expected,
           " (truncated, or not this model)");
  return c;
}

}  // namespace

void save_checkpoint(const std::string& path, const Transformer& model, DType file_dtype) {
  FT_CHECK(file_dtype == DType::f32 || file_dtype == DType::bf16,
           "checkpoints are fp32 or bf16, not ", dtype_name(file_dtype));
  const ModelConfig& c = model.config();
  const Header h = make_header(c, file_dtype);
  AtomicFile file(path);
  file.write(h.ints.data(), 1024);
  if (c.family == Family::llama3) file.write(h.floats.data(), 1024);
  for (const Entry& e : file_layout(model)) {
    const Tensor rows = e.param->master_weights(Device::cpu).slice(0, e.stored_rows);
    const Tensor converted = rows.to(file_dtype);
    file.write(converted.raw(), converted.nbytes());
  }
  file.commit();
}

ModelConfig read_checkpoint_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path, ": cannot open checkpoint");
  Header h;
  return read_config(in, path, h);
}

void load_checkpoint(const std::string& path, Transformer& model) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path, ": cannot open checkpoint");
  Header h;
  const ModelConfig file_config = read_config(in, path, h);
  const ModelConfig& c = model.config();
  FT_CHECK(file_config.family == c.family && file_config.n_layer == c.n_layer &&
               file_config.n_embd == c.n_embd && file_config.n_head == c.n_head &&
               file_config.n_kv_head == c.n_kv_head && file_config.vocab_size == c.vocab_size &&
               file_config.padded_vocab_size == c.padded_vocab_size &&
               file_config.ffn_hidden == c.ffn_hidden && file_config.max_seq_len == c.max_seq_len,
           path, ": checkpoint shape (", file_config.describe(), ") does not match the model (",
           c.describe(), ")");
  const DType file_dtype = file_dtype_of(h);
  const std::vector<Entry> layout = file_layout(model);
  int64_t expected = header_bytes(c.family);
  for (const Entry& e : layout)
    expected += e.stored_rows * row_elems(*e.param) * static_cast<int64_t>(dtype_size(file_dtype));
  const auto actual = static_cast<int64_t>(std::filesystem::file_size(path));
  FT_CHECK(actual == expected, path, ": checkpoint holds ", actual, " bytes, its header implies ",
           expected, " (truncated or not this model)");
  for (const Entry& e : layout) {
    Parameter& p = const_cast<Parameter&>(*e.param);
    Tensor buf = Tensor::empty({e.stored_rows, row_elems(p)}, file_dtype);
    in.read(static_cast<char*>(buf.raw()), static_cast<std::streamsize>(buf.nbytes()));
    FT_CHECK(in.good(), path, ": read failed in ", p.name);
    // Rows past the stored ones (padded vocabulary) stay zero.
    Tensor master = Tensor::zeros(p.shape(), model.master_dtype());
    Tensor dst = master.slice(0, e.stored_rows);
    dst.copy_from(buf);
    p.set_master_weights(master);
  }
}

}  // namespace ft::models
