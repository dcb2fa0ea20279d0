// Each subcommand of the flashtrain CLI lives in its own apps/cmd_*.cpp and registers itself
// on the root CLI::App. Commands only parse flags and call the library.
#pragma once

#include <CLI/CLI.hpp>

namespace ft::cli {

void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_prepare_data_command(CLI::App& app);
void add_attention_command(CLI::App& app);
void add_debug_step_command(CLI::App& app);
void add_compare_loss_command(CLI::App& app);
void add_summarize_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_info_command(CLI::App& app);

}  // namespace ft::cli
