"""src/export.py end to end: a checkpoint (or the average of the last ones) exported as a Hugging Face
MarianMT folder and as a CTranslate2 model, served by translate.py engine=ctranslate2 with aiayn's
own output; what cannot be exported, and bad settings, refused in one line before anything is
written. On the session's tiny trained run; the tools run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.averaging import average_checkpoints, last_checkpoints
from aiayn.checkpoints.io import read_checkpoint
from aiayn.checkpoints.trained import module_arguments
from aiayn.export.marian import marian_order
from aiayn.training.module import TranslationModule
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")

SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow.", "A woman sings on a stage."]


def export(tiny_run: TrainedRun, data_root: Path, *arguments: str, check: bool = True):
    return run_tool("src/export.py", *arguments, data_root=data_root, cache_dir=tiny_run.cache_dir, check=check)


def test_hf_export_of_averaged_checkpoints_loads_with_transformers(tiny_run, data_root, tmp_path):
    out = tmp_path / "exported" / "hf"
    result = export(tiny_run, data_root, f"ckpt={tiny_run.checkpoints / 'step0000004.ckpt'}", "average_last=2",
                    f"out={out}")
    assert "averaged over steps 3, 4" in result.stdout and str(out) in result.stdout
    assert result.stderr == "", result.stderr  # no library's progress bars
    marian = transformers.MarianMTModel.from_pretrained(str(out))
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    assert tokenizer("A dog.").input_ids[-1] == tokenizer.eos_token_id
    average = average_checkpoints(last_checkpoints(tiny_run.checkpoints, 2,
                                                   ending_at=tiny_run.checkpoints / "step0000004.ckpt"))
    embedding = average["state_dict"]["model.src_embedding.weight"]
    order = marian_order(embedding.size(1))
    torch.testing.assert_close(marian.model.shared.weight, embedding[:, order])  # the average, d_model reordered
    assert "the average of 2 checkpoints at steps 3, 4" in (out / "README.md").read_text(encoding="utf-8")
    # exporting again replaces the earlier export
    export(tiny_run, data_root, f"ckpt={tiny_run.last}", f"out={out}")
    assert "the average" not in (out / "README.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in out.parent.iterdir()) == ["hf"]  # no scratch folder left beside it


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_an_export_replaces_an_earlier_export_and_nothing_else(tiny_run, data_root, tmp_path):
    """Only a folder an export wrote, as it wrote it, is replaced (before: any folder holding a
    config.json was removed whole, a model folder of another tool or a project among them, and
    out=. removed the working folder's files before failing with a traceback)."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "webapp"}\n')
    (project / "src" / "main.js").write_text("important\n")
    model = tmp_path / "hf-model"  # a Hugging Face model folder another tool wrote
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    (model / "pytorch_model.bin").write_bytes(b"weights")
    export(tiny_run, data_root, f"ckpt={tiny_run.last}", f"out={tmp_path / 'ours'}")
    (tmp_path / "ours" / "MY_NOTES.md").write_text("notes\n")  # added to an earlier export
    cases = [
        (project, [f"out={project}"], ("is a folder holding files an export of aiayn did not write (config.json, "
                                      "src/main.js)")),
        (model, [f"out={model}", "format=ctranslate2"], ("holding files an export of aiayn did not write (config.json, "
                                                        "pytorch_model.bin)")),
        (tmp_path / "ours", [f"out={tmp_path / 'ours'}"], "did not write (MY_NOTES.md)"),
        (project, ["out=."], "is the working folder, which an export would replace"),
        (project / "src", ["out=.."], "is the working folder or above it"),
    ]
    for folder, arguments, expected in cases:
        before = _files(folder)
        cwd = {"out=.": project, "out=..": project / "src"}.get(arguments[0], tmp_path)
        result = run_tool("src/export.py", f"ckpt={tiny_run.last}", *arguments, cwd=cwd, data_root=data_root,
                          cache_dir=tiny_run.cache_dir, check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], (arguments, result.stderr)
        assert _files(folder) == before, arguments
    assert not [p for p in tmp_path.rglob(".*") if p.name != ".aiayn-export.json"], "no scratch folder left"
    # The earlier export, as it was written, is replaced: its record lists what it wrote.
    (tmp_path / "ours" / "MY_NOTES.md").unlink()
    record = json.loads((tmp_path / "ours" / ".aiayn-export.json").read_text())
    assert record["format"] == "hf" and "config.json" in record["files"]
    export(tiny_run, data_root, f"ckpt={tiny_run.last}", "format=ctranslate2", f"out={tmp_path / 'ours'}")
    assert json.loads((tmp_path / "ours" / ".aiayn-export.json").read_text())["format"] == "ctranslate2"


