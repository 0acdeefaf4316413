"""The search front: how every decoder (the tools, validation, the attention pictures) turns the
decoding settings into beam search or sampling (aiayn.model), the one place that choice is made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aiayn.config.schemas import decoding_settings
from aiayn.data.parsing.constraints import TreeConstraint
from aiayn.data.subwords import Subwords
from aiayn.errors import ConfigError
from aiayn.model import Hypothesis, beam_search_nbest, sample


def tree_constraint(vocab: Subwords) -> TreeConstraint:
    """The constraint of decoding to well-formed trees (§6.3's parsers); a model whose vocabulary
    has no tree symbols is a ConfigError."""
    try:
        return TreeConstraint(vocab)
    except ValueError as error:
        raise ConfigError(str(error)) from None


class Search:
    """How every decoder (the tools, validation, the attention pictures) decodes a batch of
    sources: decoding settings (aiayn.config.schemas.DecodingConfig; missing ones at its defaults,
    ConfigError for a bad one) and ``vocab`` (its BOS/EOS ids; the tree constraint, built once
    here, where ``constrained`` asks for it) made into beam search or, with ``sampling``, sampling.
    Calling it gives each source's ``nbest`` hypotheses, best first; :meth:`best` the best's tokens.
    Sampling draws from one generator seeded with ``seed`` when first called: the same settings,
    sources and batches give the same samples."""

    def __init__(self, decoding: Mapping[str, Any] | None, vocab: Subwords):
        self.settings = decoding_settings(decoding)
        self.nbest = self.settings["nbest"]
        self.constraint = tree_constraint(vocab) if self.settings["constrained"] else None
        self.generator: torch.Generator | None = None
        self.common = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id, "max_len_offset": self.settings["max_len_offset"],
                       "alpha": self.settings["alpha"], "kv_cache": self.settings["kv_cache"],
                       "constraint": self.constraint}

    def __call__(self, model: Any, src: torch.Tensor) -> list[list[Hypothesis]]:
        settings = self.settings
        if not settings["sampling"]:
            return beam_search_nbest(model, src, beam_size=settings["beam_size"], stop=settings["stop"],
                                     nbest=self.nbest, **self.common)
        if self.generator is None:
            self.generator = torch.Generator(src.device).manual_seed(settings["seed"])
        return sample(model, src, samples=self.nbest, temperature=settings["temperature"], top_k=settings["top_k"],
                      top_p=settings["top_p"], generator=self.generator, **self.common)

    def best(self, model: Any, src: torch.Tensor) -> list[list[int]]:
        """The best hypothesis of each source: token ids without BOS/EOS."""
        return [hypotheses[0].tokens for hypotheses in self(model, src)]
