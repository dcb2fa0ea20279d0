#include "train/run_log.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ft::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool is_blank(std::string_view s) {
  return trim(s).empty();
}

// The first word of s (up to a space or '|'), for "got '...'" in messages.
std::string first_word(std::string_view s) {
  s = trim(s);
  size_t n = 0;
  while (n < s.size() && !is_space(s[n]) && s[n] != '|' && n < 24) ++n;
  return n == 0 ? std::string("end of line") : str("'", s.substr(0, n), "'");
}

// A number that must end at a field boundary: "4.56abc" is not a number.
std::optional<double> parse_number(std::string_view& rest) {
  while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
  double v = 0.0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc()) return std::nullopt;
  const std::string_view after = rest.substr(static_cast<size_t>(end - rest.data()));
  if (!after.empty() && !is_space(after.front()) &&
      std::string_view("|),").find(after.front()) == std::string_view::npos) {
    return std::nullopt;
  }
  rest = after;
  return v;
}

std::optional<int64_t> parse_integer(std::string_view& rest) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc() || v < 0) return std::nullopt;
  rest.remove_prefix(static_cast<size_t>(end - rest.data()));
  return v;
}

std::string normalize_dtype(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return "fp32";
  if (s == "bf16" || s == "bfloat16") return "bf16";
  throw Error(str("dtype \"", s, "\": expected fp32 or bf16"));
}

// ---- text logs ----

// Finds `step N/M |` (a whole word "step", spaces, digits, '/', digits, then a field bar) and
// leaves `rest` after `N/M`. A line without one is not a step line.
bool find_step_marker(std::string_view line, LoggedStep& r, std::string_view& rest) {
  for (size_t pos = line.find("step"); pos != std::string_view::npos;
       pos = line.find("step", pos + 1)) {
    if (pos > 0 &&
        (std::isalnum(static_cast<unsigned char>(line[pos - 1])) || line[pos - 1] == '_'))
      continue;
    std::string_view s = line.substr(pos + 4);
    if (s.empty() || !is_space(s.front())) continue;
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    const std::optional<int64_t> step = parse_integer(s);
    if (!step || s.empty() || s.front() != '/') continue;
    s.remove_prefix(1);
    const std::optional<int64_t> total = parse_integer(s);
    if (!total || trim(s).substr(0, 1) != "|") continue;
    r.step = *step;
    r.total_steps = *total;
    rest = s;
    return true;
  }
  return false;
}

bool take(std::string_view& rest, std::string_view word) {
  std::string_view s = rest;
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  if (s.substr(0, word.size()) != word) return false;
  rest = s.substr(word.size());
  return true;
}

// One field of the text after the loss: "lr 1.00e-04", "81.50 ms", "25128 tok/s",
// "peak used:  5896 MB", "peak reserved:  5952 MB". Unknown fields are skipped.
void read_text_field(std::string_view field, LoggedStep& r) {
  field = trim(field);
  auto number_in = [&](std::string_view text, const char* what) {
    std::string_view s = text;
    const std::optional<double> v = parse_number(s);
    FT_CHECK(v && (is_blank(s) || trim(s) == "MB"), "expected a number in the ", what,
             " field, got '", std::string(field), "'");
    return *v;
  };
  auto ends_with = [&](std::string_view suffix) {
    return field.size() > suffix.size() && field.substr(field.size() - suffix.size()) == suffix;
  };
  if (field.substr(0, 3) == "lr ") {
    r.lr = number_in(field.substr(3), "lr");
  } else if (ends_with(" ms")) {
    r.ms = number_in(field.substr(0, field.size() - 3), "ms");
  } else if (ends_with(" tok/s")) {
    r.tokens_per_second = number_in(field.substr(0, field.size() - 6), "tok/s");
  } else if (field.substr(0, 10) == "peak used:") {
    r.peak_used_mb = number_in(field.substr(10), "peak used");
  } else if (field.substr(0, 14) == "peak reserved:") {
    r.peak_reserved_mb = number_in(field.substr(14), "peak reserved");
  }
}

