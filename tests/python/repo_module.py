"""Loads one of the repository's scripts (scripts/, bench/) as a module, for tests of its
functions: the scripts are not a package, so they are loaded from their path."""

import importlib.util
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load(relative_path):
    """The module at REPO/relative_path, named after its file."""
    name = os.path.splitext(os.path.basename(relative_path))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
