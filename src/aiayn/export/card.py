"""The model card (README.md) of an exported model: what it does (translates, or parses), what it
was trained on and for how long, the scores measured for it, its configuration, how to use it,
and the one difference a user must know: Hugging Face's and CTranslate2's beam search normalise by
the length their own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiayn.checkpoints.layout import run_dir_of
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.metrics.bleu import tokenized_recipe
from aiayn.reporting.evaluations import read_reports
from aiayn.reporting.summary import read_summary

LENGTH_PENALTY_NOTE = (
    "aiayn ranks beam-search hypotheses by log P(Y|X) / ((5 + |Y|) / 6)^α (GNMT's length penalty, §6.1 "
    "of the paper, α = {alpha}); MarianMT's `generate` and CTranslate2 divide by |Y|^α instead. With the "
    "same α the two can pick different hypotheses, so beam-search output (and its BLEU) may differ slightly "
    "from aiayn's; greedy decoding (`num_beams=1`, `beam_size=1`) gives exactly aiayn's greedy output{greedy}."
)
# What else differs, as each format is used.
ENGINE_NOTES = {
    "hf": (" aiayn also stops each sentence at its own input length + an offset (`decoding.max_len_offset`); "
           "`generate` uses one maximum for the batch (`max_length` in `generation_config.json`, or "
           "`max_new_tokens`). aiayn writes an empty line for an empty input line, where `generate` translates it "
           "as any other; and MarianTokenizer reads a line that starts with `>>…<<` as a language code, one "
           "unknown token, where aiayn reads it as text."),
    "ctranslate2": (" `translate.py engine=ctranslate2` and the call above stop each sentence at its own input "
                    "length + {offset} as aiayn does, and, as `first_k`, once {beam} hypotheses have finished."),
}


@dataclass
class CardFacts:
    """What the card states about the exported model."""

    name: str  # the checkpoint (or "average of …")
    task: str  # e.g. multi30k_en_de
    src_lang: str | None
    tgt_lang: str | None
    steps: list[int]  # the training steps of the checkpoint(s) exported (several: averaged)
    model: dict[str, Any]  # the network's settings
    decoding: dict[str, Any]  # the settings the export decodes with (aiayn.decoding.settings.Decoding's)
    data: dict[str, Any] = field(default_factory=dict)  # the task's data settings
    scores: list[str] = field(default_factory=list)  # one line per measurement of these weights
    parses: bool = False  # a parser (§6.3: sentences to trees), not a translation model
    format: str = "hf"  # the export's (export.py format=): which folder the card is in, and how it is used
    quantization: str | None = None  # a CTranslate2 export's weight type (None: float32, aiayn's)
    # what CTranslate2's translate_batch is handed to decode as aiayn.json says (aiayn.decoding.declarations)
    serving: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None  # a fine-tuned model's start (train.py init_from=): the checkpoint it was trained on from


def measured_scores(ckpt: Path, steps: list[int], train_split: str = "train") -> list[str]:
    """The scores of exactly these weights found beside ``ckpt``: src/evaluate.py's reports in
    the run's ``eval/`` folder for the same steps, and the dev score of the run's summary.json at
    the last of them. Only what describes the exported model goes on the card: its fp32 arithmetic
    (not an int8, bf16, oneDNN or ONNX Runtime evaluation), one model (not an ensemble), beam search (not samples) and a
    held-out split (not ``train_split``); each line names the split, the decoding settings and the
    metric's signature. Which describe the model is the decoding's to say (:attr:`Decoding.plain`)."""
    run_dir = run_dir_of(ckpt.resolve())  # where evaluate.py writes eval/ without out=
    found = []
    for report, data in read_reports(run_dir / "eval"):
        averaged, averaged_steps = data.get("averaged") or [data.get("checkpoint")], data.get("averaged_steps")
        if data.get("step") != steps[-1] or (list(averaged_steps) != list(steps) if averaged_steps
                                             else len(averaged) != len(steps)):
            continue
        try:
            decoding = Decoding.of(data.get("decoding"), switches=data.get("speed_switches"),
                                   members=tuple(data.get("ensemble") or ()), where=f"{report}: decoding.")
        except ConfigError:  # a report this version cannot read
            continue
        if not decoding.plain or data.get("split") in (None, train_split):
            continue
        line = _report_line(data)
        if line:
            found.append(f"{data['split']} ({data.get('sentences', '?'):,} sentences; {decoding.describe()}): {line}")
    try:
        data = read_summary(run_dir) or {}
    except (OSError, ValueError):  # a summary cut short: no dev score on the card
        data = {}
    if data.get("dev/step") == steps[-1] and len(steps) == 1:
        if "dev/bleu" in data:
            found.append(f"dev set during training (its first validation sentences), sacreBLEU: {data['dev/bleu']:.2f}")
        if "dev/f1" in data:
            found.append(f"dev set during training, F1 (EVALB): {data['dev/f1']:.2f}")
    return found


def _report_line(report: dict[str, Any]) -> str:
    """The figures of one evaluation report, each with what makes it comparable."""
    def figure(name: str) -> float | None:
        values = [value for key, value in report.items() if key.endswith(f"/{name}") and isinstance(value, (int, float))]
        return values[0] if values else None

    parts = []
    if (bleu := figure("bleu")) is not None:
        parts.append(f"sacreBLEU {bleu:.2f} (`{report.get('sacrebleu_signature', '?')}`)")
    if (tokenized := figure("tokenized_bleu")) is not None:
        # Reports from before the signature was kept split every target's compounds.
        parts.append(f"tokenized BLEU {tokenized:.2f} ({tokenized_recipe(report.get('tokenized_bleu_signature', '+atat'))})")
    if (chrf := figure("chrf")) is not None:
        parts.append(f"chrF2 {chrf:.2f} (`{report.get('chrf_signature', '?')}`)")
    if (f1 := figure("f1")) is not None:
        parts.append(f"F1 {f1:.2f} (EVALB, COLLINS.prm)")
    return "; ".join(parts)


def model_card(facts: CardFacts) -> str:
    """The README.md text."""
    if facts.parses:  # §6.3: English sentences (the Penn Treebank's WSJ) to linearised constituency trees
        what, languages, tags = "English constituency parsing", ["en"], ["constituency-parsing", "aiayn", "marian"]
        pipeline, doing = "text2text-generation", "parsing English sentences into linearised constituency trees"
        example = "The cat sat on the mat ."
    else:
        what = f"{facts.src_lang}→{facts.tgt_lang}" if facts.src_lang and facts.tgt_lang else "translation"
        languages = [lang for lang in (facts.src_lang, facts.tgt_lang) if lang]
        tags, pipeline, doing = ["translation", "aiayn", "marian"], "translation", f"{what} translation"
        example = "A man is riding a bike."
    steps = (f"{facts.steps[0]:,} steps" if len(facts.steps) == 1
             else f"the average of {len(facts.steps)} checkpoints at steps {', '.join(map(str, facts.steps))}")
    front = {"language": languages, "tags": tags, "pipeline_tag": pipeline}
    scores = ("\n".join(f"- {line}" for line in facts.scores)
              or "- not measured yet: `python src/evaluate.py ckpt=<file>`")
    config = yaml.safe_dump({"model": facts.model, "decoding": facts.decoding, "data": facts.data},
                            sort_keys=False, allow_unicode=True).rstrip()
    exact = facts.quantization in (None, "float32")
    fine_tuned = (f"; fine-tuned from the model of `{facts.init_from}` (train.py `init_from=`), whose own steps "
                  "are not counted here" if facts.init_from else "")
    note = (LENGTH_PENALTY_NOTE.format(alpha=facts.decoding["alpha"], greedy="" if exact else " in float32 weights")
            + ENGINE_NOTES[facts.format].format(offset=facts.serving.get("max_len_offset"),
                                                beam=facts.serving.get("beam_size")))
    if facts.parses:
        note += (" aiayn's parser also constrains its beam search to well-formed trees over the input's words "
                 "(`decoding.constrained`); neither engine does, so its output may need repair (docs/parsing.md).")
    weights = ("exactly aiayn's: teacher-forced logits and greedy output equal those of the aiayn checkpoint" if exact
               else f"aiayn's stored as {facts.quantization}: outputs may differ slightly from the aiayn checkpoint's")
    measured = "these weights in fp32" if exact else f"the fp32 weights this {facts.quantization} model was made from"
    kind = "a Hugging Face MarianMT model" if facts.format == "hf" else "a CTranslate2 model"
    use = (_use_hf(example, pipeline, facts.model.get("max_positions", 512)) if facts.format == "hf"
           else _use_ctranslate2(example, facts.serving, facts.model.get("max_positions", 512)))
    return f"""---
{yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip()}
---

