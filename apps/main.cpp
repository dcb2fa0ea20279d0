// flashtrain: one CLI, one subcommand per job. Errors become one line on stderr and exit 1.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "flashtrain: train GPT-2 and LLaMA-3 models on fused FlashAttention kernels, and check "
      "and tune those kernels"};
  app.require_subcommand(1);
  ft::cli::add_train_command(app);
  ft::cli::add_attention_command(app);
  ft::cli::add_debug_step_command(app);
  ft::cli::add_compare_loss_command(app);
  ft::cli::add_summarize_command(app);
  ft::cli::add_sweep_command(app);
  ft::cli::add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ft::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
