"""BLEU: sacreBLEU's score and the paper's tokenized BLEU, on real Multi30k lines and literal examples.

Everything runs the real sacreBLEU and sacremoses; the compound splitting is also checked
against the real perl one-liner of tensor2tensor's get_ende_bleu.sh when perl is present.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU

from aiayn.metrics import (
    BleuResult,
    moses_tokenize,
    sacrebleu_score,
    split_compounds,
    tokenized_bleu,
    tokenized_recipe,
)

PERL_ATAT = r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"  # get_ende_bleu.sh, verbatim


@pytest.fixture(scope="module")
def val_de(data_root) -> list[str]:
    """The first 200 German validation lines of Multi30k (detokenized text)."""
    with gzip.open(data_root / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(200)]
    assert all(lines)
    return lines


def _corrupt(lines: list[str]) -> list[str]:
    """Deterministic 'translations': drop every k-th word (k = 2..5 by line), swap the first two of every third line."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        k = 2 + i % 4
        kept = [w for j, w in enumerate(words) if (j + i) % k != 0] or words[:1]
        if i % 3 == 0 and len(kept) > 2:
            kept[0], kept[1] = kept[1], kept[0]
        out.append(" ".join(kept))
    return out


# --- sacreBLEU's standard score -------------------------------------------------------


def test_sacrebleu_score_equals_sacrebleu_on_real_lines(val_de):
    hyps = _corrupt(val_de)
    assert hyps != val_de
    result = sacrebleu_score(hyps, val_de)
    reference = sacrebleu.corpus_bleu(hyps, [val_de])
    assert isinstance(result, BleuResult)
    assert result.score == reference.score
    assert 5.0 < result.score < 95.0
    assert result.details == str(reference)
    assert result.details.startswith("BLEU = ") and "BP = " in result.details
    assert result.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "smooth:exp" in result.signature
    assert sacrebleu_score(val_de, val_de).score == pytest.approx(100.0)
    assert sacrebleu_score(hyps, val_de, "de") == result  # a language 13a serves: sacreBLEU's defaults as they are


def test_a_chinese_target_is_scored_with_the_tokenizer_sacrebleu_takes_for_it():
    """13a splits no Chinese characters: one line is one token, and output near the reference scores 0."""
    hyps, refs = ["我们是好朋友。", "今天天气很好。"], ["我们是朋友。", "今天的天气很好。"]
    result = sacrebleu_score(hyps, refs, "zh")
    assert result.score == sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh").score > 20
    assert "|tok:zh|" in result.signature
    assert sacrebleu_score(hyps, refs).score == 0.0  # what 13a made of it


@pytest.mark.parametrize("lang", ["ja", "ko"])
def test_a_target_whose_tokenizer_needs_sacrebleus_extras_says_what_to_install(lang):
    try:
        BLEU(trg_lang=lang)
    except RuntimeError:
        with pytest.raises(ValueError, match=rf"^sacreBLEU scores target language '{lang}' with a tokenizer of its "
                                             rf"extras: pip install 'sacrebleu\[{lang}\]'$"):
            sacrebleu_score(["a"], ["a"], lang)
    else:
        pytest.skip(f"sacreBLEU's {lang} tokenizer is installed here")


# --- the pieces of tokenized BLEU -------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a well-known fact", "a well ##AT##-##AT## known fact"),
        ("e-mail", "e ##AT##-##AT## mail"),
        ("2-3", "2 ##AT##-##AT## 3"),
        ("-foo", "-foo"),
        ("bar-", "bar-"),
        ("-foo bar- - x", "-foo bar- - x"),
        # perl's /g does not overlap matches: the "b" is used up by "a-b", so "b-c" stays.
        ("a-b-c", "a ##AT##-##AT## b-c"),
        ("a-b-c-d", "a ##AT##-##AT## b-c ##AT##-##AT## d"),
        ("ab-cd-ef", "ab ##AT##-##AT## cd ##AT##-##AT## ef"),
        ("x--y", "x ##AT##-##AT## -y"),
        ("E-Mail-Adresse", "E ##AT##-##AT## Mail ##AT##-##AT## Adresse"),
        ("Ä-Ö", "Ä ##AT##-##AT## Ö"),
        # perl matches UTF-8 bytes: a one-character non-ASCII middle uses up only its first
        # byte, so both hyphens split (unlike "a-b-c").
        ("a-ö-c", "a ##AT##-##AT## ö ##AT##-##AT## c"),
        ("Ä-Ö-Ü", "Ä ##AT##-##AT## Ö ##AT##-##AT## Ü"),
        ("ö-a-ö", "ö ##AT##-##AT## a-ö"),
        ("x-€-y", "x ##AT##-##AT## € ##AT##-##AT## y"),
        # perl runs on bytes: only ASCII whitespace is \s, so U+00A0 counts as non-space ...
        ("a\u00a0-b", "a\u00a0 ##AT##-##AT## b"),
        # ... while \v (since perl 5.18) is whitespace.
        ("a\v-b", "a\v-b"),
        ("", ""),
    ],
)
def test_split_compounds(text, expected):
    assert split_compounds(text) == expected


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_split_compounds_matches_the_perl_one_liner(val_de):
    """The real `perl -ple` of get_ende_bleu.sh on tricky strings and tokenized real lines."""
    lines = [
        "a well-known fact", "a-b-c", "a-b-c-d", "x--y", "--", "a---b", "-a-", "Ä-Ö-Ü",
        "a-ö-c", "ö-a-ö", "x-€-y", "a\u00a0-b", "x-\u00a0y", "a\v-b", "a\t-\tb", "2-3-4-5", "ein 5-jähriges Kind",
    ]
    lines += [split_compounds(moses_tokenize(line, "de")) for line in val_de]  # idempotence check too
    lines += [moses_tokenize(line, "de") for line in val_de if "-" in line]
    assert sum("-" in line for line in lines) > 20
    perl = subprocess.run(
        ["perl", "-ple", PERL_ATAT],
        input="\n".join(lines) + "\n",
        capture_output=True,
        encoding="utf-8",
        check=True,
    )
    assert perl.stdout.split("\n")[:-1] == [split_compounds(line) for line in lines]


