// Shared by the libFuzzer targets (scripts/fuzz.sh runs them): each feeds one input to a reader
// of outside bytes. The readers take paths, so the input goes to a file of this process first.
// A reader may reject an input only with ft::Error, which the targets catch; any other
// exception, a crash, a sanitizer report, a leak or an allocation past -malloc_limit_mb is a
// finding. The seed corpus of target fuzz_X is tests/fuzz/corpus/X/.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace ft::fuzz {

// This process's scratch directory, removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("flashtrain_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Writes the input to `name` in the scratch directory and returns its path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = (scratch_dir() / name).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace ft::fuzz
