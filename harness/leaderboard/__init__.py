"""Leaderboards from stored runs: markdown, plots, JSON and CSV (harness/README.md).

Modules, one concept each: :mod:`~.source` (runs from the database or a run export),
:mod:`~.metrics` (the columns, class-wise accuracy of Mohapatra et al. 2021),
:mod:`~.verdicts` (a row's soundness verdict), :mod:`~.board` (tables and ranking),
:mod:`~.escape` (markdown escaping of plugin text), :mod:`~.protocol` and
:mod:`~.reproduce` (the header and the command), :mod:`~.markdown`, :mod:`~.plots`,
:mod:`~.tabular` (JSON, CSV) and :mod:`~.schema`, :mod:`~.render` (writing the files),
:mod:`~.verify` and :mod:`~.cli`. Importing this package loads neither pandas nor
matplotlib.
"""

from harness.leaderboard.cli import add_leaderboard_parser

__all__ = ["add_leaderboard_parser"]
