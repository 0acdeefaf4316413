"""Two more figures for translation, next to the BLEUs of :mod:`aiayn.metrics.bleu`:

``chrf_score``
    sacreBLEU's chrF (Popović, 2015) with its defaults: character n-grams up to 6, no word
    n-grams, β = 2 (``chrF2``), on the detokenized output, mixed case; its signature
    (``nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:...``) says so. What WMT reports next
    to BLEU, and fairseq's and OpenNMT's users with it.

``lowercased_bleu``
    BLEU as the Multi30k literature reports it (the WMT multimodal translation tasks, 2016-2018,
    and the papers on them, e.g. a fairseq Transformer-tiny at 41.0 on test2016): both sides
    Moses-tokenized for the target language and lowercased, scored as ``multi-bleu.perl -lc``
    (whitespace tokens, no smoothing): sacreBLEU with ``tokenize="none"``, ``lowercase=True``,
    ``smooth_method="none"``. No compound splitting: that is get_ende_bleu.sh's, for WMT EN-DE.
    Its signature is sacreBLEU's plus ``|pretok:moses.<lang>|sacremoses:<version>``.

The package depends on nothing else of aiayn (and on neither Lightning nor Hydra).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF

from aiayn.metrics.bleu import BleuResult, _check_corpus, _score, moses_tokenize

__all__ = ["chrf_score", "lowercased_bleu"]


def chrf_score(hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
    """sacreBLEU's corpus chrF2 of detokenized ``hypotheses`` against one reference each (its
    defaults, as ``sacrebleu -m chrf``)."""
    _check_corpus(hypotheses, references)
    chrf = CHRF()
    result = chrf.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(score=float(result.score), signature=str(chrf.get_signature()), details=str(result))


def lowercased_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> BleuResult:
    """BLEU of the Moses-tokenized (``lang``), lowercased hypotheses and references, as
    ``multi-bleu.perl -lc`` on tokenized text (the Multi30k literature's figure)."""
    _check_corpus(hypotheses, references)
    hyp_tok = [moses_tokenize(line, lang) for line in hypotheses]
    ref_tok = [moses_tokenize(line, lang) for line in references]
    extra = f"|pretok:moses.{lang}|sacremoses:{importlib.metadata.version('sacremoses')}"
    return _score(BLEU(tokenize="none", lowercase=True, smooth_method="none", force=True), hyp_tok, ref_tok, extra)
