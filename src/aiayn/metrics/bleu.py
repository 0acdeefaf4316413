"""Corpus BLEU: sacreBLEU's standard score, and the paper's tokenized BLEU.

Two scores are offered, because they are not the same number (Post, 2018, "A Call for
Clarity in Reporting BLEU Scores"; for one tensor2tensor transformer_base output on
newstest2014, tensor2tensor issue #317 reports 27.52 with sacreBLEU but 29.02 with
get_ende_bleu.sh and its tweaked reference):

``sacrebleu_score``
    sacreBLEU's corpus BLEU on *detokenized* text with its default settings: one
    reference, mixed case, the ``13a`` tokenizer (mteval-v13a.pl's), ``exp`` smoothing.
    This is the comparable, reproducible number; its signature
    (``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...``) states exactly how it
    was computed. Given the target language, the tokenizer is the one sacreBLEU's command
    line takes for it (``-l xx-zh``): ``zh`` for Chinese, ``ja-mecab`` and ``ko-mecab`` for
    Japanese and Korean (sacreBLEU's extras ``[ja]``, ``[ko]``), ``13a`` for every other; 13a
    splits no Chinese characters, and would score such output near 0.

``tokenized_bleu``
    The kind of number the paper reports. Its EN-DE BLEU came from tensor2tensor (the
    paper's code) and its ``tensor2tensor/utils/get_ende_bleu.sh``, which does, in order::

        # Tokenize.
        perl $mosesdecoder/scripts/tokenizer/tokenizer.perl -l de < $decodes_file > $decodes_file.tok
        # Put compounds in ATAT format (comparable to papers like GNMT, ConvS2S).
        perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' < $tok_gold_targets > $tok_gold_targets.atat
        perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' < $decodes_file.tok > $decodes_file.atat
        # Get BLEU.
        perl $mosesdecoder/scripts/generic/multi-bleu.perl $tok_gold_targets.atat < $decodes_file.tok.atat

    where ``tok_gold_targets=newstest2013.tok.de`` (newstest2014 for the test numbers) is
    a reference that is already Moses-tokenized, which is why the script tokenizes only the
    decodes; here raw references are tokenized the same way instead. (Quoted from the earliest stored version, commit 315647c; its last line
    reads ``$decodes_file.tok.atat``, a file-name slip fixed later.) Later versions (c886a73)
    also run ``replace-unicode-punctuation.perl -l de`` on the decodes first; that step is
    not applied here. Note also (tensor2tensor issue #317, M. Popel, 2018) that the
    paper's newstest2014 reference ``newstest2014.tok.de`` had been hand-tweaked (unicode
    quotes such as ``„`` turned into ``"`` before tokenization); that is a property of the
    reference file, not of the scoring, and is not reproduced here either.

    ``tokenized_bleu`` applies exactly these steps to hypotheses *and* references:

    1. Moses tokenization with the target language: ``sacremoses.MosesTokenizer(lang)``
       (a Python port of ``tokenizer.perl``), default (non-aggressive) hyphen handling,
       like the script, which passes no ``-a``. ``escape=False``: ``tokenizer.perl``
       escapes by default (``"`` -> ``&quot;``, ``'`` -> ``&apos;``, ``&`` -> ``&amp;``,
       ...), but each escape maps one token to one token on both sides, so BLEU is
       unchanged and the unescaped tokens stay readable.
    2. For a German target (the script's ``-l de``; :data:`COMPOUND_SPLIT_LANGS`), compound
       splitting, ``split_compounds``: the perl substitution above, i.e. every
       ``X-Y`` with non-whitespace on both sides becomes ``X ##AT##-##AT## Y``, applied
       left to right without overlap as perl's ``/g`` does (``"a-b-c"`` ->
       ``"a ##AT##-##AT## b-c"``: the ``b`` is consumed by the first match).
    3. BLEU with no further tokenization, as ``multi-bleu.perl`` (tokens = whitespace
       split; 1-4-gram clipped precisions; brevity penalty from the closest, here the
       only, reference length; an n-gram precision of 0 gives BLEU 0 via its
       ``my_log(0) = -9999999999``). That is sacreBLEU with ``tokenize="none"``,
       ``smooth_method="none"`` (sacreBLEU's ``my_log`` is the same), ``force=True``
       (silences the "looks tokenized" warning). On a real test set no n-gram precision
       is 0, so ``exp`` smoothing would give the same number there.

    Its signature is sacreBLEU's plus ``|pretok:moses.<lang>+atat|sacremoses:<version>``
    (``+atat`` for German alone),
    so a tokenized score is never mistaken for a ``13a`` one.

The package depends on nothing else of aiayn (and on neither Lightning nor Hydra).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU

__all__ = [
    "BleuResult",
    "moses_tokenize",
    "sacrebleu_metric",
    "sacrebleu_score",
    "split_compounds",
    "splits_compounds",
    "tokenized_bleu",
    "tokenized_recipe",
]


@dataclass(frozen=True)
class BleuResult:
    """A corpus BLEU score and how it was computed.

    ``score`` is BLEU in [0, 100]; ``signature`` is sacreBLEU's signature string (extended
    for ``tokenized_bleu``); ``details`` is sacreBLEU's full ``str(score)`` line, e.g.
    ``BLEU = 27.30 58.9/33.0/20.7/13.4 (BP = 1.000 ratio = 1.004 hyp_len = ... ref_len = ...)``.
    """

    score: float
    signature: str
    details: str

    def __str__(self) -> str:
        return f"{self.details} [{self.signature}]"


def _check_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Raise for inputs sacreBLEU would silently misread.

    A bare string is iterated character by character by sacreBLEU, and a count mismatch
    means the lines are misaligned, so both are errors rather than a wrong score; an empty
    corpus has no BLEU (sacreBLEU fails on it with an IndexError).
    """
    for name, value in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of lines, not a single {type(value).__name__}")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypothesis and reference counts differ: {len(hypotheses)} hypotheses, "
            f"{len(references)} references"
        )
    if not hypotheses:
        raise ValueError("BLEU of an empty corpus is undefined: got 0 hypotheses and 0 references")


