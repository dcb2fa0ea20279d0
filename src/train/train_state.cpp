#include "train/train_state.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ft::train {
namespace {

constexpr char kMagic[8] = {'F', 'T', 'S', 'T', 'A', 'T', 'E', '2'};
constexpr char kMagicFormat1[8] = {'F', 'T', 'S', 'T', 'A', 'T', 'E', '1'};

void ensure_moments(models::Parameter& p) {
  if (!p.m.defined()) p.m = Tensor::zeros(p.shape(), p.master_dtype(), p.grad.device());
  if (!p.v.defined()) p.v = Tensor::zeros(p.shape(), p.master_dtype(), p.grad.device());
}

// The header's fields have the types the readers take, so that a corrupt header is an ft::Error
// naming the field rather than a JSON exception.
void check_header(const nlohmann::json& h, const std::string& path) {
  auto field = [&](const nlohmann::json& j, const char* key) -> const nlohmann::json& {
    FT_CHECK(j.is_object() && j.contains(key), path, ": corrupt resume state header (no \"", key,
             "\" in ", j.dump().substr(0, 80), ")");
    return j[key];
  };
  auto check = [&](bool ok, const char* key, const char* what) {
    FT_CHECK(ok, path, ": corrupt resume state header (\"", key, "\" must be ", what, ")");
  };
  check(field(h, "run").is_object(), "run", "an object");
  check(field(h, "master_dtype").is_string(), "master_dtype", "a string");
  const nlohmann::json& step = field(h, "step");
  check(step.is_number_integer() && step.get<int64_t>() >= 0 &&
            step.get<int64_t>() < std::numeric_limits<int64_t>::max(),
        "step", "an integer >= 0");
  for (const char* key : {"shard", "position", "rng_state", "epoch"})
    check(field(field(h, "loader"), key).is_number_integer(), key, "an integer");
  check(field(h, "params").is_array(), "params", "an array");
  for (const nlohmann::json& p : h["params"]) {
    check(field(p, "name").is_string(), "name", "a string");
    check(field(p, "shape").is_array(), "shape", "an array");
  }
}

// Opens a state file and parses and checks its header; the stream is left at the first tensor.
std::ifstream open_state(const std::string& path, nlohmann::json& header) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path,
           ": cannot open resume state (written by --save next to the checkpoint)");
  char magic[8] = {};
  uint64_t length = 0;
  in.read(magic, sizeof magic);
  FT_CHECK(!in.good() || std::memcmp(magic, kMagicFormat1, sizeof magic) != 0, path,
           ": a resume state of format 1, written by an earlier flashtrain; it does not record "
           "the schedule, seed and data of its run, so this version cannot check a resume "
           "against it (start the run again, or resume it with the flashtrain that wrote it)");
  FT_CHECK(in.good() && std::memcmp(magic, kMagic, sizeof magic) == 0, path,
           ": not a flashtrain resume state (bad magic)");
  in.read(reinterpret_cast<char*>(&length), sizeof length);
  FT_CHECK(in.good(), path, ": truncated resume state header");
  std::error_code ec;
  const auto file_bytes = static_cast<uint64_t>(std::filesystem::file_size(path, ec));
  FT_CHECK(!ec && length <= file_bytes - sizeof magic - sizeof length, path,
           ": corrupt resume state header length ", length, " (the file has ", file_bytes,
           " bytes)");
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  FT_CHECK(in.good(), path, ": truncated resume state header");
  header = nlohmann::json::parse(text, nullptr, false);
  FT_CHECK(!header.is_discarded() && header.is_object(), path, ": corrupt resume state header");
  check_header(header, path);
  return in;
}

}  // namespace

void save_train_state(const std::string& path, const models::Transformer& model,
                      const TrainState& state) {
  nlohmann::json header;
  header["format"] = kTrainStateFormat;
  header["step"] = state.step;
  header["run"] = state.run;
  header["loader"] = {{"shard", state.loader.shard},
                      {"position", state.loader.position},
                      {"rng_state", state.loader.rng_state},
                      {"epoch", state.loader.epoch}};
  header["master_dtype"] = dtype_name(model.master_dtype());
  for (const models::Parameter& p : model.parameters())
    header["params"].push_back({{"name", p.name}, {"shape", p.shape()}});
  const std::string text = header.dump();
  const uint64_t length = text.size();

  AtomicFile file(path);
  file.write(kMagic, sizeof kMagic);
  file.write(&length, sizeof length);
  file.write(text.data(), text.size());
  for (const models::Parameter& p : model.parameters()) {
    models::Parameter& q = const_cast<models::Parameter&>(p);
    ensure_moments(q);
    // Whole fp32 masters, also where the model keeps them split: the format does not change.
    for (const Tensor& host :
         {q.master_weights(Device::cpu), q.m.to(Device::cpu), q.v.to(Device::cpu)}) {
      file.write(host.raw(), host.nbytes());
    }
  }
  file.commit();
}

TrainState read_train_state(const std::string& path) {
  nlohmann::json header;
  open_state(path, header);
  TrainState state;
  try {
    state.step = header.at("step").get<int64_t>();
    state.run = header.at("run");
    const auto& loader = header.at("loader");
    state.loader.shard = loader.at("shard").get<int64_t>();
    state.loader.position = loader.at("position").get<int64_t>();
    state.loader.rng_state = loader.at("rng_state").get<uint64_t>();
    state.loader.epoch = loader.at("epoch").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ": corrupt resume state header (", e.what(), ")"));
  }
  FT_CHECK(state.step >= 0 && state.run.is_object(), path, ": corrupt resume state header");
  return state;
}

void load_train_state(const std::string& path, models::Transformer& model) {
  nlohmann::json header;
  std::ifstream in = open_state(path, header);
  FT_CHECK(header.value("master_dtype", "") == dtype_name(model.master_dtype()), path,
           ": master weights are ", header.value("master_dtype", "?"), ", the model keeps ",
           dtype_name(model.master_dtype()));
  FT_CHECK(header.contains("params") && header["params"].is_array(), path,
           ": corrupt resume state header (no parameter list)");
  const auto& params = header.at("params");
  FT_CHECK(params.size() == model.parameters().size(), path, ": holds ", params.size(),
           " parameters, the model has ", model.parameters().size());
  for (size_t i = 0; i < params.size(); ++i) {
    models::Parameter& p = model.parameters()[i];
    FT_CHECK(params[i].value("name", "") == p.name && params[i].contains("shape") &&
                 params[i]["shape"] == p.shape(),
             path, ": parameter ", i, " is ", params[i].dump(), ", the model has ", p.name, " ",
             shape_str(p.shape()));
    ensure_moments(p);
    auto read = [&]() {
      Tensor host = Tensor::empty(p.shape(), p.master_dtype());
      in.read(static_cast<char*>(host.raw()), static_cast<std::streamsize>(host.nbytes()));
      FT_CHECK(in.good(), path, ": truncated resume state (in ", p.name, ")");
      return host;
    };
    p.set_master_weights(read());
    p.m.copy_from(read());
    p.v.copy_from(read());
  }
  in.peek();
  FT_CHECK(in.eof(), path, ": resume state has trailing bytes (not written for this model)");
}

}  // namespace ft::train
