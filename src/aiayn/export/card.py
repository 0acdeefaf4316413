"""The model card (README.md) of an exported model: what it translates, what it was trained on and
for how long, the BLEU measured for it, its configuration, how to use it, and the one difference a
user must know: Hugging Face's and CTranslate2's beam search normalise by the length their own way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LENGTH_PENALTY_NOTE = (
    "aiayn ranks beam-search hypotheses by log P(Y|X) / ((5 + |Y|) / 6)^α (GNMT's length penalty, §6.1 "
    "of the paper, α = {alpha}); MarianMT's `generate` and CTranslate2 divide by |Y|^α instead. With the "
    "same α the two can pick different hypotheses, so beam-search output (and its BLEU) may differ slightly "
    "from aiayn's; greedy decoding (`num_beams=1`, `beam_size=1`) gives exactly aiayn's greedy output. aiayn also "
    "stops each sentence at its own input length + {offset} tokens; `generate` uses one maximum for the batch "
    "(`max_length` below, or `max_new_tokens`)."
)


@dataclass
class CardFacts:
    """What the card states about the exported model."""

    name: str  # the checkpoint (or "average of …")
    task: str  # e.g. multi30k_en_de
    src_lang: str | None
    tgt_lang: str | None
    steps: list[int]  # the training steps of the checkpoint(s) exported (several: averaged)
    model: dict[str, Any]  # the network's settings
    decoding: dict[str, Any]  # beam_size, alpha, max_len_offset
    data: dict[str, Any] = field(default_factory=dict)  # the task's data settings
    bleu: list[str] = field(default_factory=list)  # one line per measurement found


def measured_bleu(ckpt: Path, steps: list[int]) -> list[str]:
    """BLEU figures of these weights found beside ``ckpt``: the reports of src/evaluate.py in the
    run's ``eval/`` folder for the same steps, and the dev BLEU of the run's summary.json at the
    last of them."""
    run_dir = ckpt.resolve().parent.parent
    found = []
    for report in sorted((run_dir / "eval").glob("*.json")):
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        averaged = data.get("averaged") or [data.get("checkpoint")]
        if data.get("step") != steps[-1] or len(averaged) != len(steps):
            continue
        for key in ("sacrebleu", "tokenized_bleu"):
            if key in data:
                found.append(f"{data.get('split', '?')}, {key.replace('_', ' ')} ({_decoding(data.get('decoding'))}): "
                             f"{data[key]}")
    summary = run_dir / "summary.json"
    try:
        data = json.loads(summary.read_text(encoding="utf-8")) if summary.is_file() else {}
    except (OSError, ValueError):
        data = {}
    if data.get("dev/step") == steps[-1] and len(steps) == 1 and "dev/bleu" in data:
        found.append(f"dev set during training (first validation sentences), sacreBLEU: {data['dev/bleu']:.2f}")
    return found


def _decoding(settings: dict[str, Any] | None) -> str:
    settings = settings or {}
    return f"beam {settings.get('beam_size', '?')}, α {settings.get('alpha', '?')}"


def model_card(facts: CardFacts) -> str:
    """The README.md text."""
    pair = f"{facts.src_lang}→{facts.tgt_lang}" if facts.src_lang and facts.tgt_lang else "translation"
    steps = (f"{facts.steps[0]:,} steps" if len(facts.steps) == 1
             else f"the average of {len(facts.steps)} checkpoints at steps {', '.join(map(str, facts.steps))}")
    languages = [lang for lang in (facts.src_lang, facts.tgt_lang) if lang]
    front = {"language": languages, "tags": ["translation", "aiayn", "marian"], "pipeline_tag": "translation"}
    bleu = "\n".join(f"- {line}" for line in facts.bleu) or "- not measured yet: `python src/evaluate.py ckpt=<file>`"
    config = yaml.safe_dump({"model": facts.model, "decoding": facts.decoding, "data": facts.data},
                            sort_keys=False, allow_unicode=True).rstrip()
    note = LENGTH_PENALTY_NOTE.format(alpha=facts.decoding["alpha"], offset=facts.decoding["max_len_offset"])
    return f"""---
{yaml.safe_dump(front, sort_keys=False).rstrip()}
---

# {facts.task}: {pair} Transformer trained with aiayn

A Transformer ("Attention Is All You Need", Vaswani et al., 2017) trained with aiayn for {pair}
translation (task `{facts.task}`), exported as a Hugging Face MarianMT model. The weights are
exactly aiayn's: teacher-forced logits and greedy output equal those of the aiayn checkpoint.

- **Task**: {facts.task} ({pair})
- **Data**: {facts.data.get('_target_', facts.task).rsplit('.', 1)[-1]}, vocabulary of {facts.model.get('vocab_size', '?')} joint sentencepiece subwords (`source.spm` = `target.spm`)
- **Training**: {steps} ({facts.name})

## BLEU

{bleu}

## Use

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer = MarianTokenizer.from_pretrained("<this folder>")
model = MarianMTModel.from_pretrained("<this folder>")
batch = tokenizer(["A man is riding a bike."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

transformers 4.x also runs it as `pipeline("translation", model="<this folder>")`; transformers 5
removed the translation pipeline, so there `generate` as above is the way.

A CTranslate2 export of the same model (`python src/export.py ... format=ctranslate2`) carries this
card, `source.spm` and its decoding settings (`aiayn.json`); serve it with
`python src/translate.py engine=ctranslate2 model_dir=<that folder>`, or with CTranslate2 directly:

```python
import ctranslate2, sentencepiece
sp = sentencepiece.SentencePieceProcessor(model_file="<folder>/source.spm")
translator = ctranslate2.Translator("<folder>")
source = sp.encode("A man is riding a bike.", out_type=str) + ["</s>"]
print(sp.decode(translator.translate_batch([source], beam_size=4)[0].hypotheses[0]))
```

## What differs from aiayn

{note}

## Configuration

```yaml
{config}
```
"""