// Returns false for a line that is not a step line; throws for a step line that is broken.
bool parse_text_step(std::string_view line, LoggedStep& r) {
  std::string_view rest;
  if (!find_step_marker(line, r, rest)) return false;
  FT_CHECK(r.step >= 1, "step ", r.step, ": steps count from 1");
  FT_CHECK(take(rest, "|") && take(rest, "train loss"),
           "expected '| train loss <number>' after 'step ", r.step, "/", r.total_steps, "', got ",
           first_word(rest));
  const std::optional<double> loss = parse_number(rest);
  FT_CHECK(loss.has_value(), "expected a number after 'train loss', got ", first_word(rest));
  r.train_loss = *loss;
  size_t start = 0;
  for (size_t i = 0; i <= rest.size(); ++i) {
    if (i == rest.size() || std::string_view("|(),").find(rest[i]) != std::string_view::npos) {
      read_text_field(rest.substr(start, i - start), r);
      start = i + 1;
    }
  }
  return true;
}

// ---- JSON lines ----

double json_number(const json& j, const char* key) {
  const json& v = j.at(key);
  FT_CHECK(v.is_number(), "\"", key, "\": expected a number, got ", v.dump());
  return v.get<double>();
}

std::optional<double> optional_number(const json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  return json_number(j, key);
}

int64_t json_step_number(const json& j, const char* key) {
  const json& v = j.at(key);
  FT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, "\"", key,
           "\": expected an integer >= 1, got ", v.dump());
  return v.get<int64_t>();
}

LoggedStep json_step(const json& j) {
  FT_CHECK(j.contains("step") && j.contains("train_loss"),
           "expected a step record with \"step\" and \"train_loss\" (or an \"event\" line), got ",
           j.dump().substr(0, 80));
  LoggedStep r;
  r.step = json_step_number(j, "step");
  if (j.contains("steps")) r.total_steps = json_step_number(j, "steps");
  r.train_loss = json_number(j, "train_loss");
  r.lr = optional_number(j, "lr");
  r.ms = optional_number(j, "ms");
  r.tokens_per_second = optional_number(j, "tok_per_s");
  r.peak_used_mb = optional_number(j, "peak_used_mb");
  r.peak_reserved_mb = optional_number(j, "peak_reserved_mb");
  r.grad_norm = optional_number(j, "grad_norm");
  r.attention_saved_mb = optional_number(j, "attention_saved_mb");
  return r;
}

RunFailure json_failure(const json& j, int64_t line) {
  RunFailure f;
  f.step = json_step_number(j, "step");
  for (auto [key, field] : {std::pair{"kind", &f.kind}, std::pair{"message", &f.message}}) {
    FT_CHECK(j.contains(key) && j[key].is_string(), "the error line needs \"", key,
             "\" (a string)");
    *field = j[key].get<std::string>();
  }
  f.line = line;
  return f;
}

std::string json_parse_message(const json::parse_error& e) {
  // nlohmann says "[json.exception.parse_error.101] parse error at line 1, column 66: ...";
  // each line is parsed alone, so only the column means anything.
  const std::string what = e.what();
  const size_t column = what.find("column ");
  return column == std::string::npos ? what : what.substr(column);
}

// Adds a step, refusing a step number seen before.
void add_step(std::map<int64_t, LoggedStep>& steps, const LoggedStep& r) {
  const auto [it, inserted] = steps.emplace(r.step, r);
  FT_CHECK(inserted, "step ", r.step, " appears twice (first on line ", it->second.line, ")");
}

void finish(RunLog& log, std::map<int64_t, LoggedStep>& steps) {
  log.steps.reserve(steps.size());
  for (auto& [step, r] : steps) log.steps.push_back(r);
}

RunLog new_log(const std::string& path, LogFormat format) {
  RunLog log;
  log.path = path;
  log.name = fs::path(path).stem().string();
  log.format = format;
  return log;
}

bool has_extension(const std::string& path, std::initializer_list<const char*> exts) {
  const std::string ext = fs::path(path).extension().string();
  return std::any_of(exts.begin(), exts.end(), [&](const char* e) { return ext == e; });
}

bool is_log_file_name(const std::string& path) {
  return has_extension(path, {".jsonl", ".log"});
}

}  // namespace

std::string dtype_from_file_name(const std::string& path) {
  return fs::path(path).filename().string().find("_bfloat16") != std::string::npos ? "bf16"
                                                                                   : "fp32";
}

