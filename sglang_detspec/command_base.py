"""What every ``sglang-detspec`` command module shares: the command's name, its exit codes, :class:`CliError`
and the algorithm names it serves and recognizes (defined in :mod:`sglang_detspec.algorithm_names`).

A module of its own so that the command's modules (``checker``, ``serve``, ``demo``) need not import
:mod:`sglang_detspec.cli`, which sits above them, nor :mod:`sglang_detspec.integration`, which imports SGLang.
"""

from sglang_detspec.algorithm_names import DETSPEC_ALGORITHMS

PROG = "sglang-detspec"

EXIT_OK = 0
EXIT_FAIL = 1  # the command ran and a checked property does not hold
EXIT_ERROR = 2  # the command could not run (usage, unreachable server, missing GPU, ...)

__all__ = ["PROG", "EXIT_OK", "EXIT_FAIL", "EXIT_ERROR", "DETSPEC_ALGORITHMS", "CliError"]


class CliError(Exception):
    """A failure the user can act on; :func:`sglang_detspec.cli.main` prints it as one line and exits with
    ``EXIT_ERROR``."""
