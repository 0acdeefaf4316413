"""evaluate.py's reports name the data they scored, and an evaluation of other data under the same
name is refused rather than written over them (aiayn.reporting.evaluations)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aiayn.errors import ConfigError
from aiayn.reporting.evaluations import check_same_data, data_digest, read_reports, write_report

SOURCES, REFERENCES = ["Ein Hund läuft.", "Zwei Kinder."], ["A dog runs.", "Two children."]


def test_the_digest_changes_with_any_line_and_with_where_the_sources_end() -> None:
    digest = data_digest(SOURCES, REFERENCES)
    assert len(digest) == 16 and digest == data_digest(list(SOURCES), list(REFERENCES))
    assert digest != data_digest(SOURCES, ["A dog runs.", "Two kids."])
    assert digest != data_digest(REFERENCES, SOURCES)
    # A line moved from the sources' end to the references' start is other data.
    assert data_digest(["a", "b"], ["c"]) != data_digest(["a"], ["b", "c"])


def test_only_a_report_of_other_data_under_the_same_name_is_refused(tmp_path: Path) -> None:
    stem = "test.step10.beam4.alpha0.6.len+50"
    data = data_digest(SOURCES, REFERENCES)
    check_same_data(tmp_path / "none", stem, data)  # no folder yet
    write_report(tmp_path, stem, {"split": "test", "data": data})
    check_same_data(tmp_path, stem, data)  # the same data again: it overwrites its own
    check_same_data(tmp_path, "test.step20.beam4.alpha0.6.len+50", "0" * 16)  # another name
    other = data_digest(SOURCES[:1], REFERENCES[:1])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / stem))}\.json is an evaluation of other test data than "
                       r"this one's .*: give out=<another folder> to keep both"):
        check_same_data(tmp_path, stem, other)
    write_report(tmp_path, stem, {"split": "test"})  # written before reports named their data: not known to differ
    check_same_data(tmp_path, stem, other)
    (tmp_path / f"{stem}.json").write_text("{cut short")  # not a report: read_reports leaves it out, as here
    check_same_data(tmp_path, stem, other)
    assert [path.name for path, _ in read_reports(tmp_path)] == []
