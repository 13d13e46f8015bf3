"""Every relative link in the repository's Markdown resolves inside the repository: the file it names exists (a fresh
clone has nothing beside it, so `../shared/…` is a dead link there even where it works on a development machine), and
a `#anchor` into a Markdown file names one of its headings, slugged as GitHub does."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

from tests.embedded_support import ROOT

# Folders that hold no documentation of ours: virtualenvs, data, dependencies, caches (any hidden folder too).
SKIPPED_DIRS = {".venv", "var", "node_modules", "staticfiles", "media", "__pycache__"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def markdown_files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.md")):
        parts = path.relative_to(root).parts[:-1]
        if not any(part in SKIPPED_DIRS or part.startswith(".") for part in parts):
            found.append(path)
    return found


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code spans blanked out (a path in backticks is
    text, not a link)."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            continue
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        yield number, CODE_SPAN.sub(lambda span: " " * len(span.group(0)), line)


def heading_text(raw: str) -> str:
    """What GitHub renders of a heading's source: link text without its target, no code or emphasis markers, no
    HTML tags."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("*", "")


def github_slug(text: str) -> str:
    """github-slugger: lower case; every character that is not a letter, a number, a mark, '-', '_' or a space
    dropped; spaces become '-'."""
    kept = "".join(c for c in text.lower()
                   if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a Markdown file: its headings' slugs (a repeated one gets -1, -2, …) and explicit
    <a name=…>/<a id=…>."""
    found, seen = set(), {}
    previous = ""
    lines = list(prose_lines(text))
    for index, (_, line) in enumerate(lines):
        heading = None
        atx = ATX_HEADING.match(line)
        if atx:
            heading = atx.group(2) or ""
        elif SETEXT_UNDERLINE.match(line) and previous.strip() and not ATX_HEADING.match(previous):
            heading = previous.strip()
        if heading is not None:
            slug = github_slug(heading_text(heading))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(match.group(1) for match in HTML_ANCHOR.finditer(line))
        previous = line
    return found


def link_targets(text: str):
    """(line number, target) of every inline link or image, reference definition and HTML href/src."""
    for number, line in prose_lines(text):
        matches = [match for pattern in (INLINE_LINK, REFERENCE_DEFINITION, HTML_LINK)
                   for match in pattern.finditer(line)]
        for match in sorted(matches, key=lambda match: match.start()):
            yield number, match.group(1).strip("<>")


def broken_links(root: Path) -> list[str]:
    """'file:line: target — why' for each relative link under `root` that does not resolve inside it."""
    root = root.resolve()
    problems = []
    anchor_cache: dict[Path, set[str]] = {}
    for source in markdown_files(root):
        where = source.relative_to(root)
        for number, target in link_targets(source.read_text()):
            if SCHEME.match(target):
                continue  # http(s), mailto…: not ours to resolve offline
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            if not path_part:
                resolved = source
            elif path_part.startswith("/"):  # GitHub resolves these from the repository's root
                resolved = (root / path_part.lstrip("/")).resolve()
            else:
                resolved = (source.parent / path_part).resolve()
            if not resolved.is_relative_to(root):
                problems.append(f"{where}:{number}: {target} — points outside the repository")
            elif not resolved.exists():
                problems.append(f"{where}:{number}: {target} — no such file")
            elif anchor and resolved.suffix == ".md" and resolved.is_file():
                if resolved not in anchor_cache:
                    anchor_cache[resolved] = anchors(resolved.read_text())
                if unquote(anchor).lower() not in anchor_cache[resolved]:
                    problems.append(f"{where}:{number}: {target} — no heading with the anchor #{anchor} in "
                                    f"{resolved.relative_to(root)}")
    return problems


def test_it_finds_no_broken_relative_link_in_the_repository():
    assert markdown_files(ROOT), "no Markdown file found: the walk itself is broken"

    assert broken_links(ROOT) == []


def test_it_reports_each_planted_broken_link_with_its_file_and_line(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "beside.md").write_text("# Outside\n")  # exists, but not in the repository: a fresh clone lacks it
    (root / "docs" / "guide.md").write_text(
        "# The guide\n\n## 6. Steering — the rules\n\n## Notes\n\n## Notes\n\nSee [the top](#the-guide).\n")
    (root / "README.md").write_text("\n".join([
        "# Title",
        "[good](docs/guide.md) and [anchor](docs/guide.md#6-steering--the-rules) and [again](docs/guide.md#notes-1)",
        "[missing](docs/nothing.md)",
        "[outside](../beside.md)",
        "[bad anchor](docs/guide.md#7-recovery)",
        "`[in code](docs/nothing.md)` and [web](https://example.com/x) and [self](#title)",
        "```",
        "[in a fence](docs/nothing.md)",
        "```",
        "[ref]: docs/gone.md",
        '<a href="docs/also-gone.md">html</a> ![image](docs/pic.png "a title")',
    ]) + "\n")

    assert broken_links(root) == [
        "README.md:3: docs/nothing.md — no such file",
        "README.md:4: ../beside.md — points outside the repository",
        "README.md:5: docs/guide.md#7-recovery — no heading with the anchor #7-recovery in docs/guide.md",
        "README.md:10: docs/gone.md — no such file",
        "README.md:11: docs/also-gone.md — no such file",
        "README.md:11: docs/pic.png — no such file",
    ]


def test_it_slugs_headings_as_github_does():
    assert github_slug(heading_text("4. Step execution protocol (\"a chained task guarded by row-lock leases\")")) \
        == "4-step-execution-protocol-a-chained-task-guarded-by-row-lock-leases"
    assert github_slug(heading_text("MCP clients (`/mcp`)")) == "mcp-clients-mcp"
    assert github_slug(heading_text("Dependencies (all pinned in `requirements.txt`)")) \
        == "dependencies-all-pinned-in-requirementstxt"
    assert github_slug(heading_text("Why this and not Temporal, DBOS, LangGraph or Celery, for agent work")) \
        == "why-this-and-not-temporal-dbos-langgraph-or-celery-for-agent-work"
