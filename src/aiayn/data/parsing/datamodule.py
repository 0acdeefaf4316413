"""English constituency parsing as translation (§6.3): the words of a sentence in, its
linearised tree (Vinyals et al., 2015) out, in a :class:`TranslationDataModule`.

Each split of the treebank is turned into three line-aligned files in the cache: ``.words``
(the sentence, the source), ``.linear`` (the linearised tree, the target) and ``.gold`` (the
preprocessed gold tree on one line, what F1 is computed against). The joint sentencepiece
vocabulary keeps every bracket token (``(NP``, ``)NP``) and ``XX`` whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from glob import glob
from pathlib import Path
from typing import Any

from aiayn.data.datamodule import TranslationDataModule, require_lines
from aiayn.data.parsing.constraints import TreeConstraint, has_tree_symbols
from aiayn.data.parsing.linearize import LEAF, LINEARIZATIONS, delinearize, linearize, output_symbols
from aiayn.data.parsing.raw_text import RawText
from aiayn.data.parsing.treebank import (
    ROOT_LABEL,
    TREEBANK_LABELS,
    WSJ_DIR,
    Tree,
    iter_split,
    parse_split,
    parse_trees,
    preprocess,
    read_trees,
    split_coverage,
    split_files,
)
from aiayn.data.readers import read_lines, read_parallel
from aiayn.data.subwords import Subwords, train_or_load
from aiayn.errors import ConfigError, DataError
from aiayn.files import atomic_write_text
from aiayn.metrics.scorers import ParseF1

log = logging.getLogger(__name__)

_FORMAT = 1  # bump when the derived files change meaning
TREEBANK_SOURCE = "the Penn Treebank WSJ, LDC99T42 (https://catalog.ldc.upenn.edu/LDC99T42), in LDC's Treebank-3 layout"
SPACE = "\u2581"  # sentencepiece's word-boundary mark
# What the semi-supervised setting (task=wsj_semi) needs, said where its trees are not found.
EXTRA_TREES_HINT = ("the semi-supervised setting trains on parsed corpora besides WSJ (§6.3: Vinyals et al.'s "
                    "high-confidence and BerkeleyParser corpora, ~17M sentences, not public): put files of bracketed "
                    "trees there or point task.datamodule.extra_trees at them (glob patterns); task=wsj trains on WSJ "
                    "alone")
_CONSTITUENT = re.compile(r"\((\S+) \(")  # a constituent's label in a one-line tree: its first child is a tree


class ParsingDataModule(TranslationDataModule):
    """The WSJ treebank at ``<data_root>/<treebank>`` (Treebank-3 layout) as a parsing task.

    ``train_split``, ``val_split`` and ``test_split`` are split specifications (sections
    ``"02-21"`` or file ranges ``"wsj_0001-wsj_0159"``, see :func:`aiayn.data.parsing.treebank.parse_split`).
    ``extra_trees`` (semi-supervised setting) are files (glob patterns allowed) of further
    training trees in the same bracketed format, e.g. the high-confidence parsed corpus of
    Vinyals et al.; when given, the WSJ training trees are repeated so that they make up
    ``wsj_fraction`` of the training set (at least once).

    Its outputs are linearised trees: decoding may be constrained to well-formed ones
    (``decoding.constrained``), and evaluation scores them with EVALB's F1 against gold trees, on
    any sections or file ranges of the treebank.
    """

    OUTPUT_CONSTRAINT = TreeConstraint

    def __init__(
        self,
        data_root: str,
        treebank: str,
        train_split: str,
        val_split: str,
        test_split: str,
        vocab_size: int,
        max_tokens: int,
        max_length: int,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        eval_max_tokens: int | None = None,
        extra_trees: Sequence[str] | None = None,
        wsj_fraction: float = 0.1,
        src_lang: str = "words",
        tgt_lang: str = "linear",
        download: bool = False,
        linearization: str = "xx",
        length_buckets: list[int] | None = None,
        subword_model: str | None = None,
    ):
        super().__init__(data_root, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
                         num_workers, download, str(train_split), str(val_split), str(test_split), eval_max_tokens,
                         length_buckets, subword_model)
        self.treebank = Path(treebank) if Path(treebank).is_absolute() else Path(data_root) / treebank
        self.extra_trees = list(extra_trees or [])
        self.check_settings("task.datamodule", {"wsj_fraction": wsj_fraction, "linearization": linearization,
                                                **{f"{role}_split": spec for role, spec in self.splits.items()}})
        self.wsj_fraction = float(wsj_fraction)
        self.linearization = linearization
        given = self.given_vocab
        if given is not None and not (has_tree_symbols(given) and (linearization != "xx" or f"{SPACE}{LEAF}" in given.piece_ids())):
            raise ConfigError(f"task.subword_model={subword_model} keeps no tree symbols whole ('{SPACE}(L', '{SPACE})L'"
                              f"{f', {SPACE}{LEAF}' if linearization == 'xx' else ''}), so the trees would be spelt as "
                              "words; give a parsing run's subword model, or null to learn one from the training trees")
        self._gold: dict[str, list[str]] = {}
        self.save_hyperparameters(logger=False)  # in checkpoints; the logged config has them as task.datamodule.*

    @staticmethod
    def check_settings(section: str, settings: Mapping[str, Any]) -> None:
        """The share of WSJ's trees, the leaves' linearisation and the splits' specifications of
        ``settings`` (the data module's config, at ``section``), before anything is read: train's check of
        the whole config and ``--cfg job`` (aiayn.training.config_check), and the constructor."""
        fraction = settings.get("wsj_fraction", 0.1)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
            raise ConfigError(f"{section}.wsj_fraction={fraction}: the share of WSJ's trees in the "
                              "semi-supervised training set must be above 0 and at most 1 (the default: 0.1)")
        linearization = settings.get("linearization", "xx")
        if linearization not in LINEARIZATIONS:
            raise ConfigError(f"{section}.linearization={linearization}: the output trees' leaves are "
                              f"{' or '.join(LINEARIZATIONS)} (docs/parsing.md)")
        for role in ("train", "val", "test"):  # a bad split is one line, not a traceback
            if (spec := settings.get(f"{role}_split")) is None:
                continue
            try:
                parse_split(str(spec))
            except ValueError as error:
                raise ConfigError(f"{section}.{role}_split={spec}: {error}") from None

    # -- files ----------------------------------------------------------------------------
    def split_files(self, split: str, download: bool = False) -> tuple[Path, Path]:
        """The (words, linearised trees) files of a split, built from the treebank on first use."""
        words, linear, _ = self._derived(split)
        return words, linear

    def required_files(self, split: str) -> dict[Path, str]:
        """The treebank files of ``split`` and, for training, the extra trees; what is absent is
        named by where it was expected (a section's folder, a file range's first file)."""
        found, absent = split_coverage(self.treebank, split)
        files = dict.fromkeys(found, "")
        files.update({path: f"{what}; from {TREEBANK_SOURCE}" for path, what in absent.items()})
        if split == self.splits["train"]:
            for pattern in self.extra_trees:
                matched = sorted(glob(self._pattern(pattern)))
                if matched:
                    files.update(dict.fromkeys(map(Path, matched), ""))
                else:
                    files[Path(self._pattern(pattern))] = f"no file of extra training trees; {EXTRA_TREES_HINT}"
        return files

    def missing_files_message(self, listing: str) -> str:
        return f"treebank files missing or unreadable: {listing}"

    def check_contents(self, split: str, role: str) -> None:
        """Nothing to read through ahead: a split's files are derived from the trees, aligned by
        construction (a malformed tree file is named when the split is built)."""

    def gold_file(self, split: str) -> Path:
        """The gold trees of a split, one preprocessed tree a line (EVALB's format)."""
        return self._derived(self.splits.get(split, split))[2]

    def _derived(self, split: str) -> tuple[Path, Path, Path]:
        sources = split_files(self.treebank, split)
        extra = self._extra_files() if split == self.splits["train"] else []
        # the change time too: a file replaced by one of the same size with its time kept (cp -p) is another
        stats = [(str(p), s.st_size, s.st_mtime_ns, s.st_ctime_ns) for p in [*sources, *extra] for s in (p.stat(),)]
        key = hashlib.sha256(json.dumps([_FORMAT, split, self.wsj_fraction if extra else None, self.seed if extra else None,
                                         stats] + ([self.linearization] if self.linearization != "xx" else [])
                                        ).encode()).hexdigest()[:16]
        folder = self.cache_dir / "parsing" / key
        name = split.replace(",", "+").replace("/", "_")
        paths = tuple(folder / f"{name}.{suffix}" for suffix in ("words", "linear", "gold"))
        if all(path.is_file() for path in paths):
            return paths
        trees, dropped = [], 0
        for path, raw in iter_split(self.treebank, split):
            tree = preprocess(raw)
            if tree is None:
                dropped += 1
            else:
                trees.append(tree)
        log.info("treebank split %s: %d trees from %d files (%d left empty by preprocessing, dropped)",
                 split, len(trees), len(sources), dropped)
        if extra:
            trees = self._mix(trees, extra)
        contents = (
            [" ".join(tree.leaves()) for tree in trees],
            [linearize(tree, self.linearization) for tree in trees],
            [str(tree) for tree in trees],
        )
        for path, lines in zip(paths, contents):
            atomic_write_text(path, "".join(line + "\n" for line in lines))
        return paths

    def _extra_files(self) -> list[Path]:
        files: list[Path] = []
        for pattern in self.extra_trees:
            pattern = self._pattern(pattern)
            matched = sorted(glob(pattern))
            if not matched:
                raise DataError(f"{pattern}: no files of extra training trees; {EXTRA_TREES_HINT}")
            files.extend(Path(m) for m in matched)
        return files

    def _pattern(self, pattern: str) -> str:
        """An extra-trees pattern as given, or under ``data_root`` when relative."""
        return str(pattern if Path(pattern).is_absolute() else Path(self.data_root) / pattern)

    def _mix(self, wsj: list[Tree], extra_files: list[Path]) -> list[Tree]:
        extra, dropped = [], 0
        for path in extra_files:
            for raw in read_trees(path):
                tree = preprocess(raw)
                if tree is None:
                    dropped += 1
                else:
                    extra.append(tree)
        # The paper mixes "the larger high-confidence and BerkleyParser corpora" with WSJ without
        # giving the proportion; here WSJ is repeated to make up wsj_fraction of the whole.
        copies = max(1, round(self.wsj_fraction * len(extra) / ((1 - self.wsj_fraction) * len(wsj))))\
            if self.wsj_fraction < 1 else 1
        mixed = wsj * copies + extra
        if abs(len(wsj) * copies / len(mixed) - self.wsj_fraction) > 0.05:  # WSJ can only be repeated, never cut
            log.warning("semi-supervised training set: WSJ's %d trees make up %.0f%% of it, not task.datamodule."
                        "wsj_fraction=%g: %d extra trees are too few for that; more extra trees, or wsj_fraction "
                        "of at least %.2f, train what the setting says", len(wsj), 100 * len(wsj) * copies / len(mixed),
                        self.wsj_fraction, len(extra), len(wsj) / len(mixed))
        random.Random(self.seed).shuffle(mixed)
        log.info("semi-supervised training set: %d WSJ trees × %d + %d extra trees from %d files (%d empty, "
                 "dropped) = %d", len(wsj), copies, len(extra), len(extra_files), dropped, len(mixed))
        return mixed

    # -- vocabulary -----------------------------------------------------------------------
    def _train_or_load(self, src: list[str], tgt: list[str]) -> Subwords:
        # the treebank's labels, every one, and any other the training trees have
        labels = sorted({token[1:] for line in tgt for token in line.split() if token.startswith("(")}
                        | set(TREEBANK_LABELS))
        symbols = [SPACE + symbol for symbol in output_symbols(labels, self.linearization)]
        return train_or_load(src + tgt, self.vocab_size, self.cache_dir, user_defined_symbols=symbols)

    # -- trees ----------------------------------------------------------------------------
    def gold_trees(self, split: str) -> list[str]:
        """The gold trees of an evaluation split (one-line strings), indexed by dataset index."""
        role = self._role(split)
        if role not in self._gold:
            self._gold[role] = read_lines(self.gold_file(self.splits[role]))
        return self._gold[role]

    def scorer(self) -> ParseF1:
        """EVALB's F1 (§6.3) of the outputs read back as trees over their gold trees' words."""
        return ParseF1(to_trees=output_trees)

    @classmethod
    def does(cls, datamodule: Mapping[str, Any]) -> str:
        return "parses sentences into trees"

    @classmethod
    def raw_text(cls, vocab: Subwords, constraint: TreeConstraint | None = None) -> RawText:
        """Each line's words in, a tree over exactly those words out (:class:`RawText`), read with
        ``constraint`` (the tree constraint of ``vocab`` decoding uses; None: one is built)."""
        try:
            return RawText(vocab, constraint)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def check_split(self, split: str, task: str) -> str:
        """A split's specification (a role, or sections/file ranges of the treebank, any of them);
        a ConfigError saying what a specification is, when it is none, or, for sections or files
        the treebank here has none of, which sections it has and the task's splits."""
        name = self.splits.get(split, split)
        roles = f"task {task}'s splits are " + ", ".join(f"{role} ({named})" for role, named in self.splits.items()
                                                        if role != "train")
        try:
            parse_split(name)
            if split not in self.splits and (self.treebank / WSJ_DIR).is_dir():  # sections or files: are they here?
                split_files(self.treebank, name, hint=f"{roles}, or sections or files of the sections there")
        except DataError as error:
            raise ConfigError(f"split={split}: {error}") from None
        except ValueError as error:
            raise ConfigError(f"split={split}: {error}; {roles}") from None
        return name

    def evaluation_data(self, split: str, vocab: Subwords | None = None) -> tuple[list[str], list[str], list[str]]:
        """A split's sentences (their words), their linearised trees (the model's targets) and
        their gold trees (what :meth:`scorer` compares outputs with); a warning names the gold
        labels ``vocab`` (the model's) has no symbol for."""
        words, linear = read_parallel(*(files := self.split_files(split)))
        require_lines(words, *files)  # nothing to score: refused, as training refuses it
        gold = read_lines(self.gold_file(split))
        if vocab is not None:
            say_unwritable_labels(split, gold, vocab)
        return words, linear, gold

    def _load(self, role: str):
        dataset = super()._load(role)
        if role != "train":  # validation's and the test's gold trees, against the vocabulary just loaded
            say_unwritable_labels(self.splits[role], self.gold_trees(role), self.vocab)
        return dataset

    def scoring_references(self, split: str) -> list[str]:
        """The gold trees: what :meth:`scorer` scores an evaluation split's output against."""
        return self.gold_trees(split)


def output_trees(gold: Sequence[str], outputs: Sequence[str]) -> list[str]:
    """Each output read back (:func:`delinearize`) over the words and tags of its gold tree."""
    trees = []
    for gold_line, output in zip(gold, outputs, strict=True):
        reference = parse_trees(gold_line)[0] if gold_line.strip() else Tree(ROOT_LABEL)
        trees.append(str(delinearize(output, reference.leaves(), reference.tags())))
    return trees


def say_unwritable_labels(split: str, gold: Sequence[str], vocab: Subwords) -> Counter:
    """The constituent labels of the ``gold`` trees (one-line strings) that ``vocab`` has no tree
    symbol for (``▁(L``), counted by bracket, said in a warning naming ``split``: the model cannot
    write them, so F1 counts their brackets as missed, and a target spells each as a word's subwords."""
    pieces = vocab.piece_ids()
    missing = Counter(label for line in gold for label in _CONSTITUENT.findall(line)
                      if label != ROOT_LABEL and f"{SPACE}({label}" not in pieces)
    if missing:
        trees = sum(1 for line in gold if any(label in missing for label in _CONSTITUENT.findall(line)))
        log.warning("treebank split %s: %d gold trees have labels the parser's vocabulary has no symbol for (%s): "
                    "the model cannot write them, so F1 counts those %d brackets as missed, and perplexity reads "
                    "each label as a word's subwords; a vocabulary learnt from trees with these labels has them",
                    split, trees, ", ".join(f"{label} ×{count}" for label, count in sorted(missing.items())),
                    sum(missing.values()))
    return missing
