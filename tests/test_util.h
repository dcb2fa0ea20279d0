// Helpers shared by the test binaries: temporary directories and running the CLI.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include <sys/wait.h>

namespace ft::test {

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("flashtrain_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command from the source directory (so data/ paths resolve); stdout and stderr
// together.
inline CommandResult run_shell(const std::string& command) {
  const std::string cmd = std::string("cd '") + FLASHTRAIN_SOURCE_DIR + "' && " + command + " 2>&1";
  CommandResult r;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `flashtrain <args>` from the source directory.
inline CommandResult run_cli(const std::string& args) {
  return run_shell(std::string("'") + FLASHTRAIN_CLI + "' " + args);
}

inline std::string source_path(const std::string& rel) {
  return std::string(FLASHTRAIN_SOURCE_DIR) + "/" + rel;
}

// OpenMPI's launcher is on PATH (scripts/bootstrap.sh installs it).
inline bool have_mpirun() {
  return std::system("mpirun --version >/dev/null 2>&1") == 0;
}

// "mpirun ... -np N" for tests on this machine: more ranks than cores allowed, each rank on
// one OpenMP thread (the ranks share the cores), and root allowed (CI runs as root).
inline std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1"
         " mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np " +
         std::to_string(ranks) + " ";
}

}  // namespace ft::test