def test_moses_tokenize_german_literal():
    text = 'Er sagte: „Das ist ein gut-gelaunter Hund!" Dann ging er (mit 3,5 km/h) nach Hause.'
    expected = 'Er sagte : „ Das ist ein gut-gelaunter Hund ! " Dann ging er ( mit 3,5 km / h ) nach Hause .'
    assert moses_tokenize(text, "de") == expected
    # Abbreviations with an inner dot stay whole; German splits apostrophes off.
    assert moses_tokenize("Das kostet z.B. 5 Euro.", "de") == "Das kostet z.B. 5 Euro ."
    assert moses_tokenize("Wie geht's?", "de") == "Wie geht ' s ?"
    # Unescaped (escape=False): & and quotes stay as they are.
    assert moses_tokenize('A & B sagen "ja".', "de") == 'A & B sagen " ja " .'


def test_moses_tokenizer_cached_per_language():
    from aiayn.metrics import bleu

    bleu._moses_tokenizer.cache_clear()
    moses_tokenize("Ein Test.", "de")
    moses_tokenize("Noch ein Test.", "de")
    moses_tokenize("A test.", "en")
    info = bleu._moses_tokenizer.cache_info()
    assert (info.misses, info.hits, info.currsize) == (2, 1, 2)


# --- tokenized BLEU ---------------------------------------------------------------------

# Raw (detokenized) lines and their tokenized + compound-split form, spelled out by hand.
HAND_REFS = [
    'Der Mann sagt: „Das ist ein gut-gelaunter Hund."',
    "Zwei Kinder spielen Fußball auf einer grünen Wiese.",
    "Eine E-Mail-Adresse für 2-3 Personen.",
]
HAND_HYPS = [
    'Der Mann sagte: „Das ist ein gut-gelaunter Hund".',
    "Zwei Kinder spielen auf einer Wiese Fußball.",
    "Eine E-Mail-Adresse für zwei-drei Personen.",
]
HAND_REFS_TOK = [
    'Der Mann sagt : „ Das ist ein gut ##AT##-##AT## gelaunter Hund . "',
    "Zwei Kinder spielen Fußball auf einer grünen Wiese .",
    "Eine E ##AT##-##AT## Mail ##AT##-##AT## Adresse für 2 ##AT##-##AT## 3 Personen .",
]
HAND_HYPS_TOK = [
    'Der Mann sagte : „ Das ist ein gut ##AT##-##AT## gelaunter Hund " .',
    "Zwei Kinder spielen auf einer Wiese Fußball .",
    "Eine E ##AT##-##AT## Mail ##AT##-##AT## Adresse für zwei ##AT##-##AT## drei Personen .",
]

MULTI_BLEU_LIKE = {"tokenize": "none", "smooth_method": "none", "force": True}


def test_hand_tokenized_example():
    assert [split_compounds(moses_tokenize(x, "de")) for x in HAND_REFS] == HAND_REFS_TOK
    assert [split_compounds(moses_tokenize(x, "de")) for x in HAND_HYPS] == HAND_HYPS_TOK
    result = tokenized_bleu(HAND_HYPS, HAND_REFS, "de")
    expected = BLEU(**MULTI_BLEU_LIKE).corpus_score(HAND_HYPS_TOK, [HAND_REFS_TOK])
    assert result.score == expected.score
    assert result.details == str(expected)
    assert 0.0 < result.score < 100.0
    assert result.signature.startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:none")
    assert "|pretok:moses.de+atat|sacremoses:" in result.signature
    assert tokenized_bleu(HAND_REFS, HAND_REFS, "de").score == pytest.approx(100.0)


