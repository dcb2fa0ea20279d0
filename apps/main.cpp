// flashtrain: one CLI, one subcommand per job.
//
// Exit statuses: 0 success; 1 an error, printed as one line "error: ..." on stderr (a bad flag,
// whether CLI11 or the command found it, a bad input file, a failure while running); 2 bad
// input to compare-loss / summarize (their report could not be made); compare-loss also exits 1
// on a mismatch; 130 a training run stopped by SIGINT or SIGTERM (it saved and logged first).
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "core/error.h"

namespace {

// CLI11's messages may span lines; an error is one line.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// "flashtrain train" when a subcommand was named, for the --help hint.
std::string command_name(const CLI::App& app) {
  const auto selected = app.get_subcommands();
  return selected.empty() ? std::string("flashtrain")
                          : "flashtrain " + selected.front()->get_name();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "flashtrain: train GPT-2 and LLaMA-3 models on fused FlashAttention kernels, and check "
      "and tune those kernels"};
  app.require_subcommand(1);
  ft::cli::add_train_command(app);
  ft::cli::add_generate_command(app);
  ft::cli::add_prepare_data_command(app);
  ft::cli::add_attention_command(app);
  ft::cli::add_debug_step_command(app);
  ft::cli::add_compare_loss_command(app);
  ft::cli::add_summarize_command(app);
  ft::cli::add_sweep_command(app);
  ft::cli::add_info_command(app);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->check_name(argv[1]);
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s' (flashtrain --help lists the commands)\n",
                   argv[1]);
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a status the command chose (it printed its own message)
  } catch (const CLI::ParseError& e) {
    const std::string command = command_name(app);
    std::fprintf(stderr, "error: %s (%s --help lists the %s)\n", one_line(e.what()).c_str(),
                 command.c_str(), command == "flashtrain" ? "commands" : "flags");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
