"""The search front: how every decoder (the tools, validation, the attention pictures) turns the
decoding settings into beam search or sampling (aiayn.model), the one place that choice is made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aiayn.data.subwords import Subwords
from aiayn.decoding.declarations import BEAM, SAMPLING, arguments
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.model import Hypothesis, beam_search_nbest, sample
from aiayn.model.search import OutputConstraint


class Search:
    """How a batch of sources is decoded: ``decoding`` (a :data:`~aiayn.decoding.settings.Decoding`;
    plain settings are made into one, checked) as beam search or, with ``sampling``, sampling, each
    handed what the mode serves (aiayn.decoding.declarations); ``vocab`` gives the BOS/EOS ids and
    ``constraint`` is the task's output constraint (its data module's), which ``constrained`` asks
    for. Calling it gives each source's ``nbest`` hypotheses, best first; :meth:`best` the best's
    tokens. Sampling draws from one generator seeded with ``seed`` when first called: the same
    settings, sources and batches give the same samples."""

    def __init__(self, decoding: Decoding | Mapping[str, Any] | None, vocab: Subwords,
                 constraint: OutputConstraint | None = None):
        self.decoding = decoding if isinstance(decoding, Decoding) else Decoding.of(None, decoding)
        self.arguments = arguments(SAMPLING if self.decoding.sampling else BEAM, self.decoding)
        self.seed = self.arguments.pop("seed", None)
        self.constraint = constraint if self.arguments.pop("constrained") else None
        if self.decoding.constrained and constraint is None:
            raise ConfigError("decoding.constrained=true decodes within the task's output constraint, and this model's "
                              "task has none (constrained decoding is for parsing tasks); set decoding.constrained=false")
        self.arguments["constraint"] = self.constraint
        self.arguments.update(bos_id=vocab.bos_id, eos_id=vocab.eos_id)
        self.nbest = self.decoding.nbest
        self.generator: torch.Generator | None = None
        self.vocab_size = vocab.vocab_size

    def fitting(self, model: Any) -> Search:
        """Itself, once its settings are checked against ``model`` (its positions, and the
        vocabulary: :meth:`Decoding.fit`), before anything is decoded."""
        self.decoding.fit(model.max_positions, self.vocab_size)
        return self

    def __call__(self, model: Any, src: torch.Tensor) -> list[list[Hypothesis]]:
        if not self.decoding.sampling:
            return beam_search_nbest(model, src, **self.arguments)
        if self.generator is None:
            self.generator = torch.Generator(src.device).manual_seed(self.seed)
        return sample(model, src, generator=self.generator, **self.arguments)

    def best(self, model: Any, src: torch.Tensor) -> list[list[int]]:
        """The best hypothesis of each source: token ids without BOS/EOS."""
        return [hypotheses[0].tokens for hypotheses in self(model, src)]
