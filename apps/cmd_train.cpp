#include "commands.h"

namespace ft::cli {

void add_train_command(CLI::App& app) {
  app.add_subcommand("train", "Train a model");
}

}  // namespace ft::cli