@pytest.mark.slow
def test_ctranslate2_export_serves_translate_with_our_output(tiny_run, data_root, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")
    out = tmp_path / "ct2"
    exported = export(tiny_run, data_root, f"ckpt={tiny_run.last}", "format=ctranslate2", f"out={out}")
    assert exported.stderr == "", exported.stderr  # its one line on stdout; no library's progress bars
    source = tmp_path / "source.en"
    source.write_text("".join(line + "\n" for line in SENTENCES), encoding="utf-8")
    # beam 1 with α 0 is aiayn's greedy search (a length penalty could let a longer beam-1 hypothesis win)
    greedy = ["decoding.beam_size=1", "decoding.alpha=0.0", "decoding.max_len_offset=5", "device=cpu", f"input={source}"]
    ours = run_tool("src/translate.py", f"ckpt={tiny_run.last}", *greedy, "out=" + str(tmp_path / "ours.de"),
                    data_root=data_root, cache_dir=tiny_run.cache_dir)
    theirs = run_tool("src/translate.py", "engine=ctranslate2", f"model_dir={out}", *greedy,
                      "out=" + str(tmp_path / "ct2.de"), data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert "translated 4 lines" in theirs.stderr and ours.returncode == 0
    assert (tmp_path / "ct2.de").read_text(encoding="utf-8") == (tmp_path / "ours.de").read_text(encoding="utf-8")
    # What CTranslate2 serves is passed on (its own rule, first_k, asked for too; n-best lists); what it
    # cannot serve is refused naming it (before: stop, nbest and sampling were refused for the stopping rule).
    nbest = run_tool("src/translate.py", "engine=ctranslate2", f"model_dir={out}", f"input={source}",
                     "decoding.stop=first_k", "decoding.nbest=3", data_root=data_root, cache_dir=tiny_run.cache_dir)
    rows = [line.split("\t") for line in nbest.stdout.splitlines()]
    # the empty line: 3 lines as any other, each "" scored 0 (before: one, which put the lines after it off by two)
    assert [int(row[0]) for row in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [row[1:] for row in rows[3:6]] == [["0.0000", "0.0000", ""]] * 3
    assert all(float(row[2]) < 0 for row in rows if row[3])
    for setting, refusal in [("decoding.constrained=true", "CTranslate2 cannot serve decoding.constrained=true"),
                             ("decoding.kv_cache=false", "CTranslate2 cannot serve decoding.kv_cache=false"),
                             # a GPU CTranslate2 does not find (before: "cuda:99" handed on to it as the device)
                             ("device=cuda:99", "device=cuda:99: CTranslate2 finds ")]:
        result = run_tool("src/translate.py", "engine=ctranslate2", f"model_dir={out}", setting, stdin="A dog.\n",
                          data_root=data_root, check=False)
        assert result.returncode == 2 and result.stderr.startswith(f"translate.py: {refusal}"), result.stderr


@pytest.mark.slow
def test_an_export_serves_the_decoding_asked_for_or_refuses_it(tiny_run, data_root, tmp_path):
    """export.py decoding.*: what the export's engine serves is recorded for it (CTranslate2's
    aiayn.json, Hugging Face's generation config); what it cannot serve is refused in one line.
    Before, both exited 0 and the served model ran beam search."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")
    ct2 = tmp_path / "ct2"
    export(tiny_run, data_root, f"ckpt={tiny_run.last}", "format=ctranslate2", f"out={ct2}", "decoding.sampling=true",
           "decoding.top_k=5", "decoding.seed=2")
    recorded = json.loads((ct2 / "aiayn.json").read_text())["decoding"]
    assert {key: recorded.get(key) for key in ("sampling", "top_k", "seed", "beam_size")} == {
        "sampling": True, "top_k": 5, "seed": 2, "beam_size": None}
    from aiayn.decoding.ctranslate2 import CTranslate2Translator

    served = CTranslate2Translator(ct2, threads=1)
    assert served.arguments["sampling_topk"] == 5 and served.arguments["beam_size"] == 1
    draws = [list(CTranslate2Translator(ct2, threads=1).stream([SENTENCES])) for _ in range(2)]
    assert draws[0] == draws[1]  # seeded

    hf = tmp_path / "hf"
    export(tiny_run, data_root, f"ckpt={tiny_run.last}", f"out={hf}", "decoding.nbest=3", "decoding.stop=first_k",
           "decoding.min_len=3")
    generation = json.loads((hf / "generation_config.json").read_text())
    assert (generation["num_return_sequences"], generation["num_beams"], generation["early_stopping"],
            generation["min_new_tokens"]) == (3, 4, True, 3)
    marian = transformers.MarianMTModel.from_pretrained(str(hf))
    batch = transformers.MarianTokenizer.from_pretrained(str(hf))(SENTENCES[:2], return_tensors="pt", padding=True)
    generated = marian.generate(**batch, max_new_tokens=5)
    assert generated.size(0) == 6 and (generated[:, 1:4] != marian.config.eos_token_id).all()  # 3 an input, 3 tokens at least
    refusals = {"decoding.max_len_offset=9": "decoding.max_len_offset=9 (generate has one maximum length",
                "decoding.sampling=true decoding.seed=4": "decoding.seed=4 (a generation config holds no seed)"}
    for setting, refusal in refusals.items():
        result = export(tiny_run, data_root, f"ckpt={tiny_run.last}", f"out={tmp_path / 'refused'}",
                        *setting.split(), check=False)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"export.py: the Hugging Face export cannot serve {refusal}"), result.stderr
        assert not (tmp_path / "refused").exists()


def checkpoint_with(tiny_run: TrainedRun, folder: Path, **model_settings) -> Path:
    """The tiny run's last checkpoint rewritten as one of a model with ``model_settings`` (its own weights)."""
    checkpoint = read_checkpoint(tiny_run.last)
    hyper_parameters = dict(checkpoint["hyper_parameters"])
    hyper_parameters["model"] = {**hyper_parameters["model"], **model_settings}
    torch.manual_seed(0)
    module = TranslationModule(**module_arguments(hyper_parameters))
    path = folder / f"{'-'.join(model_settings)}.ckpt"
    torch.save({**checkpoint, "hyper_parameters": hyper_parameters, "state_dict": module.state_dict()}, path)
    return path


@pytest.mark.parametrize("case", ["learned positions", "format", "quantization for hf",
                                  "out is a file", "average_last"])
def test_bad_export_is_one_line_and_writes_nothing(case, tiny_run, data_root, tmp_path):
    out = tmp_path / "out"
    refused = {"learned positions": {"positional": "learned"}}
    ckpt = checkpoint_with(tiny_run, tmp_path, **refused[case]) if case in refused else None
    arguments, expected = {
        "learned positions": ([f"ckpt={ckpt}"],
                              "was trained with model.positional=learned; MarianMT recomputes fixed sinusoids"),
        "format": ([f"ckpt={tiny_run.last}", "format=onnx"], "format=onnx is not one of hf, ctranslate2"),
        "quantization for hf": ([f"ckpt={tiny_run.last}", "quantization=int8"],
                                "quantization=int8 is for format=ctranslate2 only"),
        "out is a file": ([f"ckpt={tiny_run.last}"], "is a file; give a folder to export into"),
        "average_last": ([f"ckpt={tiny_run.last}", "average_last=0"], "average_last must be a whole number"),
    }[case]
    if case == "out is a file":
        out.write_text("keep me")
    result = export(tiny_run, data_root, *arguments, f"out={out}", check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("export.py: ") and expected in lines[0]
    assert (out.read_text() == "keep me") if case == "out is a file" else not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no scratch folder


@pytest.mark.slow
def test_translate_engine_settings_are_checked(tiny_run, data_root, tmp_path):
    cases = {
        ("engine=ctranslate2",): "engine=ctranslate2 needs model_dir=<folder>",
        ("engine=ctranslate2", f"model_dir={tmp_path / 'none'}"): "no such folder",
        ("engine=ctranslate2", f"model_dir={tmp_path}", f"ckpt={tiny_run.last}"): "is for engine=aiayn",
        (f"ckpt={tiny_run.last}", f"model_dir={tmp_path}"): "is for engine=ctranslate2",
        ("engine=onnx", f"ckpt={tiny_run.last}"): "engine=onnx is not one of aiayn, ctranslate2",
        ("engine=ctranslate2", f"model_dir={tmp_path}"): "not a CTranslate2 export of aiayn",
        ("engine=ctranslate2", f"model_dir={tmp_path}", "onednn=true"): "precision, int8, compile, onednn and onnxruntime are aiayn's",
        ("engine=ctranslate2", f"model_dir={tmp_path}", "average_last=2"): (
            "average_last=2 averages checkpoints, which engine=ctranslate2 cannot: export an average instead"),
    }
    for arguments, expected in cases.items():
        result = run_tool("src/translate.py", *arguments, stdin="A dog.\n", data_root=data_root, check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], (arguments, result.stderr)
        assert result.stdout == ""


def test_export_help_names_the_formats():
    result = run_tool("src/export.py", "--help")  # needs no checkpoint
    assert result.stdout.startswith("export.py: export a checkpoint")
    assert "format=hf|ctranslate2" in result.stdout and "quantization: null" in result.stdout
