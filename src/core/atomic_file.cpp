#include "core/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "core/error.h"

namespace ft {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_path_(str(path_, ".tmp.", ::getpid())) {
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  FT_CHECK(file_ != nullptr, "cannot write ", path_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(tmp_path_, ec);
  }
}

void AtomicFile::write(const void* data, size_t nbytes) {
  FT_CHECK(file_ != nullptr, "write to ", path_, " after commit");
  FT_CHECK(std::fwrite(data, 1, nbytes, file_) == nbytes, "write to ", tmp_path_,
           " failed: ", std::strerror(errno));
}

void AtomicFile::commit() {
  FT_CHECK(file_ != nullptr, "commit of ", path_, " twice");
  const bool flushed = std::fflush(file_) == 0;
  std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  if (!flushed) {
    std::filesystem::remove(tmp_path_, ec);
    throw Error(str("write to ", tmp_path_, " failed: ", std::strerror(errno)));
  }
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) {
    std::filesystem::remove(tmp_path_, ec);
    throw Error(str("cannot rename ", tmp_path_, " to ", path_, ": ", ec.message()));
  }
}

}  // namespace ft
