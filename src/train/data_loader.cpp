#include "train/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/atomic_file.h"

namespace ft::train {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian; this reader assumes a little-endian host");

namespace {

constexpr int64_t kHeaderBytes = kShardHeaderInts * static_cast<int64_t>(sizeof(int32_t));

std::vector<std::string> expand_pattern(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) {
    FT_CHECK(std::filesystem::exists(pattern), "token shard '", pattern, "': no such file");
    return {pattern};
  }
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  FT_CHECK(!files.empty(), "token shards '", pattern, "': no file matches the pattern");
  std::sort(files.begin(), files.end());
  return files;
}

// Reads all token bytes of a shard whose header was checked.
std::vector<uint8_t> read_token_bytes(const std::string& path, const ShardHeader& h) {
  std::vector<uint8_t> bytes(static_cast<size_t>(h.num_tokens * h.token_bytes));
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "token shard '", path, "': cannot open");
  in.seekg(kHeaderBytes);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  FT_CHECK(in.good(), "token shard '", path, "': read failed");
  return bytes;
}

uint32_t token_at(const std::vector<uint8_t>& bytes, int token_bytes, int64_t i) {
  if (token_bytes == 2) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, bytes.data() + i * 4, 4);
  return v;
}

}  // namespace

ShardHeader read_shard_header(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  FT_CHECK(!ec, "token shard '", path, "': cannot open (", ec.message(), ")");
  FT_CHECK(static_cast<int64_t>(size) >= kHeaderBytes, "token shard '", path, "': ", size,
           " bytes, shorter than the ", kHeaderBytes, "-byte header");
  int32_t header[kShardHeaderInts];
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(header), kHeaderBytes);
  FT_CHECK(in.good(), "token shard '", path, "': cannot read the header");

  ShardHeader h;
  const int32_t magic = header[0], version = header[1];
  if (magic == kShardMagicU16) {
    FT_CHECK(version == kShardVersionU16, "token shard '", path, "': version ", version,
             " for magic ", magic, ", expected ", kShardVersionU16);
    h.token_bytes = 2;
  } else if (magic == kShardMagicU32) {
    FT_CHECK(version == kShardVersionU32, "token shard '", path, "': version ", version,
             " for magic ", magic, ", expected ", kShardVersionU32);
    h.token_bytes = 4;
  } else {
    throw Error(str("token shard '", path, "': bad magic ", magic, ", expected ", kShardMagicU16,
                    " (uint16 tokens) or ", kShardMagicU32, " (uint32 tokens)"));
  }
  h.num_tokens = header[2];
  FT_CHECK(h.num_tokens >= 0, "token shard '", path, "': negative token count ", h.num_tokens);
  const int64_t held = (static_cast<int64_t>(size) - kHeaderBytes) / h.token_bytes;
  const int64_t expected = kHeaderBytes + h.num_tokens * h.token_bytes;
  FT_CHECK(held >= h.num_tokens, "token shard '", path, "': truncated: the header says ",
           h.num_tokens, " tokens, the file holds ", held);
  FT_CHECK(static_cast<int64_t>(size) == expected, "token shard '", path, "': ", size,
           " bytes, but a header of ", h.num_tokens, " tokens means ", expected, " bytes");
  return h;
}

DataLoader::DataLoader(const std::string& pattern, int64_t B, int64_t T, bool shuffle,
                       uint64_t seed)
    : files_(expand_pattern(pattern)), B_(B), T_(T), shuffle_(shuffle), seed_(seed) {
  FT_CHECK(B > 0 && T > 0, "data loader: batch size ", B, " and sequence length ", T,
           " must be positive");
  const int64_t needed = B * T + 1;
  for (const auto& f : files_) {
    headers_.push_back(read_shard_header(f));
    FT_CHECK(headers_.back().num_tokens >= needed, "token shard '", f,
             "': ", headers_.back().num_tokens, " tokens, too few for one batch of B=", B, " T=", T,
             " (needs B*T+1 = ", needed, ")");
  }
  reset();
}

void DataLoader::reset() {
  state_ = LoaderState{};
  rng_.set_state(seed_);
  enter_shard(0);
}

int64_t DataLoader::batches_in_shard(int64_t shard) const {
  return (headers_[static_cast<size_t>(shard)].num_tokens - 1) / (B_ * T_);
}

