"""Every docs/protocol.md anchor that code or docs cite exists, so the pointers cannot rot.

Anchors are GitHub's heading slugs: lower case, punctuation other than ``-`` and ``_`` dropped, spaces
turned into ``-``. A citation is ``docs/protocol.md#anchor`` in code, ``protocol.md#anchor`` in docs/.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "protocol.md"
CITING_DIRS = ("operator", "runtime", "tests", "e2e", "conformance", "benchmarks", "live", "docs")
CITATION_RE = re.compile(r"protocol\.md#([A-Za-z0-9_-]+)")
HEADING_RE = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
SELF = Path(__file__).resolve()


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors() -> set[str]:
    body = re.sub(r"^```.*?^```", "", DOC.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in HEADING_RE.findall(body)}


def citing_files() -> list[Path]:
    """The repository's code and docs, this file excepted (its examples are not citations)."""
    return [
        path
        for top in CITING_DIRS
        for path in sorted((REPO / top).rglob("*"))
        if path.suffix in (".py", ".md", ".sh", ".yaml") and path.is_file() and path != SELF
    ]


def citations() -> dict[str, list[str]]:
    """anchor -> the files (repo-relative) that cite it."""
    found: dict[str, list[str]] = {}
    for path in citing_files():
        for anchor in CITATION_RE.findall(path.read_text(errors="replace")):
            found.setdefault(anchor, []).append(str(path.relative_to(REPO)))
    return found


def test_slug_follows_github() -> None:
    assert slug("Prefill-leg params") == "prefill-leg-params"
    assert slug("Registration G2") == "registration-g2"
    assert slug("`kv_transfer_params`, again!") == "kv_transfer_params-again"


def test_every_cited_anchor_exists() -> None:
    known = anchors()
    cited = citations()
    assert len(cited) >= 15, "the code cites docs/protocol.md: the scan found too few citations"
    missing = {anchor: files for anchor, files in cited.items() if anchor not in known}
    assert not missing, f"docs/protocol.md has no section for {missing}; known anchors: {sorted(known)}"


def test_no_code_cites_the_out_of_tree_reference() -> None:
    """A user's clone has no ../shared/reference/moriio-protocol.md: cite docs/protocol.md instead."""
    offenders = [
        str(path.relative_to(REPO))
        for path in citing_files()
        if "moriio-protocol.md" in path.read_text(errors="replace")
    ]
    assert offenders == []
