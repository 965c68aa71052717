"""Hostile plugin text cannot break a leaderboard table or inject markdown or HTML.

The board is rendered by an independent CommonMark parser (markdown-it-py, with raw
HTML enabled and GFM tables) and the HTML is inspected: only the tags the renderer
itself produces may appear, every table row keeps its cells, and every hostile string
comes back as literal text.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.escape import md_code, md_text
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.render import write_board
from harness.store.storedrun import load_runs

HOSTILE = [
    "a|b||c",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "**bold** __b__ *em* _em_",
    "[link](http://evil.example) ![img](x.png)",
    "`code` ``two``",
    "line1\nline2\r\n| --- |\n# heading",
    "&amp; &lt; &#60;",
    "$x^2$ ~~strike~~ [^v1]",
    "back\\slash\\|pipe",
    "www.evil.example http://evil.example mail@evil.example",
    "<!-- comment -->",
]
ALLOWED_TAGS = {"h1", "h2", "h3", "p", "table", "thead", "tbody", "tr", "th", "td", "code",
                "strong", "img", "ul", "li", "pre"}  # fmt: skip


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[list[str]] = []
        self.comments: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_comment(self, data):
        self.comments.append(data)


def _html(text: str) -> _Collector:
    from markdown_it import MarkdownIt

    parser = _Collector()
    parser.feed(MarkdownIt("commonmark", {"html": True}).enable("table").render(text))
    return parser


def _flat(text: str) -> str:
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_md_text_renders_as_literal_text(hostile):
    cell = md_text(hostile)
    parsed = _html(f"| h |\n|---|\n| {cell} |\n")
    assert {t for t, _ in parsed.tags} <= {"table", "thead", "tbody", "tr", "th", "td"}
    assert parsed.rows == [["h"], [_flat(hostile)]]
    assert not parsed.comments


def test_gfm_autolinks_are_defused():
    """GFM's extended autolinks (not in CommonMark) need ``www.``, ``://`` or ``@``."""
    text = md_text("www.evil.example https://evil.example mail@evil.example cert@0.25")
    assert "www." not in text.replace("www\\.", "")
    assert "://" not in text.replace("\\://", "") and "@" not in text.replace("\\@", "")


def test_md_code_survives_backticks_and_pipes():
    parsed = _html(f"| h |\n|---|\n| {md_code('a`b``c|d')} |\n")
    assert parsed.rows == [["h"], ["a`b``c|d"]]


def _hostile_run(db, monkeypatch, make_run, golden_run):
    rows, checks = {}, []
    for i, name in enumerate(HOSTILE):
        certs = [(0, 0, 0.1 * (i + 1), 0.5, 0.1), (1, 1, 0.2, 0.5, 0.1),
                 (-1, 1, 0.0, 0.5, 0.1), (1, 1, 0.7, 0.5, 0.1)]  # fmt: skip
        rows[name, name] = certs
        verdict = "sound" if i % 2 else name  # an unknown verdict string counts as violated
        checks.append((name, name, name, verdict, name, [name, name]))
    config = golden_run.config | {
        "name": HOSTILE[1],
        "dataset": {"name": HOSTILE[4], "test_every": 1, "test_count": 4},
        "model": golden_run.config["model"] | {"architecture": HOSTILE[0],
                                               "trainer": HOSTILE[5],
                                               "trainer_params": {HOSTILE[3]: HOSTILE[6]}},
    }  # fmt: skip
    failure = (HOSTILE[2], HOSTILE[3], HOSTILE[6])
    make_run(db, monkeypatch, rows=rows, checks=checks, config=config, failure=failure)


def test_a_board_of_hostile_names_keeps_its_structure(tmp_path, monkeypatch, make_run, golden_run):
    db = tmp_path / "r.sqlite"
    _hostile_run(db, monkeypatch, make_run, golden_run)
    board = build_board(load_runs(db))
    text = render_markdown(board, "hostile")
    parsed = _html(text)
    tags = {t for t, _ in parsed.tags}
    assert tags <= ALLOWED_TAGS, tags - ALLOWED_TAGS
    assert not parsed.comments
    images = [attrs["src"] for t, attrs in parsed.tags if t == "img"]
    assert images == ["hostile-1-certified-accuracy.png", "hostile-1-classwise-accuracy.png"]
    # every table row has as many cells as its header
    widths = {len(row) for row in parsed.rows if row}
    # protocol, the paired differences, the ranking and details (with load/core) tables, the
    # verdict matrix (S0-S5, replay, a hostile check per row, the attack)
    assert widths == {2, 8, 12, 13, 3 + 7 + len(HOSTILE) + 2}, widths
    metric_rows = [row for row in parsed.rows if len(row) == 12 and row[0].isdigit()]
    assert sorted(row[1] for row in metric_rows) == sorted(_flat(h) for h in HOSTILE)
    assert all(row[1] == row[2] for row in metric_rows)  # method == setting, both literal
    detail_rows = [row for row in parsed.rows if len(row) == 13 and not row[0].isdigit()
                   and row[0] not in ("#", "method")]  # fmt: skip
    assert sorted(row[0] for row in detail_rows) == sorted(_flat(h) for h in HOSTILE)
    assert all(row[0] == row[1] for row in detail_rows)
    verdicts = {row[1]: row[3] for row in metric_rows}  # (the verdict beside the name)
    assert verdicts[_flat(HOSTILE[1])] == "sound"
    # an unknown verdict string counts as violated; the string itself is in the matrix
    assert verdicts[_flat(HOSTILE[0])] == "violated"
    # unknown verdicts are not sound: half the rows are in the second table
    assert len(board.tables[0].sound_rows) == len(HOSTILE) // 2
    matrix = [row for row in parsed.rows if len(row) == 3 + 7 + len(HOSTILE) + 2]
    assert sorted(matrix[0][10:-2]) == sorted(_flat(h) for h in HOSTILE)  # check names
    for row in matrix[1:]:
        marks = [mark for mark in row[10:-2] if mark != "–"]
        assert marks == (["pass"] if row[2] == "sound" else [row[0]]), row  # verdict literal
    # the flagged checks' names and findings (footnotes) come back literally
    notes = ["".join(_all_text(line)) for line in text.splitlines() if line.startswith("[^v")]
    assert len(notes) == len(HOSTILE) // 2
    for name in HOSTILE[::2]:
        assert any(note.count(_flat(name)) >= 2 for note in notes), name
    # and so does the failure: method, setting and the first line of its message
    failures = text.split("### Failures")[1]
    failure = next(line for line in failures.splitlines() if line.startswith("- "))
    assert (
        "".join(_all_text(failure)).strip() == f"{_flat(HOSTILE[2])} ({_flat(HOSTILE[3])}): line1"
    )


def _all_text(text: str) -> list[str]:
    class Text(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.out = []

        def handle_data(self, data):
            self.out.append(data)

    parser = Text()
    from markdown_it import MarkdownIt

    parser.feed(MarkdownIt("commonmark", {"html": True}).enable("table").render(text))
    return parser.out


@pytest.mark.slow
def test_hostile_names_in_plots_and_files(tmp_path, monkeypatch, make_run, golden_run):
    """Mathtext is off ($...$ would raise), and every file is still written."""
    db = tmp_path / "r.sqlite"
    _hostile_run(db, monkeypatch, make_run, golden_run)
    written = write_board(load_runs(db), tmp_path / "out" / "hostile.md")
    assert len(written) == 7
    for path in written:
        assert path.stat().st_size > 0