def _score(
    bleu: BLEU, hypotheses: Sequence[str], references: Sequence[str], extra_signature: str = ""
) -> BleuResult:
    result = bleu.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(
        score=float(result.score),
        signature=str(bleu.get_signature()) + extra_signature,
        details=str(result),
    )


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str], lang: str = "",
                    metric: BLEU | None = None) -> BleuResult:
    """sacreBLEU corpus BLEU of detokenized ``hypotheses`` against one reference each, in the
    target language ``lang`` ("": not said). ``metric``: :func:`sacrebleu_metric` of ``lang``,
    made once by a caller that scores again and again (a validation each: ``CorpusBleu``).

    sacreBLEU's defaults (13a tokenization, mixed case, exp smoothing) are kept on purpose:
    they are what its signature ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp`` promises
    and what makes the number comparable across papers (Post, 2018); for a Chinese, Japanese or
    Korean target, the tokenizer sacreBLEU itself takes for it (:func:`sacrebleu_metric`).
    """
    _check_corpus(hypotheses, references)
    return _score(sacrebleu_metric(lang) if metric is None else metric, hypotheses, references)


def sacrebleu_metric(lang: str = "") -> BLEU:
    """sacreBLEU's BLEU for target language ``lang``, with the tokenizer its command line picks
    for it; a ValueError saying what to install where that tokenizer needs sacreBLEU's extras."""
    try:
        return BLEU(trg_lang=lang)
    except RuntimeError:  # its message: "... requires extra dependencies ... pip install sacrebleu[ja]"
        raise ValueError(f"sacreBLEU scores target language {lang!r} with a tokenizer of its extras: "
                         f"pip install 'sacrebleu[{lang}]'") from None


# perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' as run by get_ende_bleu.sh. That perl has no
# -C/utf8 layer, so it works on UTF-8 *bytes*: \S is any byte but [ \t\n\v\f\r] (so even
# U+00A0 is "non-space"), and each (\S) takes one byte. That matters for /g's no-overlap
# rule: in "a-b-c" the first match uses up "b" and "b-c" is left alone, but in "a-ö-c"
# it uses up only the first byte of "ö", whose second byte then starts a second match:
# "a ##AT##-##AT## ö ##AT##-##AT## c". A bytes pattern reproduces this byte for byte
# (Python's bytes \S has the same meaning, re.sub scans like /g), and the output stays
# valid UTF-8 because text is only inserted next to the ASCII hyphen.
_COMPOUND = re.compile(rb"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """Split hyphenated compounds as get_ende_bleu.sh: ``well-known`` -> ``well ##AT##-##AT## known``.

    Exactly ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (checked against perl 5.36):
    a hyphen with non-space on both sides is split; leading/trailing hyphens (``-foo``,
    ``bar-``) and free-standing ones stay; matches do not overlap, so ``a-b-c`` ->
    ``a ##AT##-##AT## b-c`` and ``x--y`` -> ``x ##AT##-##AT## -y``, but (perl matching
    bytes) ``a-ö-c`` -> ``a ##AT##-##AT## ö ##AT##-##AT## c``. The tensor2tensor script
    cites Stanford NMT's "for historical reasons, we split compound words" (the
    GNMT/ConvS2S convention), which the paper's EN-DE numbers follow.
    """
    raw = text.encode("utf-8", "surrogateescape")
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", raw).decode("utf-8", "surrogateescape")


@functools.cache
def _moses_tokenizer(lang: str):
    """One ``MosesTokenizer`` per language: building one loads its nonbreaking-prefix files."""
    from sacremoses import MosesTokenizer  # imported on first use: keeps `import aiayn.metrics` light

    return MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str) -> str:
    """Moses-tokenize one line as ``tokenizer.perl -l <lang>`` does (but unescaped).

    Uses sacremoses' port of tokenizer.perl with the language's nonbreaking prefixes,
    no aggressive hyphen splitting (get_ende_bleu.sh passes no ``-a``) and
    ``escape=False`` (escaping is a token-for-token renaming, so BLEU does not change).
    """
    return _moses_tokenizer(lang).tokenize(text, aggressive_dash_splits=False, return_str=True, escape=False)


# The targets whose compounds are split: get_ende_bleu.sh's German (``-l de``). The paper is silent on
# how its EN-FR figures were scored; the script is EN-DE's, and splitting French hyphens (``a-t-il``,
# ``week-end``) is no convention of EN-FR papers (GNMT and ConvS2S quote Moses-tokenized multi-bleu.perl
# there), so every other target is Moses-tokenized alone (before: split too, ~0.3 BLEU more on
# newstest2014 EN-FR).
COMPOUND_SPLIT_LANGS = frozenset({"de"})


def splits_compounds(lang: str) -> bool:
    """Whether the tokenized BLEU of target language ``lang`` splits compounds (German's)."""
    return lang in COMPOUND_SPLIT_LANGS


def tokenized_recipe(signature: str) -> str:
    """How a tokenized BLEU of this ``signature`` (:func:`tokenized_bleu`'s) was computed, in words."""
    if "+atat" in signature:
        return "Moses tokenization + compound splitting, as the paper's EN-DE (get_ende_bleu.sh)"
    return "Moses tokenization, multi-bleu.perl"


def _tokenize_for_bleu(text: str, lang: str) -> str:
    tokens = moses_tokenize(text, lang)
    return split_compounds(tokens) if splits_compounds(lang) else tokens


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> BleuResult:
    """The paper's tokenized BLEU (tensor2tensor's get_ende_bleu.sh recipe; see the module docstring).

    Both sides are Moses-tokenized for the target language ``lang`` and, for German,
    compound-split (``##AT##-##AT##``, :data:`COMPOUND_SPLIT_LANGS`), then scored like
    multi-bleu.perl: sacreBLEU with ``tokenize="none"``, ``smooth_method="none"``, ``force=True``.
    """
    _check_corpus(hypotheses, references)
    hyp_tok = [_tokenize_for_bleu(line, lang) for line in hypotheses]
    ref_tok = [_tokenize_for_bleu(line, lang) for line in references]
    atat = "+atat" if splits_compounds(lang) else ""
    extra = f"|pretok:moses.{lang}{atat}|sacremoses:{importlib.metadata.version('sacremoses')}"
    return _score(BLEU(tokenize="none", smooth_method="none", force=True), hyp_tok, ref_tok, extra)
