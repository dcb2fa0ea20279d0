// Kernel-configuration files: reading and checking them, and the lookup that puts their rows
// before the built-in table.
#include "attention/kernel_config_file.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ft::attention {
namespace {

using nlohmann::json;

// A file of rows is a few KB; anything larger is the wrong file.
constexpr std::uintmax_t kMaxFileBytes = 1 << 20;
// Far longer than any configuration's text, and short enough for the parser's regular
// expressions (which recurse per character) whatever the file holds.
constexpr size_t kMaxConfigChars = 256;

const std::set<std::string> kFileKeys = {"format", "version", "note", "source", "rows"};
const std::set<std::string> kRowKeys = {"arch",   "max_head_dim", "mask",
                                        "config", "note",         "measured"};

// A value as a message quotes it: short, whatever the file holds.
std::string quoted(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string type_of(const json& v) {
  return v.type_name();
}

std::string join(const std::set<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

// Reads one object's keys: each must be allowed, and each required one present.
void check_keys(const json& object, const std::set<std::string>& allowed,
                const std::vector<std::string>& required, const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    FT_CHECK(allowed.count(key), where, "unknown key \"", key, "\" (allowed: ", join(allowed), ")");
  }
  for (const std::string& key : required) {
    FT_CHECK(object.contains(key), where, "\"", key, "\" is missing");
  }
}

// An integer in [lo, hi] (lo >= 0), without the conversions nlohmann would make: a float or a
// huge value is refused, not truncated or wrapped.
int64_t integer_in(const json& v, int64_t lo, int64_t hi, const std::string& where) {
  // A JSON integer >= 0 parses as unsigned, a negative one as signed.
  const bool fits = v.is_number_unsigned() && v.get<uint64_t>() >= static_cast<uint64_t>(lo) &&
                    v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  FT_CHECK(fits, where, "expected an integer in [", lo, ", ", hi, "], got ", quoted(v));
  return static_cast<int64_t>(v.get<uint64_t>());
}

const std::string& string_of(const json& v, const std::string& where) {
  FT_CHECK(v.is_string(), where, "expected a string, got ", type_of(v), " ", quoted(v));
  return v.get_ref<const std::string&>();
}

// Both parts, so that a row never takes half its configuration from KernelConfig's defaults.
KernelConfig whole_config(const std::string& text, const std::string& where) {
  FT_CHECK(text.size() <= kMaxConfigChars, where, "a configuration of ", text.size(),
           " characters (at most ", kMaxConfigChars, ")");
  KernelConfig c;
  try {
    c = KernelConfig::parse(text);
  } catch (const Error& e) {
    throw Error(str(where, e.what()));
  }
  const bool fwd = text.find("fwd=") != std::string::npos;
  const bool bwd = text.find("bwd=") != std::string::npos;
  FT_CHECK(fwd && bwd, where, "'", text, "' has no ", fwd ? "bwd=" : "fwd=",
           " part: a row names the whole configuration, e.g. 'fwd=128x64/128 "
           "bwd=64x128/256/double'");
  return c;
}

KernelConfigRow parse_row(const json& j, const std::string& where) {
  FT_CHECK(j.is_object(), where, "expected an object, got ", type_of(j), " ", quoted(j));
  check_keys(j, kRowKeys, {"arch", "max_head_dim", "mask", "config"}, where);
  KernelConfigRow row;
  row.arch = string_of(j.at("arch"), where + "\"arch\": ");
  const std::vector<std::string> families = arch_families();
  if (std::find(families.begin(), families.end(), row.arch) == families.end()) {
    std::string known, hint;
    for (const std::string& f : families) known += (known.empty() ? "" : ", ") + f;
    try {
      const std::string family = arch_family(DeviceLimits::for_arch(row.arch).compute_capability);
      hint = str("; ", row.arch, " GPUs use the ", family, " rows");
    } catch (const Error&) {
    }
    throw Error(str(where, "\"arch\": '", row.arch,
                    "' is not an architecture family of the table (families: ", known, hint, ")"));
  }
  row.max_head_dim = integer_in(j.at("max_head_dim"), 1, kMaxHeadDim, where + "\"max_head_dim\": ");
  const std::string& mask = string_of(j.at("mask"), where + "\"mask\": ");
  FT_CHECK(mask == "dense" || mask == "local", where,
           "\"mask\": expected \"dense\" (none, causal) ",
           "or \"local\" (a window or segment ids), got \"", mask, "\"");
  row.mask_class = mask == "dense" ? MaskClass::dense : MaskClass::local;
  row.config =
      whole_config(string_of(j.at("config"), where + "\"config\": "), where + "\"config\": ");
  if (j.contains("note")) string_of(j.at("note"), where + "\"note\": ");
  FT_CHECK(!j.contains("measured") || j.at("measured").is_object(), where,
           "\"measured\": expected an object, got ", type_of(j.at("measured")));
  return row;
}

bool same_key(const KernelConfigRow& a, const KernelConfigRow& b) {
  return a.arch == b.arch && a.max_head_dim == b.max_head_dim && a.mask_class == b.mask_class;
}

}  // namespace

std::string KernelConfigRow::describe() const {
  return str(arch, ", head dims <= ", max_head_dim, ", ", mask_class_name(mask_class));
}

const KernelConfigRow* KernelConfigFile::find(const std::string& family, int64_t head_dim,
                                              MaskClass mask_class) const {
  const KernelConfigRow* best = nullptr;
  for (const KernelConfigRow& row : rows) {
    if (row.arch != family || row.mask_class != mask_class || head_dim > row.max_head_dim) {
      continue;
    }
    if (best == nullptr || row.max_head_dim < best->max_head_dim) best = &row;
  }
  return best;
}

std::string KernelConfigFile::row_name(const KernelConfigRow& row) const {
  return str("kernel config file ", path, ", rows[", &row - rows.data(), "] (", row.describe(),
             ")");
}

KernelConfigFile parse_kernel_config_file(const std::string& text, const std::string& path) {
  const std::string file = str("kernel config file ", path, ": ");
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    // nlohmann's messages start with their own code in brackets; the rest says where.
    std::string what = e.what();
    if (const size_t end = what.find("] "); end != std::string::npos) what = what.substr(end + 2);
    throw Error(str(file, "not valid JSON: ", what));
  }
  FT_CHECK(doc.is_object(), file, "expected a JSON object {\"format\": \"", kKernelConfigFormat,
           "\", ...}, got ", type_of(doc));
  check_keys(doc, kFileKeys, {"format", "version", "rows"}, file);
  FT_CHECK(doc["format"] == kKernelConfigFormat, file, "\"format\": expected \"",
           kKernelConfigFormat, "\", got ", quoted(doc["format"]));
  const json& version = doc["version"];
  FT_CHECK(!(version.is_number_unsigned() && version.get<uint64_t>() > kKernelConfigVersion), file,
           "\"version\": ", quoted(version), " is newer than this flashtrain reads (",
           kKernelConfigVersion, "); use the flashtrain that wrote it");
  FT_CHECK(version.is_number_unsigned() && version.get<uint64_t>() == kKernelConfigVersion, file,
           "\"version\": expected ", kKernelConfigVersion, ", got ", quoted(version));
  if (doc.contains("note")) string_of(doc["note"], file + "\"note\": ");
  FT_CHECK(!doc.contains("source") || doc["source"].is_object(), file,
           "\"source\": expected an object, got ", type_of(doc["source"]));
  FT_CHECK(doc["rows"].is_array(), file, "\"rows\": expected an array, got ", type_of(doc["rows"]));

