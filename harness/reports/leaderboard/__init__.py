"""Leaderboards: markdown, plots, JSON and CSV from stored runs, and ``compare``
(harness/README.md).

The runs are read through :mod:`harness.store.storedrun` (certificates, checks and each
row's verdict) and measured by :mod:`harness.mathematics.accuracy`. Modules, one concept each:
:mod:`~.source` (runs named on the command line: ids, databases, run exports),
:mod:`~.metrics` (the columns), :mod:`~.board` (tables and ranking),
:mod:`~.escape` (markdown escaping of plugin text), :mod:`~.stated_protocol`,
:mod:`~.protocol_markdown` and :mod:`~.reproduce` (each run's protocol, its table and the
command), :mod:`~.markdown`, :mod:`~.plots`, :mod:`~.tabular` (JSON, CSV) and
:mod:`~.board_schema`, :mod:`~.render` (writing the files),
:mod:`~.verify`, :mod:`~.compare` (two runs row by row) and :mod:`~.cli`. Importing
this package loads neither pandas nor matplotlib.
"""

from harness.reports.leaderboard.cli import add_leaderboard_parser
from harness.reports.leaderboard.compare import add_compare_parser

__all__ = ["add_compare_parser", "add_leaderboard_parser"]
