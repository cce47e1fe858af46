"""The help layout every `bertjax` command's parser shares (every module of `bertjax.cli`)."""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.HelpFormatter):
  """Help with each option's default shown once, and only where there is one to show.

  No `(default: None)` on required options or on options whose help already says what
  happens without them; a description or epilog with line breaks (a table of choices)
  keeps them, other text is wrapped without breaking names at hyphens.
  """

  def __init__(self, prog: str):
    super().__init__(prog, max_help_position=36, width=100)

  def _fill_text(self, text: str, width: int, indent: str) -> str:
    if "\n" in text:
      return "".join(indent + line for line in text.splitlines(keepends=True))
    return "\n".join(
      textwrap.wrap(
        " ".join(text.split()),
        width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
      )
    )

  def _split_lines(self, text: str, width: int) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

  def _get_help_string(self, action: argparse.Action) -> str:
    text = action.help or ""
    default = action.default
    if (
      not action.option_strings
      or action.required
      or "default" in text
      or default is None
      or default is False
      or default is argparse.SUPPRESS
      or default == []
      or action.nargs == 0
    ):
      return text
    return f"{text} (default: %(default)s)"
