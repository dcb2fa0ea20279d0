#include "train/train_state.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ft::train {
namespace {

constexpr char kMagic[8] = {'F', 'T', 'S', 'T', 'A', 'T', 'E', '1'};

void ensure_moments(models::Parameter& p) {
  if (!p.m.defined()) p.m = Tensor::zeros(p.master.shape(), p.master.dtype(), p.master.device());
  if (!p.v.defined()) p.v = Tensor::zeros(p.master.shape(), p.master.dtype(), p.master.device());
}

}  // namespace

void save_train_state(const std::string& path, const models::Transformer& model,
                      const TrainState& state) {
  nlohmann::json header;
  header["step"] = state.step;
  header["fingerprint"] = state.fingerprint;
  header["loader"] = {{"shard", state.loader.shard},
                      {"position", state.loader.position},
                      {"rng_state", state.loader.rng_state},
                      {"epoch", state.loader.epoch}};
  header["master_dtype"] = dtype_name(model.master_dtype());
  for (const models::Parameter& p : model.parameters())
    header["params"].push_back({{"name", p.name}, {"shape", p.master.shape()}});
  const std::string text = header.dump();
  const uint64_t length = text.size();

  AtomicFile file(path);
  file.write(kMagic, sizeof kMagic);
  file.write(&length, sizeof length);
  file.write(text.data(), text.size());
  for (const models::Parameter& p : model.parameters()) {
    models::Parameter& q = const_cast<models::Parameter&>(p);
    ensure_moments(q);
    for (const Tensor* t : {&q.master, &q.m, &q.v}) {
      const Tensor host = t->to(Device::cpu);
      file.write(host.raw(), host.nbytes());
    }
  }
  file.commit();
}

TrainState load_train_state(const std::string& path, models::Transformer& model,
                            const std::string& expected_fingerprint) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path,
           ": cannot open resume state (written by --save next to the checkpoint)");
  char magic[8] = {};
  uint64_t length = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&length), sizeof length);
  FT_CHECK(in.good() && std::memcmp(magic, kMagic, sizeof magic) == 0, path,
           ": not a flashtrain resume state (bad magic)");
  FT_CHECK(length < (1u << 30), path, ": corrupt resume state header length ", length);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  FT_CHECK(in.good(), path, ": truncated resume state header");
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  FT_CHECK(!header.is_discarded(), path, ": corrupt resume state header");

  const std::string fingerprint = header.value("fingerprint", "");
  FT_CHECK(fingerprint == expected_fingerprint, path,
           ": written for a different run:\n  state: ", fingerprint,
           "\n  now:   ", expected_fingerprint);
  FT_CHECK(header.value("master_dtype", "") == dtype_name(model.master_dtype()), path,
           ": master weights are ", header.value("master_dtype", "?"), ", the model keeps ",
           dtype_name(model.master_dtype()));
  const auto& params = header.at("params");
  FT_CHECK(params.size() == model.parameters().size(), path, ": holds ", params.size(),
           " parameters, the model has ", model.parameters().size());
  for (size_t i = 0; i < params.size(); ++i) {
    models::Parameter& p = model.parameters()[i];
    FT_CHECK(params[i].at("name") == p.name && params[i].at("shape") == p.master.shape(), path,
             ": parameter ", i, " is ", params[i].dump(), ", the model has ", p.name, " ",
             shape_str(p.master.shape()));
    ensure_moments(p);
    for (Tensor* t : {&p.master, &p.m, &p.v}) {
      Tensor host = Tensor::empty(t->shape(), t->dtype());
      in.read(static_cast<char*>(host.raw()), static_cast<std::streamsize>(host.nbytes()));
      FT_CHECK(in.good(), path, ": truncated resume state (in ", p.name, ")");
      t->copy_from(host);
    }
    p.sync_compute();
  }
  in.peek();
  FT_CHECK(in.eof(), path, ": resume state has trailing bytes (not written for this model)");

  TrainState state;
  state.step = header.at("step").get<int64_t>();
  state.fingerprint = fingerprint;
  const auto& loader = header.at("loader");
  state.loader.shard = loader.at("shard").get<int64_t>();
  state.loader.position = loader.at("position").get<int64_t>();
  state.loader.rng_state = loader.at("rng_state").get<uint64_t>();
  state.loader.epoch = loader.at("epoch").get<int64_t>();
  return state;
}

}  // namespace ft::train
