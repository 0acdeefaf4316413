"""chrF and the lowercased tokenized BLEU against the command-line tools that compute them: the
sacrebleu CLI on the files (chrF), and sacremoses' tokenizer CLI then the sacrebleu CLI with
``--lowercase --tokenize none`` (multi-bleu.perl -lc's recipe), on real Multi30k lines."""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import pytest

from aiayn.metrics import CorpusBleu, chrf_score, lowercased_bleu
from tests.helpers.runs import run_command

BIN = Path(sys.executable).parent


def cli(name: str) -> str:
    found = BIN / name if (BIN / name).is_file() else shutil.which(name)
    assert found, f"{name} is not installed beside {sys.executable}"
    return str(found)


@pytest.fixture(scope="module")
def lines(data_root) -> tuple[list[str], list[str]]:
    """200 German validation lines of Multi30k and 'translations' of them: one word of each dropped,
    every fourth line upper-cased (case matters to chrF, not to the lowercased BLEU)."""
    with gzip.open(data_root / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        references = [next(f).rstrip("\n") for _ in range(200)]
    hypotheses = []
    for i, line in enumerate(references):
        words = line.split()
        words = words[: i % len(words)] + words[i % len(words) + 1:] or words
        hypotheses.append(" ".join(words).upper() if i % 4 == 0 else " ".join(words))
    return hypotheses, references


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.cli
def test_chrf_equals_the_sacrebleu_cli_on_the_hypothesis_file(lines, tmp_path: Path) -> None:
    hypotheses, references = lines
    hyp, ref = write(tmp_path / "hyp.de", hypotheses), write(tmp_path / "ref.de", references)
    result = run_command([cli("sacrebleu"), str(ref), "-i", str(hyp), "-m", "chrf", "-b", "-w", "4"])
    ours = chrf_score(hypotheses, references)
    assert ours.score == pytest.approx(float(result.stdout.strip()), abs=5e-5)
    assert ours.signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
    assert CorpusBleu("de")(hypotheses, references)["chrf"] == ours.score


@pytest.mark.cli
def test_lowercased_bleu_equals_the_sacrebleu_cli_on_moses_tokenized_files(lines, tmp_path: Path) -> None:
    hypotheses, references = lines
    tokenized = {}
    for name, text in (("hyp", hypotheses), ("ref", references)):
        result = run_command([cli("sacremoses"), "-q", "-l", "de", "-j", "1", "tokenize"], stdin="".join(
            line + "\n" for line in text))
        tokenized[name] = write(tmp_path / f"{name}.tok.de", result.stdout.splitlines())
    result = run_command([cli("sacrebleu"), str(tokenized["ref"]), "-i", str(tokenized["hyp"]), "--lowercase",
                          "--tokenize", "none", "--smooth-method", "none", "--force", "-b", "-w", "4"])
    ours = lowercased_bleu(hypotheses, references, "de")
    assert ours.score == pytest.approx(float(result.stdout.strip()), abs=5e-5)
    assert "case:lc" in ours.signature and "tok:none" in ours.signature and "pretok:moses.de" in ours.signature
    # upper-cased lines count as right here, not in the mixed-case sacreBLEU
    assert ours.score > CorpusBleu("de")(hypotheses, references)["bleu"]
