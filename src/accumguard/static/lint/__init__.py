"""The script linter: AST rules for the known accumulation mistakes (codes ``AG1xx``).

Rules live one family per module in :mod:`.families` and register themselves in
:mod:`.registry`; :mod:`._context` holds the per-file facts they share;
:mod:`.runner` parses files and runs the selected rules; :mod:`.report` renders
text, JSON and SARIF.
"""

from accumguard.core.errors import LintError
from accumguard.static.lint.runner import iter_python_files, lint_file, lint_paths, lint_source

__all__ = ["LintError", "iter_python_files", "lint_file", "lint_paths", "lint_source"]
