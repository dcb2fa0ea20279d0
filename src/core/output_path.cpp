#include "core/output_path.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "core/error.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// Creates and removes a file at probe; throws naming `what` and `shown` when that fails.
void probe(const std::string& probe_path, const std::string& what, const std::string& shown) {
  std::FILE* f = std::fopen(probe_path.c_str(), "wb");
  FT_CHECK(f != nullptr, what, " ", shown, ": cannot write there (", std::strerror(errno), ")");
  std::fclose(f);
  std::remove(probe_path.c_str());
}

}  // namespace

void check_writable_file(const std::string& path, const std::string& what) {
  FT_CHECK(!path.empty(), what, ": the path is empty");
  std::error_code ec;
  FT_CHECK(!fs::is_directory(path, ec), what, " ", path,
           ": is a directory (give a file name inside it)");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    FT_CHECK(fs::is_directory(parent, ec), what, " ", path, ": the directory ", parent.string(),
             " does not exist");
  }
  probe(str(path, ".tmp.", ::getpid()), what, path);
}

void prepare_output_dir(const std::string& dir, const std::string& what) {
  FT_CHECK(!dir.empty(), what, ": the path is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  FT_CHECK(!ec, what, " ", dir, ": cannot create the directory (", ec.message(), ")");
  FT_CHECK(fs::is_directory(dir, ec), what, " ", dir, ": exists and is not a directory");
  probe((fs::path(dir) / str(".flashtrain-probe.", ::getpid())).string(), what, dir);
}

}  // namespace ft
