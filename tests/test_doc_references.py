"""Every `algorithms.md §N` / `architecture.md §N` a source file cites names a section those docs
have, so a reader who follows a comment's citation lands somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("agentrl", "envs", "tools", "sandboxes", "bench", "configs")
CITATION = re.compile(r"\b(algorithms|architecture)\.md,?\s*(?:§|section\s+)(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+§?(\d+(?:\.\d+)*)\.?\s", flags=re.M)


def sections(doc: str) -> set[str]:
    return set(HEADING.findall((ROOT / "docs" / f"{doc}.md").read_text()))


def citations() -> list[tuple[str, int, str, str]]:
    """(file, line, doc, section) for each citation in the scanned folders' .py and .yaml files."""
    out = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".yaml") or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for doc, section in CITATION.findall(line):
                    out.append((str(path.relative_to(ROOT)), number, doc, section))
    return out


def test_the_heading_pattern_reads_the_docs() -> None:
    assert {"1", "2.4", "5.2", "8.3", "9"} <= sections("algorithms")
    assert {"1", "8", "10"} <= sections("architecture")
    assert CITATION.findall("(algorithms.md §5.2(4)) and architecture.md §10.") == [
        ("algorithms", "5.2"), ("architecture", "10")]


def test_every_citation_names_an_existing_section() -> None:
    found = citations()
    assert len(found) > 50, "the scan found almost no citations: is the pattern or the layout wrong?"
    known = {doc: sections(doc) for doc in ("algorithms", "architecture")}
    broken = [f"{file}:{line}: {doc}.md §{section}" for file, line, doc, section in found
              if section not in known[doc]]
    assert not broken, "citations of sections that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("folder", SCANNED)
def test_no_citation_of_a_document_outside_the_repository(folder: str) -> None:
    """The design document the code once cited is docs/architecture.md now."""
    stale = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if re.search(r"\b[Dd]esign(\.md)? §", line)]
    assert not stale, f"'design §N' cites a document not in the repository: {stale}"