RunLog parse_text_log(std::istream& in, const std::string& path) {
  RunLog log = new_log(path, LogFormat::text);
  log.dtype = dtype_from_file_name(path);
  std::map<int64_t, LoggedStep> steps;
  std::string line;
  int64_t line_no = 0;
  bool looks_like_json = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1 && trim(line).substr(0, 1) == "{") looks_like_json = true;
    try {
      LoggedStep r;
      r.line = line_no;
      if (parse_text_step(line, r)) add_step(steps, r);
    } catch (const Error& e) {
      log.error = str(path, ":", line_no, ": ", e.what());
      return log;
    }
  }
  if (steps.empty()) {
    log.error = str(path, ": no step lines ('step N/M | train loss X ...')",
                    line_no == 0 ? ": the file is empty" : "",
                    looks_like_json ? ": it looks like JSON lines; name it *.jsonl" : "");
    return log;
  }
  finish(log, steps);
  return log;
}

RunLog parse_json_lines_log(std::istream& in, const std::string& path) {
  RunLog log = new_log(path, LogFormat::json_lines);
  std::map<int64_t, LoggedStep> steps;
  std::string line;
  int64_t line_no = 0, run_line = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (is_blank(line)) continue;
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        throw Error(str("not valid JSON (", json_parse_message(e), ")"));
      }
      FT_CHECK(j.is_object(), "expected a JSON object, got ", j.type_name());
      if (j.contains("event")) {
        FT_CHECK(j["event"].is_string(), "\"event\": expected a string, got ", j["event"].dump());
        if (j["event"] != "run") {
          FT_CHECK(run_line > 0, "expected the {\"event\": \"run\", ...} line first, got event ",
                   j["event"].dump());
          if (j["event"] == "error" && !log.failure) log.failure = json_failure(j, line_no);
          if (j["event"] == "resume") {
            // The run continued from the state saved after this step: what was logged after
            // it (by a run killed before its next save) is superseded, and so is its failure.
            steps.erase(steps.upper_bound(json_step_number(j, "step")), steps.end());
            log.failure.reset();
          }
          continue;  // the summary, samples, and events added later
        }
        FT_CHECK(run_line == 0, "a second {\"event\": \"run\"} line (the first is line ", run_line,
                 ")");
        FT_CHECK(j.contains("dtype") && j["dtype"].is_string(),
                 "the run line needs \"dtype\" (a string: fp32 or bf16)");
        log.dtype = normalize_dtype(j["dtype"].get<std::string>());
        run_line = line_no;
        continue;
      }
      FT_CHECK(run_line > 0,
               "expected the {\"event\": \"run\", ...} line first, got a step record");
      LoggedStep r = json_step(j);
      r.line = line_no;
      add_step(steps, r);
    } catch (const Error& e) {
      log.error = str(path, ":", line_no, ": ", e.what());
      return log;
    } catch (const json::exception& e) {
      log.error = str(path, ":", line_no, ": ", e.what());
      return log;
    }
  }
  if (run_line == 0) {
    log.error = str(
        path, ": ",
        line_no == 0 ? "the file is empty" : "no {\"event\": \"run\"} line (it carries the dtype)");
  } else if (steps.empty() && !log.failure) {
    log.error = str(path, ": no step records after the run line (the run stopped before step 1?)");
  } else {
    finish(log, steps);
  }
  return log;
}

RunLog read_run_log(const std::string& path) {
  const bool json_lines = has_extension(path, {".jsonl", ".json"});
  std::ifstream in(path);
  if (!in) {
    RunLog log = new_log(path, json_lines ? LogFormat::json_lines : LogFormat::text);
    log.error = str(path, ": cannot open for reading");
    return log;
  }
  return json_lines ? parse_json_lines_log(in, path) : parse_text_log(in, path);
}

std::vector<RunLog> load_runs(const std::string& path) {
  std::error_code ec;
  FT_CHECK(fs::exists(path, ec), path, ": no such file or directory");
  if (!fs::is_directory(path, ec)) return {read_run_log(path)};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path)) {
    if (e.is_regular_file() && is_log_file_name(e.path().string())) files.push_back(e.path());
  }
  FT_CHECK(!files.empty(), path, ": no *.jsonl or *.log files in this directory");
  std::sort(files.begin(), files.end());
  std::vector<RunLog> runs;
  std::map<std::string, std::string> seen;  // case name -> file
  for (const std::string& f : files) {
    const std::string name = fs::path(f).stem().string();
    const auto [it, inserted] = seen.emplace(name, f);
    FT_CHECK(inserted, path, ": two logs for case '", name, "': ", it->second, " and ", f,
             " (keep one)");
    runs.push_back(read_run_log(f));
  }
  std::sort(runs.begin(), runs.end(),
            [](const RunLog& a, const RunLog& b) { return a.name < b.name; });
  return runs;
}

}  // namespace ft::train
