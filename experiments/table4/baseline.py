"""Baselines for Table 4 (§6.3): trees any trained parser must beat, on the 10% treebank sample.

    python experiments/table4/baseline.py [--data-root DIR] [--split test|val] [--json OUT]

Each baseline reads only the words of a sentence (like the Transformer parser) and writes a
linearised tree (Vinyals et al., 2015), which is read back and scored exactly as a trained
model's output is: :func:`aiayn.data.parsing.datamodule.output_trees` puts the gold words and
tags in place of the ``XX`` leaves, and :func:`aiayn.metrics.parseval.parseval` computes EVALB's
labelled-bracket figures (COLLINS.prm) against the gold trees. The gold trees are read as the
data module reads them (:func:`~aiayn.data.parsing.treebank.iter_split`, then
:func:`~aiayn.data.parsing.treebank.preprocess`, trees left empty dropped), so they are the
lines of its ``.gold`` files. The splits are the ``sample`` split of ``conf/task/wsj.yaml``
(train wsj_0001-wsj_0159, dev wsj_0160-wsj_0179, test wsj_0180-wsj_0199).

What is learnt from the training split, and nothing else:

- the root label: the most frequent label directly under ``TOP`` (``S`` on the sample);
- the punctuation words: words tagged with one of the punctuation tags EVALB deletes
  (``, : `` '' .``) in most of their training occurrences (``,`` ``.`` ``--`` ``;`` ...);
- two candidate constituent labels: the most frequent constituent label (``NP``), and the most
  frequent label of the constituents that reach the end of the sentence without starting it
  (``VP``), counted in EVALB's terms (punctuation deleted).

The baselines:

- **flat**: the root label over all the words, ``(S XX XX ... )S``: one bracket, always right.
- **right-branching**: the root label over all the words, and inside it a chain of constituents
  each starting one word later and all ending at the last word:
  ``(S XX (L XX (L XX XX )L )L )S`` for four words. The first word opens nothing (the root
  spans from it) and neither does the last word of the chain (a constituent needs two words).
  Three choices, each made on the *dev* split (the best F1 of the eight combinations; the test
  split is never looked at to choose):

  - ``label``: ``L`` is the most frequent label (``NP``) or the most frequent sentence-final
    one (``VP``);
  - ``punct_root``: sentence-final punctuation (the run of punctuation words at the end) is
    attached to the root after the chain, as in the treebank, instead of ending the chain;
  - ``skip_punct``: punctuation words open no constituent (EVALB deletes them, so a constituent
    opened at one has the same scored span as the next, and would be counted twice).

Both baselines always have each sentence's words in order, so no sentence is an error sentence.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from aiayn.cli.arguments import OneLineParser
from aiayn.data.parsing.datamodule import output_trees
from aiayn.data.parsing.linearize import LEAF, linearize
from aiayn.data.parsing.treebank import ROOT_LABEL, Tree, iter_split, preprocess
from aiayn.metrics.parseval import DELETE_LABELS, parseval, tree_brackets

REPO = Path(__file__).resolve().parents[2]
TASK_CONFIG = REPO / "conf" / "task" / "wsj.yaml"
PUNCTUATION_TAGS = DELETE_LABELS - {ROOT_LABEL, "-NONE-"}
"""The tags whose words EVALB deletes before counting positions: , : `` '' ."""


# -- data ---------------------------------------------------------------------------------
def sample_split() -> dict[str, str]:
    """The treebank folder and the train/val/test file ranges of ``task.split=sample``."""
    return yaml.safe_load(TASK_CONFIG.read_text(encoding="utf-8"))["splits"]["sample"]


def gold_trees(treebank: str | os.PathLike, split: str) -> list[Tree]:
    """The preprocessed trees of a split, as the data module writes them to its ``.gold`` file."""
    return [tree for _, raw in iter_split(treebank, split) if (tree := preprocess(raw)) is not None]


# -- what is learnt from the training split -------------------------------------------------
@dataclass(frozen=True)
class Learnt:
    root_label: str
    frequent_label: str
    final_label: str
    punctuation: frozenset[str]


def learn(train: Sequence[Tree]) -> Learnt:
    """The root label, the two candidate constituent labels and the punctuation words."""
    roots = Counter(child.label for tree in train for child in tree.children if isinstance(child, Tree))
    labels: Counter = Counter()
    final: Counter = Counter()
    for tree in train:
        scored = tree_brackets(str(tree))
        for (label, start, end), count in scored.brackets.items():
            labels[label] += count
            if end == len(scored.words) and start > 0:
                final[label] += count
    tagged = Counter(pair for tree in train for pair in tree.tagged_words())
    as_punct: Counter = Counter()
    seen: Counter = Counter()
    for (tag, word), count in tagged.items():
        seen[word] += count
        if tag in PUNCTUATION_TAGS:
            as_punct[word] += count
    punctuation = frozenset(word for word, count in as_punct.items() if 2 * count > seen[word])
    return Learnt(roots.most_common(1)[0][0], labels.most_common(1)[0][0], final.most_common(1)[0][0], punctuation)


# -- the baselines --------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One variant of the right-branching baseline (see the module docstring)."""

    label: str  # "frequent" or "final"
    punct_root: bool
    skip_punct: bool

    def describe(self, learnt: Learnt) -> str:
        label = learnt.frequent_label if self.label == "frequent" else learnt.final_label
        return (f"label {label} ({'most frequent' if self.label == 'frequent' else 'most frequent sentence-final'}), "
                f"final punctuation {'under the root' if self.punct_root else 'in the chain'}, "
                f"punctuation {'opens nothing' if self.skip_punct else 'opens constituents too'}")


