"""A parallel corpus of one's own (aiayn.data.parallel_text): a folder of real files in fairseq's
layout (the shared WMT14 training slice, gzipped, and newstest2013/2014 plain), read, encoded with
a real sentencepiece model and scored; and each setting it refuses, in one line."""

from __future__ import annotations

import logging
import lzma
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from aiayn.data.parallel_text import ParallelTextDataModule, corpus_file
from aiayn.data.readers import read_lines
from aiayn.errors import ConfigError, DataError
from tests.helpers.datafiles import own_corpus, write_lines


def module(folder: Path, cache: Path, **settings) -> ParallelTextDataModule:
    return ParallelTextDataModule(**{"data_dir": str(folder), "src_lang": "en", "tgt_lang": "de", "vocab_size": 500,
                                     "max_tokens": 2048, "cache_dir": str(cache), **settings})


def test_each_split_is_its_two_files_plain_or_gzipped(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    folder = own_corpus(tmp_path / "corpus", data_root)
    data = module(folder, subword_cache)
    data.prepare_data()
    data.setup("fit")

    assert data.split_files("train", False) == (folder / "train.en.gz", folder / "train.de.gz")
    assert data.split_files("valid", False) == (folder / "valid.en", folder / "valid.de")
    assert data.vocab.vocab_size == 500  # learnt from the training split's two sides
    assert data.split_sizes["val"] == 40 and data.split_sizes["test"] == 30
    assert 9_900 <= data.split_sizes["train"] <= 10_000  # the slice's pairs, less any with an empty side
    assert data.sources("valid") == read_lines(data_root / "wmt14" / "newstest2013.en")[:40]
    assert data.references("test") == read_lines(data_root / "wmt14" / "newstest2014-en-de.de")[:30]
    assert data.scorer().lang == "de"  # the tokenized BLEU's Moses tokenizer is the target language's

    # Any other split whose two files are there can be scored (evaluate.py split=<name>).
    write_lines(folder / "newstest2014.en", ["Good morning."])
    write_lines(folder / "newstest2014.de", ["Guten Morgen."])
    assert data.check_split("newstest2014", "parallel_text_en_de") == "newstest2014"
    assert data.evaluation_data("newstest2014") == (["Good morning."], ["Guten Morgen."], ["Guten Morgen."])


def test_the_plain_file_wins_over_a_gzipped_one_of_the_same_name(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.en.gz", ["a"])
    assert corpus_file(tmp_path, "train", "en") == tmp_path / "train.en.gz"
    write_lines(tmp_path / "train.en", ["a"])
    assert corpus_file(tmp_path, "train", "en") == tmp_path / "train.en"
    assert corpus_file(tmp_path, "valid", "en") == tmp_path / "valid.en"  # neither: the plain name, to report


def test_a_split_there_both_plain_and_gzipped_says_which_file_is_read(tmp_path: Path, caplog) -> None:
    """valid.en and valid.en.gz side by side: the plain file is read, as documented, and the two named
    once in a warning however often the split's files are looked up (before: the other left unread with
    no word)."""
    write_lines(tmp_path / "valid.en", ["Good morning."])
    write_lines(tmp_path / "valid.en.gz", ["Good evening."])
    write_lines(tmp_path / "valid.de", ["Guten Morgen."])
    data = module(tmp_path, tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="aiayn.data.readers"):
        assert data.check_split("valid", "parallel_text_en_de") == "valid"
        assert data.evaluation_data("valid") == (["Good morning."], ["Guten Morgen."], ["Guten Morgen."])
        assert data.split_files("valid", False) == (tmp_path / "valid.en", tmp_path / "valid.de")
    assert [record.getMessage() for record in caplog.records] == [
        (f"{tmp_path / 'valid.en'} and valid.en.gz are both there: valid.en is read (the plain file wins), "
         "valid.en.gz is not; keep the one you mean and move the other out")]


@pytest.mark.parametrize("settings, message", [
    ({"tgt_lang": "en"}, "task.src_lang and task.tgt_lang are both 'en': the two sides would be one file"),
    ({"src_lang": "en/x"}, "task.src_lang='en/x': give the side's language code, as its files' names end (de, en)"),
    ({"tgt_lang": ""}, "task.tgt_lang='': give the side's language code"),
])
def test_settings_that_cannot_name_two_files_are_refused(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        module(tmp_path, tmp_path / "cache", **settings)
    assert str(refused.value).startswith(message)


def test_a_split_is_named_by_its_files_in_the_folder_never_by_a_path(tmp_path: Path) -> None:
    """A split is two files in task.data_dir, <split>.<lang>: a path as a split's name (absolute,
    relative, ~) is refused naming the folder and name to give instead (before: evaluate.py
    split=/data/mine scored /data/mine.{en,de}, files outside the corpus, under the name
    "/data/mine", and a split setting of train's read its files from anywhere)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, read in (("/data/mine", Path("/data/mine")), ("../other/mine", tmp_path / "other" / "mine"),
                        ("sub/mine", corpus / "sub" / "mine"), ("..", tmp_path)):
        with pytest.raises(ConfigError) as refused:
            module(corpus, tmp_path / "cache", test_split=split)
        assert str(refused.value) == (
            f"task.datamodule.test_split={split}: a split is named by its files in task.data_dir ({corpus}), "
            f"<split>.en and <split>.de, not by a path; for {read}.en and .de give task.data_dir={read.parent} "
            f"task.datamodule.test_split={read.name}")
    data = module(corpus, tmp_path / "cache")
    assert data.check_split("tst2013", "parallel_text_en_de") == "tst2013"
    with pytest.raises(ConfigError) as refused:
        data.check_split("~/mine", "parallel_text_en_de")
    mine = Path("~/mine").expanduser()
    assert str(refused.value) == (
        f"split=~/mine: a split is named by its files in task.data_dir ({corpus}), <split>.en and <split>.de, not by "
        f"a path; for {mine}.en and .de give task=parallel_text task.data_dir={mine.parent} task.src_lang=en "
        "task.tgt_lang=de split=mine")


def test_missing_files_are_named_with_the_layout_wanted(tmp_path: Path, data_root: Path) -> None:
    folder = own_corpus(tmp_path / "corpus", data_root)
    (folder / "test.de").unlink()
    with pytest.raises(DataError) as missing:
        module(folder, tmp_path / "cache").check_files()
    assert str(missing.value) == (f"corpus files missing or unreadable: {folder / 'test.de'} (test split 'test': "
                                  "missing). Each split is two files under task.data_dir, <split>.en and <split>.de "
                                  "(or .gz); a corpus without a test split: task.datamodule.test_split=valid tests "
                                  "on the validation split")
    module(folder, tmp_path / "cache", test_split="valid").check_files()  # as that says

    (folder / "valid.en").unlink()
    with pytest.raises(DataError) as missing:
        module(folder, tmp_path / "cache", test_split="valid").check_files()
    assert str(missing.value).endswith("<split>.en and <split>.de (or .gz)")

    with pytest.raises(DataError) as no_folder:
        module(tmp_path / "nowhere", tmp_path / "cache").check_files()
    assert str(no_folder.value) == (f"task.data_dir={tmp_path / 'nowhere'}: no such folder; give the folder that "
                                    "holds the corpus's files (evaluate.py, for a checkpoint trained on a folder since "
                                    "moved: task=parallel_text task.data_dir=<folder> task.src_lang=en task.tgt_lang=de)")


def test_missing_files_name_what_the_folder_holds_instead(tmp_path: Path, data_root: Path) -> None:
    """A split's file compressed with xz, and the validation split under another name (dev): the
    line says what is there and what to do (before: only that the files were missing, and a test
    split on the validation split, itself missing, offered)."""
    folder = own_corpus(tmp_path / "corpus", data_root)
    for lang in ("en", "de"):
        (folder / f"valid.{lang}").rename(folder / f"dev.{lang}")
    (folder / "test.de.xz").write_bytes(lzma.compress((folder / "test.de").read_bytes()))
    (folder / "test.de").unlink()
    (folder / "test.en").rename(folder / "test.en.txt")
    with pytest.raises(DataError) as missing:
        module(folder, tmp_path / "cache").check_files()
    assert str(missing.value) == (
        f"corpus files missing or unreadable: {folder / 'valid.en'} (val split 'valid': missing); {folder / 'valid.de'} "
        f"(val split 'valid': missing); {folder / 'test.en'} (test split 'test': missing); {folder / 'test.de'} (test "
        "split 'test': missing). Each split is two files under task.data_dir, <split>.en and <split>.de (or .gz); "
        "test.de.xz is there, but a split's files are read plain or gzipped only: decompress it, or gzip it as "
        "test.de.gz; test.en.txt is there, but a split's files are read plain or gzipped only: if it is that file, name "
        "it test.en (or gzip it as test.en.gz); task.data_dir also holds the split(s) dev: name one with "
        "task.datamodule.val_split=dev or task.datamodule.test_split=dev")
    module(folder, tmp_path / "cache", val_split="dev", test_split="dev").check_files(("val", "test"))  # as it says
    with pytest.raises(DataError) as missing:  # evaluate.py split=tst2013: the splits there are named
        module(folder, tmp_path / "cache").evaluation_data("tst2013")
    assert str(missing.value).endswith("<split>.en and <split>.de (or .gz); task.data_dir holds the split(s) dev, train")


def test_a_folder_of_fairseqs_binarised_data_is_named_as_such(tmp_path: Path) -> None:
    """task.data_dir given fairseq-preprocess's output (data-bin/…), not the text it read: said so."""
    for name in ("dict.de.txt", "dict.en.txt", "preprocess.log", "train.en-de.en.bin", "train.en-de.en.idx",
                 "train.en-de.de.bin", "train.en-de.de.idx", "valid.en-de.en.bin", "valid.en-de.de.bin"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(DataError) as missing:
        module(tmp_path, tmp_path / "cache").check_files()
    assert str(missing.value).endswith(
        "<split>.en and <split>.de (or .gz); task.data_dir holds fairseq's binarised data (dict.de.txt, dict.en.txt, "
        "train.en-de.de.bin, …): give the folder of the text files fairseq-preprocess read (its --trainpref, "
        "--validpref, --testpref)")


def test_a_link_to_a_file_not_there_is_named_as_a_link(tmp_path: Path, data_root: Path) -> None:
    """ls lists valid.de, a link whose file was moved: said so (before: "valid.de (val split 'valid': missing)")."""
    folder = own_corpus(tmp_path / "corpus", data_root)
    (folder / "valid.de").unlink()
    (folder / "valid.de").symlink_to(tmp_path / "moved" / "valid.de")
    with pytest.raises(DataError) as missing:
        module(folder, tmp_path / "cache").check_files()
    assert str(missing.value).startswith(
        f"corpus files missing or unreadable: {folder / 'valid.de'} (val split 'valid': a link to "
        f"{tmp_path / 'moved' / 'valid.de'}, which is not there; link it to the file, or put the file in its place). ")


def test_files_of_a_split_that_differ_in_length_are_named(tmp_path: Path, data_root: Path) -> None:
    folder = own_corpus(tmp_path / "corpus", data_root)
    write_lines(folder / "valid.de", read_lines(folder / "valid.de")[:-1])
    with pytest.raises(DataError) as misaligned:
        module(folder, tmp_path / "cache").check_files()
    assert str(misaligned.value) == (f"val split 'valid': parallel files differ in length: {folder / 'valid.de'} ends "
                                     f"after line 39 but {folder / 'valid.en'} goes on at line 40; they must be "
                                     "aligned line by line")


def test_a_target_language_sacrebleu_cannot_score_here_is_refused_before_training(tmp_path: Path) -> None:
    """A Japanese target: sacreBLEU scores it with its ja-mecab tokenizer, one of its extras."""
    try:
        BLEU(trg_lang="ja")
    except RuntimeError:
        with pytest.raises(ConfigError, match=r"^sacreBLEU scores target language 'ja' with a tokenizer of its "
                                              r"extras: pip install 'sacrebleu\[ja\]'$"):
            module(tmp_path, tmp_path / "cache", tgt_lang="ja").scorer()
    else:
        pytest.skip("sacreBLEU's ja tokenizer is installed here")
