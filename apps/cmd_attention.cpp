#include "commands.h"

namespace ft::cli {

void add_attention_command(CLI::App& app) {
  app.add_subcommand("attention", "Run one attention implementation on .npy files");
}

}  // namespace ft::cli
