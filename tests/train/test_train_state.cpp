// The resume state reader (train/train_state.h) on corrupt headers: each is an ft::Error naming
// the file and the field, never a JSON exception or an allocation sized by the header (found by
// fuzz_train_state: tests/fuzz/corpus/train_state/regress-*).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/config.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/train_state.h"

namespace ft::train {
namespace {

models::Transformer tiny_model() {
  models::ModelOverrides o;
  o.layers = 1;
  o.width = 8;
  o.heads = 2;
  o.vocab = 2;
  o.context = 2;
  return models::Transformer(models::apply_overrides(models::preset("gpt2-tiny"), o), DType::f32,
                             {});
}

struct StateFile {
  nlohmann::json header;
  std::string payload;  // master weights and moments, as saved
};

StateFile read_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint64_t length = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&length), 8);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  StateFile s{nlohmann::json::parse(text), {}};
  s.payload.assign(std::istreambuf_iterator<char>(in), {});
  return s;
}

std::string write_state(const std::string& path, const std::string& text,
                        const std::string& payload, uint64_t length) {
  std::ofstream out(path, std::ios::binary);
  out.write("FTSTATE2", 8);
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text << payload;
  return path;
}

void expect_refused(models::Transformer& model, const std::string& path,
                    const std::string& needle) {
  try {
    read_train_state(path);
    load_train_state(path, model);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainState, CorruptHeadersGiveClearErrors) {
  test::TempDir dir;
  models::Transformer model = tiny_model();
  model.init_weights(1);
  TrainState state;
  state.step = 5;
  state.run = nlohmann::json::object();
  save_train_state(dir.file("good.state"), model, state);
  EXPECT_EQ(read_train_state(dir.file("good.state")).step, 5);
  load_train_state(dir.file("good.state"), model);
  const StateFile good = read_state(dir.file("good.state"));

  auto with = [&](const std::string& name, const nlohmann::json& header) {
    const std::string text = header.dump();
    return write_state(dir.file(name), text, good.payload, text.size());
  };
  nlohmann::json h = good.header;
  h.erase("params");
  expect_refused(model, with("no_params.state", h), "no \"params\"");
  h = good.header;
  h["step"] = "five";
  expect_refused(model, with("step.state", h), "\"step\" must be an integer >= 0");
  h = good.header;
  h["step"] = -1;
  expect_refused(model, with("negative.state", h), "\"step\" must be an integer >= 0");
  h = good.header;
  h["params"][0].erase("shape");
  expect_refused(model, with("shape.state", h), "no \"shape\"");
  h = good.header;
  h["run"] = 7;
  expect_refused(model, with("run.state", h), "\"run\" must be an object");
  h = good.header;
  h["loader"]["position"] = nullptr;
  expect_refused(model, with("loader.state", h), "\"position\" must be an integer");
  // A header length past the end of the file is refused before it is allocated.
  expect_refused(model, write_state(dir.file("length.state"), "{}", "", uint64_t{1} << 40),
                 "corrupt resume state header length 1099511627776 (the file has 18 bytes)");
}

}  // namespace
}  // namespace ft::train