def test_tokenized_bleu_equals_sacrebleu_none_on_real_lines(val_de):
    hyps = _corrupt(val_de)
    hyps_tok = [split_compounds(moses_tokenize(x, "de")) for x in hyps]
    refs_tok = [split_compounds(moses_tokenize(x, "de")) for x in val_de]
    assert sum("##AT##" in x for x in refs_tok) > 0  # the real lines do exercise the splitting
    result = tokenized_bleu(hyps, val_de, "de")
    expected = BLEU(**MULTI_BLEU_LIKE).corpus_score(hyps_tok, [refs_tok])
    assert result.score == expected.score
    assert result.details == str(expected)
    # No n-gram order has zero matches on real data, so the smoothing choice does not matter here.
    assert all(c > 0 for c in expected.counts)
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(hyps_tok, [refs_tok], tokenize="none", force=True).score)
    # ... and it is not the 13a number.
    assert result.score != sacrebleu_score(hyps, val_de).score


def test_compounds_are_split_for_a_german_target_alone():
    """get_ende_bleu.sh splits German compounds; a French target's hyphens (``a-t-il``,
    ``week-end``) stay whole, as EN-FR papers' multi-bleu.perl figures (before: split too)."""
    hyp, ref = ["Le week-end, a-t-il plu ?"], ["Le week-end, a-t-il neigé ?"]
    french = tokenized_bleu(hyp, ref, "fr")
    plain = BLEU(**MULTI_BLEU_LIKE).corpus_score([moses_tokenize(hyp[0], "fr")], [[moses_tokenize(ref[0], "fr")]])
    assert french.details == str(plain) and "##AT##" not in moses_tokenize(ref[0], "fr")
    assert "|pretok:moses.fr|sacremoses:" in french.signature and "+atat" not in french.signature
    split = BLEU(**MULTI_BLEU_LIKE).corpus_score([split_compounds(moses_tokenize(hyp[0], "fr"))],
                                                 [[split_compounds(moses_tokenize(ref[0], "fr"))]])
    assert french.score != split.score  # the splitting would change the figure
    assert tokenized_recipe(french.signature) == "Moses tokenization, multi-bleu.perl"
    assert "compound splitting" in tokenized_recipe(tokenized_bleu(hyp, ref, "de").signature)


def test_zero_four_gram_matches_give_zero_like_multi_bleu():
    """multi-bleu.perl's my_log(0) = -9999999999 makes BLEU 0 when an n-gram order has no match."""
    hyp, ref = ["Ein Hund läuft sehr schnell weg."], ["Ein Hund läuft schnell sehr weg."]
    result = tokenized_bleu(hyp, ref, "de")
    assert result.score == 0.0
    assert "/0.0 (BP" in result.details  # the 4-gram precision
    # sacreBLEU's default exp smoothing would have given a positive score instead.
    assert sacrebleu.corpus_bleu(hyp, [ref], tokenize="none", force=True).score > 0.0


# --- input validation and the dependency rule ---------------------------------------------


@pytest.mark.parametrize("score", [sacrebleu_score, lambda h, r: tokenized_bleu(h, r, "de")])
def test_count_mismatch_raises(score):
    with pytest.raises(ValueError, match=r"3 hypotheses, 2 references"):
        score(["a", "b", "c"], ["a", "b"])
    with pytest.raises(ValueError, match=r"0 hypotheses, 1 references"):
        score([], ["a"])
    with pytest.raises(ValueError, match="empty corpus"):
        score([], [])


def test_single_string_rejected():
    with pytest.raises(TypeError, match="sequence of lines"):
        sacrebleu_score("ein Hund", ["ein Hund"])
    with pytest.raises(TypeError, match="sequence of lines"):
        tokenized_bleu(["ein Hund"], "ein Hund", "de")


def test_metrics_import_nothing_else_of_aiayn():
    """Beyond what `import aiayn` itself imports (its lazy names: nothing heavy)."""
    code = (
        "import sys, aiayn\n"
        "before = set(sys.modules)\n"
        "import aiayn.metrics\n"
        "ours = sorted(m for m in set(sys.modules) - before if m.startswith('aiayn.'))\n"
        "heavy = sorted(m for m in ('lightning', 'pytorch_lightning', 'hydra', 'omegaconf', 'torch') if m in sys.modules)\n"
        "print(ours, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("['aiayn.metrics', 'aiayn.metrics.bleu', 'aiayn.metrics.chrf', 'aiayn.metrics.parseval', "
                   "'aiayn.metrics.scorers'] []")