# {facts.task}: {what} Transformer trained with aiayn

A Transformer ("Attention Is All You Need", Vaswani et al., 2017) trained with aiayn for {doing}
(task `{facts.task}`), exported as {kind}. The weights are
{weights}.

- **Task**: {facts.task} ({doing})
- **Data**: {facts.data.get('_target_', facts.task).rsplit('.', 1)[-1]}, vocabulary of {facts.model.get('vocab_size', '?')} joint sentencepiece subwords (`source.spm`{' = `target.spm`' if facts.format == 'hf' else ''})
- **Training**: {steps} ({facts.name}){fine_tuned}

## Scores

Measured for {measured}, on held-out data, each with its decoding settings:

{scores}

## Use

{use}

## What differs from aiayn

{note}

## Configuration

The network, the data, and the decoding settings this export decodes with (`generation_config.json`'s
for MarianMT, `aiayn.json`'s for CTranslate2; one the engine has no use for is null): the scores
above name the settings each was measured with.

```yaml
{config}
```
"""


def _use_hf(example: str, pipeline: str, max_positions: int) -> str:
    return f"""```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer = MarianTokenizer.from_pretrained("<this folder>")
model = MarianMTModel.from_pretrained("<this folder>")
# truncation: a line over the model's {max_positions} positions is cut, as aiayn cuts it
batch = tokenizer(["{example}"], return_tensors="pt", padding=True, truncation=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

`generate` decodes with `generation_config.json`, the settings below. transformers 4.x also runs it
as `pipeline("{pipeline}", model="<this folder>")`; transformers 5 removed the translation
pipeline, so there `generate` as above is the way. A CTranslate2 export of the same model:
`python src/export.py ... format=ctranslate2`."""


def _use_ctranslate2(example: str, serving: dict[str, Any], max_positions: int) -> str:
    handed = {key: value for key, value in serving.items() if key not in ("max_len_offset", "seed")}
    arguments = "".join(f", {key}={value!r}" for key, value in handed.items())
    seed = f"ctranslate2.set_random_seed({serving['seed']})\n" if serving.get("seed") is not None else ""
    return f"""With aiayn, reading and writing lines as it does with a checkpoint:
`python src/translate.py engine=ctranslate2 model_dir=<this folder> input=<file>`. With CTranslate2
directly, with the decoding settings of `aiayn.json`:

```python
import ctranslate2, sentencepiece
sp = sentencepiece.SentencePieceProcessor(model_file="<this folder>/source.spm")
translator = ctranslate2.Translator("<this folder>")
{seed}source = sp.encode("{example}", out_type=str)[:{max_positions - 1}] + ["</s>"]
limit = min(len(source) + {serving.get('max_len_offset')}, {max_positions})
result = translator.translate_batch([source], max_decoding_length=limit{arguments})
print(sp.decode(result[0].hypotheses[0]))
```

This folder is no Hugging Face model: `MarianMTModel` loads the `format=hf` export."""
