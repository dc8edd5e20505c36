"""The one exception family of lips-flwr: what a user's script or the CLI catches.

Every error that a user's input causes (a setting, a flag, an app, a file)
is a :class:`LipsError`, a :class:`ValueError`, so that code written against
the earlier ``ValueError`` keeps working. Its message names the problem and,
where there is one, the fix. The CLI prints it as one line and exits 1.
"""

from __future__ import annotations


class LipsError(ValueError):
    """Base of every lips-flwr error caused by the user's input or files."""


class ConfigError(LipsError):
    """A setting, flag, Flower App or run config that cannot work as given."""


class ResultFileError(LipsError):
    """A result, summary or staging file that is unreadable, damaged, of other settings, or in the way."""


__all__ = ["ConfigError", "LipsError", "ResultFileError"]
