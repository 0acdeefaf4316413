"""aiayn.files: writes that a reader never sees half of."""

from __future__ import annotations

import pytest

from aiayn.files import atomic_path, atomic_write, atomic_write_text


def test_text_round_trips(tmp_path):
    path = tmp_path / "sub" / "notes.txt"
    text = "größer ≥ 2\nline two\n"
    assert atomic_write_text(path, text) == path
    assert path.read_text(encoding="utf-8") == text
    atomic_write_text(path, "replaced")
    assert path.read_text(encoding="utf-8") == "replaced"
    assert sorted(p.name for p in path.parent.iterdir()) == ["notes.txt"]


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")

    def write(file):
        file.write(b"half of the new")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        atomic_write(path, write)
    assert path.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_folder_written_through_atomic_path_appears_whole(tmp_path):
    out = tmp_path / "prepared"
    with atomic_path(out) as temporary:
        temporary.mkdir()
        for name in ("a.txt", "b.txt"):
            (temporary / name).write_text(name)
        assert not out.exists()  # nothing at the target until the block ends
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_a_failed_folder_leaves_nothing(tmp_path):
    out = tmp_path / "prepared"
    with pytest.raises(ValueError), atomic_path(out) as temporary:
        temporary.mkdir()
        (temporary / "a.txt").write_text("a")
        raise ValueError("failed half-way")
    assert list(tmp_path.iterdir()) == []


def test_removing_the_temporary_leaves_the_target_as_it_was(tmp_path):
    path = tmp_path / "kept.txt"
    path.write_text("theirs")
    with atomic_path(path) as temporary:
        temporary.write_text("ours")
        temporary.unlink()  # e.g. another process finished first
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_suffix_ends_the_temporary_name(tmp_path):
    with atomic_path(tmp_path / "val.en.gz", ".gz") as temporary:
        assert temporary.parent == tmp_path and temporary.name.endswith(".gz") and temporary.name != "val.en.gz"
        temporary.write_bytes(b"x")


def test_a_resumable_temporary_is_kept_on_failure_and_resumed(tmp_path):
    path = tmp_path / "archive.tgz"
    with pytest.raises(OSError, match="connection reset"), atomic_path(path, resumable=True) as partial:
        assert partial == tmp_path / "archive.tgz.part"
        partial.write_bytes(b"first half ")
        raise OSError("connection reset")
    assert (tmp_path / "archive.tgz.part").read_bytes() == b"first half "
    with atomic_path(path, resumable=True) as partial, open(partial, "ab") as file:
        file.write(b"second half")
    assert path.read_bytes() == b"first half second half"
    assert [p.name for p in tmp_path.iterdir()] == ["archive.tgz"]