void DataLoader::enter_shard(int64_t shard) {
  state_.shard = shard;
  state_.position = 0;
  if (loaded_shard_ != shard) {
    tokens_ =
        read_token_bytes(files_[static_cast<size_t>(shard)], headers_[static_cast<size_t>(shard)]);
    loaded_shard_ = shard;
  }
  if (shuffle_) {
    state_.rng_state = rng_.state();
    const int64_t n = batches_in_shard(shard);
    order_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order_[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
      const auto j = static_cast<int64_t>(rng_.next_u64() % static_cast<uint64_t>(i + 1));
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
  }
}

void DataLoader::advance_shard() {
  int64_t next = state_.shard + 1;
  if (next == static_cast<int64_t>(files_.size())) {
    next = 0;
    ++state_.epoch;
  }
  enter_shard(next);
}

void DataLoader::next_batch(Tensor& inputs, Tensor& targets) {
  const Shape shape{B_, T_};
  for (Tensor* t : {&inputs, &targets}) {
    if (!t->defined()) *t = Tensor::empty(shape, DType::i32);
    FT_CHECK(t->shape() == shape && t->dtype() == DType::i32 && t->device() == Device::cpu,
             "data loader: batch tensors must be int32 ", shape_str(shape), " on the cpu, got ",
             dtype_name(t->dtype()), " ", shape_str(t->shape()), " on ", device_name(t->device()));
  }
  if (state_.position >= batches_in_shard(state_.shard)) advance_shard();

  const int64_t batch = shuffle_ ? order_[static_cast<size_t>(state_.position)] : state_.position;
  const int64_t start = batch * B_ * T_;
  const int width = headers_[static_cast<size_t>(state_.shard)].token_bytes;
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  for (int64_t i = 0; i <= B_ * T_; ++i) {
    const uint32_t tok = token_at(tokens_, width, start + i);
    FT_CHECK(tok <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max()), "token shard '",
             files_[static_cast<size_t>(state_.shard)], "': token id ", tok, " at position ",
             start + i, " does not fit int32");
    if (i < B_ * T_) in[i] = static_cast<int32_t>(tok);
    if (i > 0) tg[i - 1] = static_cast<int32_t>(tok);
  }
  ++state_.position;
}

void DataLoader::skip(int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (state_.position >= batches_in_shard(state_.shard)) advance_shard();
    ++state_.position;
  }
}

int64_t DataLoader::num_tokens() const {
  int64_t n = 0;
  for (const auto& h : headers_) n += h.num_tokens;
  return n;
}

int64_t DataLoader::batches_per_epoch() const {
  int64_t n = 0;
  for (size_t s = 0; s < files_.size(); ++s) n += batches_in_shard(static_cast<int64_t>(s));
  return n;
}

void DataLoader::check_vocab(int64_t vocab) const {
  for (size_t s = 0; s < files_.size(); ++s) {
    const auto bytes = read_token_bytes(files_[s], headers_[s]);
    for (int64_t i = 0; i < headers_[s].num_tokens; ++i) {
      const uint32_t tok = token_at(bytes, headers_[s].token_bytes, i);
      FT_CHECK(tok < vocab, "token shard '", files_[s], "': token id ", tok, " at position ", i,
               " is outside the vocabulary [0, ", vocab, ")");
    }
  }
}

LoaderState DataLoader::state() const {
  return state_;
}

void DataLoader::restore(const LoaderState& s) {
  FT_CHECK(s.shard >= 0 && s.shard < static_cast<int64_t>(files_.size()),
           "data loader resume: shard ", s.shard, " outside [0, ", files_.size(), ")");
  FT_CHECK(s.position >= 0 && s.position <= batches_in_shard(s.shard),
           "data loader resume: position ", s.position, " outside [0, ", batches_in_shard(s.shard),
           "] for shard '", files_[static_cast<size_t>(s.shard)], "'");
  FT_CHECK(s.epoch >= 0, "data loader resume: negative epoch ", s.epoch);
  rng_.set_state(s.rng_state);
  enter_shard(s.shard);
  state_.position = s.position;
  state_.epoch = s.epoch;
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       bool uint32_tokens) {
  FT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "token shard '", path, "': ", tokens.size(), " tokens, the header allows at most ",
           std::numeric_limits<int32_t>::max());
  int32_t header[kShardHeaderInts] = {};
  header[0] = uint32_tokens ? kShardMagicU32 : kShardMagicU16;
  header[1] = uint32_tokens ? kShardVersionU32 : kShardVersionU16;
  header[2] = static_cast<int32_t>(tokens.size());
  std::vector<uint8_t> body(tokens.size() * (uint32_tokens ? 4 : 2));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (uint32_tokens) {
      std::memcpy(body.data() + i * 4, &tokens[i], 4);
    } else {
      FT_CHECK(tokens[i] <= 0xffff, "token shard '", path, "': token id ", tokens[i],
               " at position ", i, " does not fit uint16 (write a uint32 shard)");
      const auto v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(body.data() + i * 2, &v, 2);
    }
  }
  AtomicFile file(path);
  file.write(header, sizeof(header));
  file.write(body.data(), body.size());
  file.commit();
}

}  // namespace ft::train
