"""Every file the documents point at exists, so a reader never follows a reference into nothing.

For README.md, CHANGELOG.md, benchmarks/README.md, chaos/README.md and every docs/*.md:

- each relative Markdown link ``[text](path)`` or ``[text](path#anchor)`` names an existing
  file, and its anchor a heading of that file (GitHub's slugs);
- each file path written in the text (``docs/design.md``, ``tests/test_cli.py``,
  ``src/workledger/api.py``, ``CHANGELOG.md``) exists, except the few names the documents use
  as examples of the reader's own files or of files a command creates (``EXAMPLES``).

Comments and docstrings under src/ and tests/ may only name documents that exist as well, and
the code under src/, tests/, chaos/, benchmarks/ and examples/ may only cite sections that
exist: ``docs/design.md "Layers"``, ``(docs/design.md, "Input limits")`` and
``design.md#layers`` each name a heading of that document.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "workledger"
DOCUMENTS = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
     ROOT / "chaos" / "README.md", *(ROOT / "docs").glob("*.md")]
)

# Names written as examples, not as files of this repository. Keep this list short: a name
# belongs here only when it is the reader's file or one a command creates when it runs.
EXAMPLES = {
    "myjobs.py",  # README: the reader's own module of job definitions, in the CLI example
    "events.json",  # README: the reader's payload file, in the same example
    "workledger.db",  # the default ledger, created in the current folder on first use
    "settings.py",  # docs/django.md: the reader's Django settings
    "manage.py",  # docs/django.md: the reader's Django project's
    "django.db",  # docs/django.md: Django's module (from django.db import ...), not a file
}
# Folders the payroll demo writes into when it runs (README: PDFs, employee store, mail sink).
EXAMPLE_FOLDERS = ("payslips/",)

LINK = re.compile(r"\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
# A path: optional ./, then segments, ending in a file extension the repository uses. Not
# preceded by a path character (so /abs/paths and parts of longer words never match).
PATH = re.compile(
    r"(?<![\w/.~-])((?:\./)?(?:[\w.*-]+/)*[\w*-][\w.*-]*\."
    r"(?:py|md|sql|toml|txt|json|db|sh|cfg|ini|yml|yaml))(?![\w/-])"
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def outside_code(text: str) -> list[str]:
    """The lines of ``text`` that are not inside a fenced code block."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in outside_code(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def resolve(doc: Path, target: str) -> Path | None:
    """Where ``target`` exists: next to the document, at the repository root, or in the
    package (the documents write ``core/states.py`` for ``src/workledger/core/states.py``)."""
    for base in (doc.parent, ROOT, PACKAGE):
        if "*" in target:
            if any(base.glob(target)):
                return base
        elif (base / target).exists():
            return base / target
    return None


def is_example(target: str) -> bool:
    name = target.removeprefix("./")
    return name in EXAMPLES or name.startswith(EXAMPLE_FOLDERS)


def link_problems(doc: Path) -> list[str]:
    problems = []
    for line in outside_code(doc.read_text()):
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue  # http:, https:, mailto: are not files of this repository
            path, _, anchor = target.partition("#")
            found = resolve(doc, path) if path else doc
            if found is None:
                problems.append(f"link to {target}: no such file")
            elif anchor and found.suffix == ".md" and anchor not in anchors(found):
                problems.append(f"link to {target}: no heading with anchor #{anchor}")
    return problems


def path_problems(doc: Path) -> list[str]:
    text = URL.sub(" ", doc.read_text())
    missing = {p for p in PATH.findall(text) if not is_example(p) and resolve(doc, p) is None}
    return [f"{p}: no such file in the repository" for p in sorted(missing)]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_existing_files_and_headings(doc: Path) -> None:
    problems = link_problems(doc)
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_file_paths_named_in_the_text_exist(doc: Path) -> None:
    problems = path_problems(doc)
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_every_example_name_is_still_used() -> None:
    """An allow-listed name no document uses any more is taken off the list."""
    text = "\n".join(d.read_text() for d in DOCUMENTS)
    unused = {name for name in EXAMPLES if name not in text}
    unused |= {folder for folder in EXAMPLE_FOLDERS if folder not in text}
    assert not unused, f"remove from the allow-list: {sorted(unused)}"


# A document named in code: a root-level one (README.md) or one under docs/.
DOC_NAME = re.compile(r"(?<![\w/.-])((?:docs/[\w-]+|[A-Z][A-Z_]*)\.md)\b")


def test_comments_and_docstrings_name_documents_that_exist() -> None:
    problems = []
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.sql"), *(ROOT / "tests").rglob("*.py")]
    for source in sorted(sources):
        if source == Path(__file__).resolve():
            continue
        for n, line in enumerate(source.read_text().splitlines(), 1):
            for name in DOC_NAME.findall(line):
                if not (ROOT / name).exists():
                    problems.append(f"{source.relative_to(ROOT)}:{n}: {name}")
    assert not problems, "documents that do not exist:\n" + "\n".join(problems)


def test_slugs_follow_github() -> None:
    assert slug("Where it goes next (not built yet)") == "where-it-goes-next-not-built-yet"
    assert slug("The `wl_items` table") == "the-wl_items-table"
    assert slug("Lock order on PostgreSQL: items, run, counts") == (
        "lock-order-on-postgresql-items-run-counts")
    assert slug("See [the glossary](glossary.md)") == "see-the-glossary"


CODE = [ROOT / "src", ROOT / "tests", ROOT / "chaos", ROOT / "benchmarks", ROOT / "examples"]
# A section cited by its title: `docs/design.md "Layers"`, `(docs/design.md, "Input limits")`.
SECTION = re.compile(r'(?<![\w.-])((?:[\w-]+/)*[\w-]+\.md),?\s+"([^"\n]+)"')
# A section cited by its anchor, as a Markdown link would: `docs/design.md#layers`.
ANCHOR = re.compile(r"(?<![\w.-])((?:[\w-]+/)*[\w-]+\.md)#([\w-]+)")
# A comment or docstring that goes on on the next line: the citation may span the two.
CONTINUED = re.compile(r"[ \t]*\n[ \t]*(?:#+|--)?[ \t]*")


def cited_document(name: str) -> Path | None:
    """The document a citation names: a path from the root (docs/design.md,
    benchmarks/README.md), or a bare name of docs/ (design.md)."""
    for base in (ROOT, ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def section_problems(source: Path) -> list[str]:
    text = CONTINUED.sub(" ", source.read_text())
    problems = []
    cited = [(doc, slug(title), f'"{title}"') for doc, title in SECTION.findall(text)]
    cited += [(doc, anchor, f"#{anchor}") for doc, anchor in ANCHOR.findall(text)]
    for name, anchor, shown in cited:
        doc = cited_document(name)
        if doc is not None and anchor not in anchors(doc):
            problems.append(f"{source.relative_to(ROOT)}: {name} {shown}: no such section")
    return problems


def test_sections_cited_in_code_exist() -> None:
    sources = sorted(p for folder in CODE for ext in ("*.py", "*.sql") for p in folder.rglob(ext)
                     if ".egg-info" not in str(p) and p != Path(__file__).resolve())
    problems = [problem for source in sources for problem in section_problems(source)]
    assert not problems, "sections that do not exist:\n" + "\n".join(problems)


def test_a_citation_may_span_two_comment_lines() -> None:
    wrapped = CONTINUED.sub(" ", '-- runs recorded (docs/design.md,\n-- "Async callers").')
    assert SECTION.findall(wrapped) == [("docs/design.md", "Async callers")]
