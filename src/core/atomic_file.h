// Write a file under a temporary name and rename it into place on commit(), so that readers
// never see a half-written file. Without commit() (an exception on the way), the temporary
// file is removed and the destination is left as it was.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace ft {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t nbytes);
  void commit();

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ft
