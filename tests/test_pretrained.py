"""aiayn from Python (aiayn.pretrained, docs/python.md) on the session's tiny trained run: the
documented example run as it is written, the same outputs as the tools, the decoding settings
the schema's alone, each refusal's line, a checkpoint written on a GPU loaded on the CPU, and
what importing it costs (no torch for ``import aiayn``, no Lightning for translating)."""

from __future__ import annotations

import contextlib
import inspect
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import numpy
import pytest
import torch
import torch.serialization

import aiayn
from aiayn.config.schemas import DecodingConfig
from aiayn.config.tools import EvaluateConfig, TranslateConfig
from aiayn.decoding.translator import nbest_lines
from aiayn.errors import ConfigError, DataError
from aiayn.pretrained import Pretrained
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TrainedRun, run_command

DOC = REPO / "docs" / "python.md"
SOURCES = ["A man is riding a bike.", "", "Two dogs play in the snow .", "A woman sings."]
# α 20: the 4-step model's beam search otherwise ends at once, every translation empty (tests/decoding/test_translator.py).
SPOKEN = {"alpha": 20.0, "beam_size": 2}


def documented_example() -> str:
    """The first Python block under docs/python.md's "## An example", as it is written."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## An example\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]


@pytest.mark.slow
def test_the_documented_example_runs_as_written(tiny_run: TrainedRun, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    """The block runs verbatim in the folder that holds the tiny run as ``run/``, and each name it
    makes holds what its comment says."""
    assert tiny_run.run_dir.name == "run"
    monkeypatch.chdir(tiny_run.run_dir.parent)
    names: dict = {}
    exec(compile(documented_example(), str(DOC), "exec"), names)  # noqa: S102  the documented example, as written
    assert capsys.readouterr().out.startswith("<aiayn.Pretrained step 4 on cpu: beam 4, α 0.6, +5, stop paper")
    sources, hypotheses = names["sources"], names["hypotheses"]
    assert len(hypotheses) == len(names["wider"]) == len(sources) and all(isinstance(h, str) for h in hypotheses)
    best = names["best"]
    assert len(best) == 2 and best[0].score >= best[1].score and all(isinstance(h.text, str) for h in best)
    assert names["bleu"].signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert 1.0 < names["ppl"] < names["model"].vocab.vocab_size and math.isfinite(names["ppl"])
    maps = names["maps"]
    assert maps.cross.shape[:2] == (2, 2) and maps.cross.shape[3] == len(maps.src_pieces)
    assert torch.allclose(maps.cross.sum(-1), torch.ones(maps.cross.shape[:-1]), atol=1e-5)
    assert names["averaged"].steps == (3, 4) and names["model"].steps == (4,)
    assert names["logits"].shape == (3, 5, 1000)


@pytest.mark.slow
def test_translations_and_nbest_lists_are_translate_pys(tiny_run: TrainedRun, data_root: Path,
                                                        tmp_path: Path) -> None:
    """The same checkpoint and settings give what translate.py writes: the translations, and the
    n-best lists with their scores (aiayn.pretrained is translate.py's loading and translator)."""
    source = tmp_path / "in.en"
    source.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    settings = [f"decoding.{key}={value}" for key, value in SPOKEN.items()]

    def tool(*extra: str) -> list[str]:
        return run_tool("src/translate.py", f"ckpt={tiny_run.last}", f"input={source}", "device=cpu", *settings, *extra,
                        data_root=data_root, cache_dir=tiny_run.cache_dir).stdout.splitlines()

    model = aiayn.load(tiny_run.last, device="cpu")
    translations = model.translate(SOURCES, **SPOKEN)
    assert translations == tool() and any(translations)  # not all empty: a comparison that can fail
    assert model.translate(SOURCES[0], **SPOKEN) == translations[0]
    assert nbest_lines(model.generate(SOURCES, nbest=2, **SPOKEN)) == tool("decoding.nbest=2")


def test_the_decoding_settings_are_the_schemas_and_the_checkpoints(tiny_run: TrainedRun) -> None:
    """One address per setting: the decoding settings are DecodingConfig's fields under their
    names, each left out the checkpoint's own (debug=tiny's max_len_offset=5 over the schema's
    §6.1 defaults); no method restates one as a parameter of its own, and the other defaults are
    the tools' schemas'."""
    model = aiayn.load(tiny_run.last, device="cpu")
    schema = {f.name: f.default for f in fields(DecodingConfig)}
    for asked, expected in [({}, {**schema, "max_len_offset": 5}),
                            ({"beam_size": 8}, {**schema, "max_len_offset": 5, "beam_size": 8})]:
        served = {key: value for key, value in model.settings(asked).settings().items() if value is not None}
        assert served == {key: expected[key] for key in served}  # beam search: the sampling settings are None
        assert {"beam_size", "alpha", "max_len_offset", "stop", "nbest", "constrained"} <= set(served)
    # The settings object in hand is a whole config: model.decoding gives the same translator's settings, and
    # another's its changes (before: AttributeError, 'Decoding' object has no attribute 'items').
    assert model.translator(model.decoding).search.decoding == model.settings()
    wider = model.settings({"beam_size": 8})
    assert model.translator(wider).search.decoding == wider and model.settings(wider).beam_size == 8
    # Python's own numbers are taken as Python takes them: a whole number for α, numpy's integers.
    taken = model.settings({"alpha": 1, "beam_size": numpy.int64(2), "max_len_offset": None, "kv_cache": numpy.False_})
    assert (taken.alpha, taken.beam_size, taken.max_len_offset, taken.kv_cache) == (1.0, 2, 5, False)
    for method in (Pretrained.translate, Pretrained.generate, Pretrained.attention, aiayn.load):
        assert not set(inspect.signature(method).parameters) & set(schema), method
    assert inspect.signature(aiayn.load).parameters["device"].default == TranslateConfig.device
    assert inspect.signature(Pretrained.translate).parameters["batch_size"].default == TranslateConfig.batch_size
    assert inspect.signature(Pretrained.perplexity).parameters["max_tokens"].default == EvaluateConfig.max_tokens


def test_each_refusal_is_one_line_naming_the_file_or_setting(tiny_run: TrainedRun, tmp_path: Path) -> None:
    model = aiayn.load(tiny_run.last, device="cpu")
    missing = tmp_path / "missing.ckpt"
    for call, kind, line in [
        (lambda: aiayn.load(missing), DataError, f"{missing}: checkpoint not found"),
        (lambda: aiayn.load(tiny_run.run_dir), DataError,
         f"ckpt={tiny_run.run_dir} is a directory; give one checkpoint file, e.g. ckpt={tiny_run.last}"),
        (lambda: aiayn.load(tiny_run.run_dir / "train.log"), DataError,
         f"{tiny_run.run_dir / 'train.log'}: not a readable checkpoint ("),
        (lambda: aiayn.load(tiny_run.last, device="gpu"), ConfigError,
         "device must be auto (a GPU where there is one), cpu, cuda or cuda:<index>, got 'gpu'"),
        (lambda: aiayn.load([tiny_run.last, tiny_run.last], average_last=2), ConfigError,
         ("average_last=2 averages one checkpoint with those before it; give one checkpoint, or average each first "
         "(src/average.py) and give the averages as ckpt=a.ckpt,b.ckpt")),
        (lambda: aiayn.load(tiny_run.last, average_last=9), DataError,
         f"{tiny_run.checkpoints}: asked for the 9 checkpoints ending at last.ckpt (step 4) but there are only 4"),
        (lambda: model.translate(SOURCES, beam=2), ConfigError, ("decoding.beam is not a decoding setting; the settings "
         "are alpha, beam_size, constrained, kv_cache, max_len_offset, min_len, nbest, sampling, seed, stop, ")),
        (lambda: model.translate(SOURCES, beam_size=0), ConfigError, "decoding.beam_size must be "),
        (lambda: model.translate(SOURCES, nbest=2), ConfigError, ("decoding.nbest=2: translate gives each sentence's best "
         "translation; generate(sentences, nbest=2) gives the hypotheses")),
        (lambda: model.translate(SOURCES, batch_size=0), ConfigError, "batch_size must be a whole number of at least 1"),
        (lambda: model.translator(switches={"int9": True}), ConfigError, "int9 is not a speed switch; the switches are "),
        (lambda: model.translate(["A dog.", b"A cat."]), TypeError, "sentences must be strings; element 1 is bytes"),
        (lambda: model.perplexity(SOURCES, SOURCES[:2]), ConfigError, "perplexity needs one reference for each source"),
        # Before: TypeErrors of Python's own (slice indices, '<' between str and int), True taken for 1.
        *((lambda k=k: aiayn.load(tiny_run.last, average_last=k), ConfigError,
           f"average_last must be a whole number of checkpoints, 1 or more (null: the checkpoint alone), got {k!r}")
          for k in (1.5, "2", True)),
        # Before: "element 0 is int" for bytes, "'int' object is not iterable", a dict's keys translated.
        (lambda: model.translate(b"A dog."), TypeError,
         "sentences must be a string or a list of strings, got bytes; decode them first (.decode('utf-8'))"),
        (lambda: model.translate(5), TypeError, "sentences must be a string or a list of strings, got int"),
        (lambda: model.translate({"A dog.": 1}), TypeError, "sentences must be a string or a list of strings, got dict"),
        # A value of another type from Python (before: "4" taken as 4 and 1 as True, as a command line's text).
        (lambda: model.translate(SOURCES, beam_size="4"), TypeError,
         "decoding.beam_size must be a whole number (int), got str '4'"),
        (lambda: model.translate(SOURCES, kv_cache=1), TypeError, "decoding.kv_cache must be True or False, got int 1"),
        (lambda: model.generate(SOURCES, alpha=True), TypeError, "decoding.alpha must be a number, got bool True"),
        (lambda: model.settings({"stop": 0}), TypeError, "decoding.stop must be a string, got int 0"),
        # As visualize.py's (before: the maps of an input of EOS alone; nbest ignored).
        (lambda: model.attention(" "), ConfigError, "text is empty: give the sentence whose attention to draw"),
        (lambda: model.attention("A dog.", nbest=2), ConfigError,
         "decoding.nbest=2: the attention maps are of one translation, the best; leave nbest out"),
    ]:
        with pytest.raises(kind) as refused:
            call()
        assert str(refused.value).startswith(line) and "\n" not in str(refused.value), str(refused.value)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^device=cuda: this machine has no usable CUDA GPU; use device=cpu"):
            aiayn.load(tiny_run.last, device="cuda")
        said = run_tool("src/translate.py", f"ckpt={tiny_run.last}", "device=cuda", stdin="A dog.\n", check=False)
        line = "translate.py: device=cuda: this machine has no usable CUDA GPU; use device=cpu, or device=auto (a GPU where "
        assert (said.returncode, said.stderr) == (2, line + "there is one)\n")


def test_an_average_written_by_average_py_loads_as_the_average_it_holds(tiny_run: TrainedRun, data_root: Path,
                                                                        tmp_path: Path) -> None:
    """src/average.py's file loads as any checkpoint: the weights of ``average_last=2``, and the
    steps they average."""
    averaged = tmp_path / "averaged.ckpt"
    run_tool("src/average.py", f"ckpt={tiny_run.last}", "average_last=2", f"out={averaged}", data_root=data_root,
             cache_dir=tiny_run.cache_dir)
    loaded, window = aiayn.load(averaged, device="cpu"), aiayn.load(tiny_run.last, average_last=2, device="cpu")
    assert loaded.steps == window.steps == (3, 4) and repr(loaded).startswith("<aiayn.Pretrained steps 3–4 averaged")
    weights = loaded.network.state_dict()
    assert all(torch.equal(weights[name], tensor) for name, tensor in window.network.state_dict().items())


@contextlib.contextmanager
def saved_as_on_a_gpu() -> Iterator[None]:
    """Tensors saved in this block are recorded as CUDA tensors (``cuda:0``), as a GPU run writes
    them: torch.load on a machine without CUDA refuses such a file unless it maps the storages."""

    def on_gpu(storage) -> str | None:
        return "cuda:0" if storage.device.type == "cpu" else None

    torch.serialization.register_package(0, on_gpu, lambda storage, location: None)
    try:
        yield
    finally:
        torch.serialization._package_registry[:] = [entry for entry in torch.serialization._package_registry
                                                     if entry[1] is not on_gpu]


def test_a_checkpoint_written_on_a_gpu_loads_on_the_cpu(tiny_run: TrainedRun, tmp_path: Path) -> None:
    checkpoint = torch.load(tiny_run.last, map_location="cpu", weights_only=False)
    written = tmp_path / "gpu.ckpt"
    with saved_as_on_a_gpu():
        torch.save(checkpoint, written)
    if not torch.cuda.is_available():  # the file is a GPU's: read as it is, torch refuses it here
        with pytest.raises(RuntimeError, match="on a CUDA device but torch.cuda.is_available"):
            torch.load(written, weights_only=False)
    loaded, plain = aiayn.load(written, device="cpu").network, aiayn.load(tiny_run.last, device="cpu").network
    weights = loaded.state_dict()
    assert {tensor.device.type for tensor in weights.values()} == {"cpu"}
    assert all(torch.equal(weights[name], tensor) for name, tensor in plain.state_dict().items())


@pytest.mark.slow
@pytest.mark.cli  # what a fresh interpreter imports: a process of its own
def test_import_aiayn_imports_no_torch_and_translating_no_lightning(tiny_run: TrainedRun) -> None:
    """Python's -X importtime lists each module as it is imported, on stderr, where the script
    marks the end of ``import aiayn``."""
    script = ("import sys\nimport aiayn\nprint('imported aiayn', file=sys.stderr, flush=True)\n"
              f"print(aiayn.load({str(tiny_run.last)!r}, device='cpu').translate({SOURCES!r}, alpha=20.0))")
    result = run_command([sys.executable, "-X", "importtime", "-c", script], cache_dir=tiny_run.cache_dir)
    before, _, after = result.stderr.partition("imported aiayn\n")
    imported = [re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", part, re.MULTILINE) for part in (before, after)]
    assert "aiayn" in imported[0] and not [name for name in imported[0] if name.split(".")[0] == "torch"]
    assert "torch" in imported[1] and "aiayn.checkpoints.trained" in imported[1]  # (what aiayn.load's module imports)
    assert not [name for name in imported[1] if name.split(".")[0] in ("lightning", "pytorch_lightning")]
    assert result.stdout.startswith("[")