RULES = [Rule(label, punct_root, skip_punct)
         for label, punct_root, skip_punct in itertools.product(("frequent", "final"), (True, False), (True, False))]


def leaf(word: str) -> Tree:
    return Tree(LEAF, [word])


def flat(words: Sequence[str], learnt: Learnt) -> Tree:
    """The root label over all the words."""
    return Tree(ROOT_LABEL, [Tree(learnt.root_label, [leaf(w) for w in words])])


def right_branching(words: Sequence[str], learnt: Learnt, rule: Rule) -> Tree:
    """The root label over all the words, with a right-branching chain inside it."""
    label = learnt.frequent_label if rule.label == "frequent" else learnt.final_label
    end = len(words)
    if rule.punct_root:
        while end > 0 and words[end - 1] in learnt.punctuation:
            end -= 1
        if end == 0:  # punctuation only: nothing to branch over
            end = len(words)
    top = Tree(learnt.root_label)
    node = top
    for i in range(end):
        opens = 0 < i < end - 1 and not (rule.skip_punct and words[i] in learnt.punctuation)
        if opens:
            child = Tree(label)
            node.children.append(child)
            node = child
        node.children.append(leaf(words[i]))
    top.children.extend(leaf(w) for w in words[end:])
    return Tree(ROOT_LABEL, [top])


def score(gold: Sequence[Tree], trees: Sequence[Tree]) -> dict[str, float]:
    """EVALB figures of baseline trees, read back from their linearisations as a model's are."""
    gold_lines = [str(tree) for tree in gold]
    result = parseval(gold_lines, output_trees(gold_lines, [linearize(tree) for tree in trees]))
    return result.as_dict()


def evaluate(gold: Sequence[Tree], learnt: Learnt, rule: Rule | None) -> dict[str, float]:
    """The figures of the flat baseline (``rule`` None) or of a right-branching rule on ``gold``."""
    sentences = [tree.leaves() for tree in gold]
    if rule is None:
        return score(gold, [flat(words, learnt) for words in sentences])
    return score(gold, [right_branching(words, learnt, rule) for words in sentences])


def choose_rule(dev: Sequence[Tree], learnt: Learnt) -> tuple[Rule, dict[Rule, float]]:
    """The right-branching rule with the best dev F1 (the first listed on a tie), and every F1."""
    f1 = {rule: evaluate(dev, learnt, rule)["f1"] for rule in RULES}
    return max(RULES, key=lambda rule: f1[rule]), f1


def run(data_root: str | os.PathLike, split: str = "test") -> dict:
    """Learn on train, choose on dev, score both baselines on ``split`` (``test`` or ``val``)."""
    splits = sample_split()
    treebank = Path(data_root) / splits["treebank"]
    learnt = learn(gold_trees(treebank, splits["train"]))
    dev = gold_trees(treebank, splits["val"])
    chosen, dev_f1 = choose_rule(dev, learnt)
    target = dev if split == "val" else gold_trees(treebank, splits[split])
    return {
        "treebank": str(treebank),
        "split": split,
        "files": splits[split],
        "sentences": len(target),
        "learnt": {**asdict(learnt), "punctuation": sorted(learnt.punctuation)},
        "chosen_rule": {**asdict(chosen), "description": chosen.describe(learnt)},
        "dev_f1_by_rule": [{**asdict(rule), "f1": f1} for rule, f1 in dev_f1.items()],
        "dev": {"flat": evaluate(dev, learnt, None), "right_branching": evaluate(dev, learnt, chosen)},
        "scores": {"flat": evaluate(target, learnt, None), "right_branching": evaluate(target, learnt, chosen)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=os.environ.get("AIAYN_DATA_ROOT"),
                        help="the data folder holding ptb_sample/ (default: $AIAYN_DATA_ROOT)")
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    if not args.data_root:
        parser.error("no data root: pass --data-root or set AIAYN_DATA_ROOT")
    report = run(args.data_root, args.split)
    learnt = report["learnt"]
    print(f"learnt on train: root label {learnt['root_label']}, most frequent label {learnt['frequent_label']}, "
          f"most frequent sentence-final label {learnt['final_label']}")
    print("dev F1 of the right-branching rules:")
    for row in report["dev_f1_by_rule"]:
        print(f"  label={row['label']:<8} punct_root={row['punct_root']!s:<5} skip_punct={row['skip_punct']!s:<5} "
              f"F1 {row['f1']:6.2f}")
    print(f"chosen on dev: {report['chosen_rule']['description']}")
    for name, figures in (("dev", report["dev"]), (f"{args.split} ({report['files']})", report["scores"])):
        if name == "dev" and args.split == "val":
            continue
        print(f"{name}, {figures['flat']['sentences']} sentences:")
        for baseline, s in figures.items():
            print(f"  {baseline:<15} F1 {s['f1']:6.2f}  P {s['precision']:6.2f}  R {s['recall']:6.2f}  "
                  f"exact {s['exact_match']:5.2f}  (error sentences {s['error_sentences']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
