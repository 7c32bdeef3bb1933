"""The errors a user can act on; the entry points print each as one line (ConfigError, DataError: exit
status 2) and nothing below them catches these to guess a fix."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the key and the fix."""


class DataError(ValueError):
    """A task row is malformed; the message starts with where it came from (e.g. `data.jsonl:12`)."""


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to change."""