  KernelConfigFile out;
  out.path = path;
  for (size_t i = 0; i < doc["rows"].size(); ++i) {
    const std::string where = str(file, "rows[", i, "]: ");
    KernelConfigRow row = parse_row(doc["rows"][i], where);
    for (size_t k = 0; k < out.rows.size(); ++k) {
      FT_CHECK(!same_key(out.rows[k], row), where, "a second row for ", row.describe(), " (rows[",
               k, "] is the first); keep one");
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

KernelConfigFile read_kernel_config_file(const std::string& path) {
  std::error_code ec;
  FT_CHECK(std::filesystem::is_regular_file(path, ec), "kernel config file ", path, ": ",
           std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  FT_CHECK(!ec && bytes <= kMaxFileBytes, "kernel config file ", path, ": ", bytes,
           " bytes; a kernel config file is a few KB (at most ", kMaxFileBytes, ")");
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "kernel config file ", path, ": cannot open it");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FT_CHECK(!in.bad(), "kernel config file ", path, ": read failed");
  return parse_kernel_config_file(text, path);
}

std::string KernelConfigChoice::origin() const {
  const std::string from =
      row != nullptr ? file->row_name(*row) : str("the built-in ", family, " table");
  return deterministic_backward ? from + ", with the tma backward for deterministic mode" : from;
}

KernelConfigChoice choose_kernel_config(const KernelConfigFile* file, const DeviceLimits& device,
                                        const Problem& problem) {
  KernelConfigChoice c;
  c.mask_class = mask_class_of(problem.mask);
  c.family = arch_family(device.compute_capability);
  c.file = file;
  c.row = file != nullptr ? file->find(c.family, problem.head_dim, c.mask_class) : nullptr;
  const KernelConfig base = c.row != nullptr
                                ? c.row->config
                                : default_config(device, problem.head_dim, c.mask_class,
                                                 problem.seq_len, problem.group_size());
  c.config = with_deterministic_backward(base, device, problem);
  c.deterministic_backward = c.config != base;
  return c;
}

KernelConfigChoice checked_kernel_config(const KernelConfigFile* file, const DeviceLimits& device,
                                         const Problem& problem, KernelDirection which) {
  KernelConfigChoice c = choose_kernel_config(file, device, problem);
  const std::string reason = can_implement(c.config, problem, device, which);
  FT_CHECK(reason.empty(), c.origin(), ": ", c.config.str(), " cannot run ", problem.describe(),
           " on ", device.arch, ": ", reason);
  return c;
}

}  // namespace ft::attention
