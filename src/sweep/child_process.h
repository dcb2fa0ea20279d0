// Running a worker as a child process: its stdout and stderr on one pipe, read line by line as
// they come, and a time limit after which the child is killed. POSIX only.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ft::sweep {

struct ChildOutcome {
  int exit_code = -1;  // when the child exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  std::string last_line;  // the last non-empty line it printed

  bool exited_cleanly() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exit code 3", "killed by signal 11 (Segmentation fault)", "timed out after 600 s"
  std::string describe(double timeout_s) const;
};

// Runs argv[0] with arguments argv[1..]; on_line gets each line of its output (without the
// newline) as it arrives. After timeout_s seconds the child gets SIGKILL. Throws ft::Error when
// the child cannot be started.
ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s,
                       const std::function<void(const std::string&)>& on_line);

}  // namespace ft::sweep
