#include "sweep/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace ft::sweep {

std::string ChildOutcome::describe(double timeout_s) const {
  if (timed_out) return str("timed out after ", timeout_s, " s (killed)");
  if (signal != 0) return str("killed by signal ", signal, " (", strsignal(signal), ")");
  return str("exit code ", exit_code);
}

namespace {

// Closes a descriptor once, on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s,
                       const std::function<void(const std::string&)>& on_line) {
  FT_CHECK(!argv.empty(), "run_child: no program given");
  int fds[2];
  // Close-on-exec, so that children started at the same time by other threads do not inherit
  // this pipe (its reader would then wait for their exit too).
  FT_CHECK(pipe2(fds, O_CLOEXEC) == 0, "run_child: pipe: ", std::strerror(errno));
  Fd read_end{fds[0]}, write_end{fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  FT_CHECK(spawned == 0, "run_child: cannot start ", argv[0], ": ", std::strerror(spawned));
  close(write_end.fd);
  write_end.fd = -1;

  ChildOutcome outcome;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  std::string pending;
  auto emit = [&](const std::string& line) {
    if (!line.empty()) outcome.last_line = line;
    on_line(line);
  };
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      outcome.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{read_end.fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(read_end.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of output: the child closed it (exited)
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      emit(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) emit(pending);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  return outcome;
}

}  // namespace ft::sweep
