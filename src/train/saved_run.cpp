#include "train/saved_run.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "models/checkpoint.h"

namespace ft::train {
namespace {

namespace fs = std::filesystem;

// A process with this id exists (it may belong to someone else: then it is left alone).
bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The writer's pid in "<name>.tmp.<pid>[...]", or -1 when `file` is not such a name.
long temporary_owner(const std::string& file, const std::string& name) {
  const std::string prefix = name + ".tmp.";
  if (file.rfind(prefix, 0) != 0) return -1;
  const std::string rest = file.substr(prefix.size());
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  if (digits == 0 || digits > 9) return -1;
  return std::strtol(rest.substr(0, digits).c_str(), nullptr, 10);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  FT_CHECK(!ec, "cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
}

// Renames what the journal names into place and removes the journal.
void roll_forward(const fs::path& journal) {
  std::ifstream in(journal);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  FT_CHECK(!j.is_discarded() && j.is_object() && j.contains("renames") && j["renames"].is_array(),
           journal.string(),
           ": not a readable save journal (remove it to keep the files as they "
           "are)");
  const fs::path dir = journal.parent_path();
  for (const auto& pair : j["renames"]) {
    FT_CHECK(pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string(),
             journal.string(), ": malformed entry ", pair.dump());
    const fs::path from = dir / pair[0].get<std::string>(), to = dir / pair[1].get<std::string>();
    std::error_code ec;
    if (fs::exists(from, ec)) rename_or_throw(from, to);
  }
  std::error_code ec;
  fs::remove(journal, ec);
}

}  // namespace

std::string journal_path(const std::string& path) {
  return path + ".commit";
}

std::string recover_saved_run(const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string name = target.filename().string();
  std::string note;
  std::error_code ec;
  if (fs::exists(journal_path(path), ec)) {
    roll_forward(journal_path(path));
    note = str("finished an interrupted save of ", path, " and ", path, ".state");
  }
  if (!fs::is_directory(dir, ec)) return note;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    for (const std::string& owner : {name, name + ".state", name + ".commit"}) {
      const long pid = temporary_owner(file, owner);
      if (pid < 0 || (pid != ::getpid() && process_alive(pid))) continue;
      std::error_code remove_ec;
      if (fs::remove(entry.path(), remove_ec)) ++removed;
      break;
    }
  }
  if (removed > 0) {
    note += str(note.empty() ? "" : "; ", "removed ", removed, " temporary file",
                removed == 1 ? "" : "s", " of ", path, " left by an interrupted save");
  }
  return note;
}

void save_run(const std::string& path, const models::Transformer& model, DType file_dtype,
              const TrainState& state, const std::function<void(SavePhase)>& after_phase) {
  recover_saved_run(path);
  const fs::path target(path);
  const std::string pid = std::to_string(::getpid());
  const std::string checkpoint_tmp = path + ".tmp." + pid;
  const std::string state_tmp = path + ".state.tmp." + pid;
  auto phase = [&](SavePhase p) {
    if (after_phase) after_phase(p);
  };
  try {
    models::save_checkpoint(checkpoint_tmp, model, file_dtype);
    save_train_state(state_tmp, model, state);
    phase(SavePhase::files_written);
    const std::string name = target.filename().string();
    // Explicit arrays: nested braces of two strings would make an object.
    nlohmann::json renames = nlohmann::json::array();
    renames.push_back(nlohmann::json::array({name + ".tmp." + pid, name}));
    renames.push_back(nlohmann::json::array({name + ".state.tmp." + pid, name + ".state"}));
    const nlohmann::json journal = {{"step", state.step}, {"renames", renames}};
    const std::string text = journal.dump() + "\n";
    AtomicFile file(journal_path(path));
    file.write(text.data(), text.size());
    file.commit();
  } catch (...) {
    std::error_code ec;
    fs::remove(checkpoint_tmp, ec);
    fs::remove(state_tmp, ec);
    throw;
  }
  phase(SavePhase::committed);
  rename_or_throw(checkpoint_tmp, path);
  phase(SavePhase::checkpoint_renamed);
  rename_or_throw(state_tmp, path + ".state");
  std::error_code ec;
  fs::remove(journal_path(path), ec);
  phase(SavePhase::done);
}

}  // namespace ft::train
