"""The documents name the tests that hold what they say (docs/guarantees.md's rows, docs/testing.md …):
each test named is there, in the file named. ``tests/a.py::test_x`` names a test of that file; a
bare ``::test_y`` after it, in the same paragraph or table, another test of the same file."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", REPO / "experiments" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# `tests/<path>.py`, `tests/<path>.py::<test>[<id>]` or `::<test>` (the file named last before it)
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?(?:::([\w:]+)(?:\[[^`]*\])?)?`")


def named_tests() -> list[tuple[str, str, str | None]]:
    """(where, test file, test or None) for every reference to a test in the documents."""
    found = []
    for document in DOCUMENTS:
        current = None
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                current = None  # a paragraph's end
            for match in REFERENCE.finditer(line):
                path, test = match.group(1), match.group(2)
                if path is None and test is None:
                    continue
                current = path or current
                where = f"{document.relative_to(REPO)}:{number}"
                found.append((where, current or "(no file named before it in its paragraph)", test))
    return found


def test_every_test_a_document_names_is_in_the_file_it_names() -> None:
    references = named_tests()
    assert len(references) > 400  # the guarantees' rows name hundreds
    missing = []
    for where, path, test in references:
        file = REPO / path
        if not file.is_file():
            missing.append(f"{where}: {path} is not there")
            continue
        if test is None:
            continue
        text = file.read_text(encoding="utf-8")
        *classes, name = test.split("::")
        if any(not re.search(rf"^class {re.escape(each)}\b", text, re.MULTILINE) for each in classes) or \
                not re.search(rf"^\s*(?:async )?def {re.escape(name)}\(", text, re.MULTILINE):
            missing.append(f"{where}: {path}::{test} is not there")
    assert not missing, "\n".join(missing)
