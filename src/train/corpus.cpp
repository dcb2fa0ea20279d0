#include "train/corpus.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_path.h"
#include "train/data_loader.h"
#include "train/utf8.h"

namespace ft::train {
namespace {

namespace fs = std::filesystem;

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path, ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool is_json_lines(const std::string& path) {
  return fs::path(path).extension() == ".jsonl";
}

// Tokenises documents into the validation part, then training shards written as they fill.
class ShardWriter {
 public:
  ShardWriter(const CorpusOptions& o, std::string prefix, CorpusSummary& summary)
      : o_(o), prefix_(std::move(prefix)), summary_(summary) {}

  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      if (static_cast<int64_t>(val_.size()) < o_.val_tokens) {
        val_.push_back(static_cast<uint32_t>(id));
        continue;
      }
      train_.push_back(static_cast<uint32_t>(id));
      // Only once a shard is full and one more token has come is it written: so a numbered
      // name is used exactly when there are at least two training shards.
      if (static_cast<int64_t>(train_.size()) > o_.shard_tokens) {
        const uint32_t extra = train_.back();
        train_.pop_back();
        write(numbered(shard_index_++), train_);
        train_.assign(1, extra);
      }
    }
  }

  void finish() {
    FT_CHECK(!train_.empty() || shard_index_ > 0, "the input holds ", val_.size(),
             " tokens, all taken by --val-tokens ", o_.val_tokens,
             "; nothing is left for training (lower --val-tokens)");
    if (!val_.empty()) write(prefix_ + "_val.bin", val_);
    write(shard_index_ == 0 ? prefix_ + "_train.bin" : numbered(shard_index_), train_);
  }

 private:
  std::string numbered(int index) const {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "_train_%06d.bin", index);
    return prefix_ + suffix;
  }
  void write(const std::string& path, std::vector<uint32_t>& tokens) {
    write_token_shard(path, tokens, o_.uint32_tokens);
    summary_.shards.emplace_back(path, static_cast<int64_t>(tokens.size()));
    tokens.clear();
  }

  const CorpusOptions& o_;
  std::string prefix_;
  CorpusSummary& summary_;
  std::vector<uint32_t> val_, train_;
  int shard_index_ = 0;
};

}  // namespace

std::vector<std::string> corpus_files(const std::vector<std::string>& inputs) {
  FT_CHECK(!inputs.empty(), "no input given (text files, directories or *.jsonl files)");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    FT_CHECK(fs::exists(input, ec), input, ": no such file or directory");
    if (!fs::is_directory(input, ec)) {
      files.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(input, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      FT_CHECK(!ec, input, ": cannot list (", ec.message(), ")");
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) found.push_back(it->path().string());
    }
    std::sort(found.begin(), found.end());
    FT_CHECK(!found.empty(), input, ": the directory holds no files");
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

CorpusSummary prepare_corpus(const CorpusOptions& o, Gpt2Encoder& encoder,
                             const std::function<void(const CorpusProgress&)>& progress) {
  FT_CHECK(o.val_tokens >= 0, "--val-tokens must be >= 0 (0: no validation shard), got ",
           o.val_tokens);
  FT_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= std::numeric_limits<int32_t>::max(),
           "--shard-tokens must be in [1, 2^31 - 1] (the shard header's count), got ",
           o.shard_tokens);
  FT_CHECK(!o.jsonl_field.empty(), "--jsonl-field is empty");
  const std::vector<std::string> files = corpus_files(o.inputs);
  const std::string name = o.name.empty() ? fs::path(o.inputs.front()).stem().string() : o.name;
  FT_CHECK(!name.empty() && name.find('/') == std::string::npos, "--name '", name,
           "' must be a file name prefix (no '/')");
  CorpusProgress p;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    FT_CHECK(!ec, f, ": cannot read (", ec.message(), ")");
    p.bytes_total += static_cast<int64_t>(size);
  }
  prepare_output_dir(o.out_dir, "--out-dir");

  CorpusSummary summary;
  summary.files = static_cast<int64_t>(files.size());
  ShardWriter writer(o, (fs::path(o.out_dir) / name).string(), summary);
  using Clock = std::chrono::steady_clock;
  constexpr auto kReportEvery = std::chrono::seconds(2);
  auto last_report = Clock::now();
  int64_t pieces = 0;
  std::vector<int32_t> ids;
  // One document: the end-of-text token, then the text's ids; progress between pieces.
  auto add_document = [&](std::string_view text, int64_t bytes_before) {
    std::string repaired;
    if (!is_valid_utf8(text)) {
      repaired = valid_utf8(text);
      summary.replaced_bytes += static_cast<int64_t>(text.size());
      text = repaired;
    }
    ids.assign(1, encoder.eot_token());
    for (std::string_view piece : gpt2_pretokenize(text)) {
      encoder.encode_piece(piece, ids);
      if (progress && ++pieces % 4096 == 0 && Clock::now() - last_report > kReportEvery) {
        last_report = Clock::now();
        CorpusProgress now = p;
        now.bytes_done =
            bytes_before + static_cast<int64_t>(piece.data() + piece.size() - text.data());
        now.tokens += static_cast<int64_t>(ids.size());
        progress(now);
      }
    }
    writer.add(ids);
    p.tokens += static_cast<int64_t>(ids.size());
    ++p.documents;
  };
  for (const std::string& f : files) {
    const std::string data = read_whole(f);
    const int64_t base = p.bytes_done;
    if (is_json_lines(f)) {
      size_t start = 0;
      for (int64_t line_no = 1; start < data.size(); ++line_no) {
        const size_t end = std::min(data.find('\n', start), data.size());
        const std::string_view line(data.data() + start, end - start);
        if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
          const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
          FT_CHECK(!j.is_discarded() && j.is_object(), f, ":", line_no, ": not a JSON object");
          FT_CHECK(j.contains(o.jsonl_field) && j[o.jsonl_field].is_string(), f, ":", line_no,
                   ": no string field \"", o.jsonl_field, "\" (choose it with --jsonl-field)");
          add_document(j[o.jsonl_field].get<std::string>(), base + static_cast<int64_t>(start));
        }
        start = end + 1;
      }
    } else if (o.split_on.empty()) {
      add_document(data, base);
    } else {
      size_t start = 0;
      while (true) {
        const size_t sep = data.find(o.split_on, start);
        const bool last = sep == std::string::npos;
        const size_t end = last ? data.size() : sep + o.split_on.size();
        add_document(std::string_view(data).substr(start, end - start),
                     base + static_cast<int64_t>(start));
        if (last) break;
        start = end;
      }
    }
    p.bytes_done = base + static_cast<int64_t>(data.size());
    if (progress) progress(p);
  }
  writer.finish();
  summary.documents = p.documents;
  summary.tokens = p.tokens;
  return summary;
}

}  // namespace ft::train
