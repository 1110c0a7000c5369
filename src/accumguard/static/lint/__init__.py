"""The script linter: AST rules for the known accumulation mistakes (codes ``AG1xx``)."""

from accumguard.static.lint.rules import LintError, lint_file, lint_paths, lint_source

__all__ = ["LintError", "lint_file", "lint_paths", "lint_source"]
