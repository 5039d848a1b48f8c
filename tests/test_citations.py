"""The project's citations of BENCHMARKS.md resolve, and its code carries no benchmark figures.

A citation names a place in BENCHMARKS.md in quotes: ``BENCHMARKS.md, "held MLflow lock"`` (in
Markdown ``[BENCHMARKS.md](../BENCHMARKS.md), "held MLflow lock"``). The name is a heading of the
file, the bold lead of an item (``- **Larger models.**``) or the start of a row's first cell in its tables (case and backticks aside). A bare mention
("the figures are in BENCHMARKS.md") cites the whole file and always resolves. Figures themselves
(samples/s, speed-ups, memory) live only in BENCHMARKS.md: a docstring or comment in the library or
the orchestration that quotes one goes stale with the next measurement.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
# BENCHMARKS.md, optionally as ``code`` or a Markdown link, then the cited name: `, "name"` or ` "name"`;
# or `, words` without quotes (a section named loosely, which cannot be checked: refused).
CITATION = re.compile(r'BENCHMARKS\.md(?:``|`)?(?:\]\([^)]*\))?(?:(?:,\s*|\s+)(?:"(?P<name>[^"]+)"|(?P<loose>[a-z][\w -]*)))?')
# A loose tail that is ordinary prose after a bare mention, not a section's name.
PROSE = ("says", "has", "gives", "carries", "is", "and", "for", "in", "with", "lists", "every", "their")
FIGURE = re.compile(r"\b\d[\d.,-]*\s?(?:samples/s|x faster|x slower|MiB|GiB|µs)\b")


def cited_places(text: str = BENCHMARKS.read_text(encoding="utf-8")) -> list[str]:
    """BENCHMARKS.md's places, lower case without backticks: its headings, its bold-led items
    (``- **Larger models.** ...``) and its rows' first cells."""
    places = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    places += [line[4:].split("**")[0].rstrip(".:") for line in text.splitlines() if line.startswith("- **")]
    places += [line.split("|")[1].strip() for line in text.splitlines()
               if line.startswith("|") and not set(line) <= set("|-: ")]
    return [place.replace("`", "").lower() for place in places]


def resolves(name: str, places: list[str]) -> bool:
    wanted = name.replace("`", "").lower().strip()
    return any(place == wanted or place.startswith(wanted) for place in places)


def citations(text: str) -> list[tuple[int, str | None, str | None]]:
    """(line, quoted name, loose words) of each citation in `text`."""
    found = []
    for match in CITATION.finditer(text):
        loose = match.group("loose")
        if loose is not None and loose.split()[0] in PROSE:
            loose = None
        found.append((text.count("\n", 0, match.start()) + 1, match.group("name"), loose))
    return found


def project_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", *ROOT.glob("docs/*.md"), *ROOT.glob("configs/*.yaml")]
    for folder in ("fedcme_core", "flows", "bench", "tools"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def test_every_citation_of_benchmarks_names_a_place_it_has():
    places = cited_places()
    problems = []
    for path in project_files():
        for line, name, loose in citations(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{line}"
            if loose is not None:
                problems.append(f'{where}: cites BENCHMARKS.md, {loose!r} without quotes; name a place as "..."')
            elif name is not None and not resolves(name, places):
                problems.append(f"{where}: BENCHMARKS.md has no heading or row {name!r}")
    assert not problems, "\n".join(problems)


def test_the_library_and_the_orchestration_quote_no_benchmark_figure():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in ("fedcme_core", "flows") for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if FIGURE.search(line)]
    assert not found, "figures belong in BENCHMARKS.md:\n" + "\n".join(found)


# ------------------------------------------------------------------------------- the checks, checked
TABLE = ("# Benchmarks\n## Running them\n| target | figure |\n|---|---|\n| held MLflow lock: x | 1 |\n"
         "- **Larger models.** A step takes 1 s.\n")


def test_a_citation_resolves_by_heading_or_row_start_and_is_refused_otherwise():
    places = cited_places(TABLE)

    assert resolves("Running them", places) and resolves("held `MLflow` lock", places)
    assert resolves("Larger models", places)
    assert not resolves("Parallel efficiency", places)


def test_quoted_loose_and_bare_citations_are_told_apart():
    text = ('a (BENCHMARKS.md, "held MLflow lock")\n([BENCHMARKS.md](../BENCHMARKS.md), parallel efficiency)\n'
            "the figures are in BENCHMARKS.md.\n[BENCHMARKS.md](BENCHMARKS.md) says by how much\n")

    assert citations(text) == [(1, "held MLflow lock", None), (2, None, "parallel efficiency"), (3, None, None),
                               (4, None, None)]


def test_a_figure_is_found_in_a_docstring():
    assert FIGURE.search("local training runs at 619-683 samples/s here")
    assert not FIGURE.search("waits 120 s for the store")
