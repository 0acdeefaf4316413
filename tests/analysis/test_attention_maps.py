"""Attention maps (the paper's Figures 3–5) and their pictures: aiayn.analysis on a real subword
model of Multi30k lines, the end-of-training callback of src/train.py and src/visualize.py on a
real checkpoint (the session's `tiny_run`, tests/conftest.py: two layers, so six pictures), run in
this process (tests.helpers.inprocess)."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from aiayn.analysis import (
    AttentionMaps,
    attention_maps,
    draw_attention,
    draw_positional_encoding,
    paper_layer,
)
from aiayn.analysis.attention_maps import attention_figure_size
from aiayn.data.readers import read_lines
from aiayn.data.subwords import train_or_load
from aiayn.model import Transformer, beam_search
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

TEXT = "A man is riding a bike."
N_LAYERS, N_HEADS = 2, 5  # 5 heads: a grid of two rows with empty panels at the end
DECODING = {"beam_size": 2, "alpha": 0.6, "max_len_offset": 5}


def expected_names(n_layers: int) -> list[str]:
    return [f"{kind}_layer{layer}.png" for kind in ("encoder_self", "decoder_self", "cross")
            for layer in range(1, n_layers + 1)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory, data_root: Path):
    lines = [line for lang in ("en", "de") for line in read_lines(data_root / "multi30k" / f"train.{lang}.gz")[:1000]]
    return train_or_load(lines, 300, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model(vocab) -> Transformer:
    torch.manual_seed(0)
    return Transformer(vocab.vocab_size, vocab.vocab_size, n_layers=N_LAYERS, d_model=40, d_ff=64, n_heads=N_HEADS,
                       d_k=8, d_v=8, max_positions=64)


@pytest.fixture(scope="module")
def maps(model: Transformer, vocab) -> AttentionMaps:
    model.train()
    maps = attention_maps(model, vocab, TEXT, DECODING)
    assert model.training, "the model is left in the mode it was in"
    return maps


def test_maps_have_every_layer_head_and_token(maps: AttentionMaps, model: Transformer, vocab) -> None:
    src_ids = vocab.encode([TEXT])[0] + [vocab.eos_id]
    model.eval()
    hypothesis = beam_search(model, torch.tensor([src_ids]), bos_id=vocab.bos_id, eos_id=vocab.eos_id, **DECODING)[0]
    piece = vocab._sp.id_to_piece
    assert maps.src_pieces == [piece(i) for i in src_ids] and maps.src_pieces[-1] == "</s>"
    assert maps.tgt_pieces == ["<s>"] + [piece(i) for i in hypothesis]
    assert maps.source == TEXT and maps.translation == vocab.decode([hypothesis])[0]
    S, T = len(src_ids), len(hypothesis) + 1
    assert T >= 3, "a hypothesis of a few tokens, so that the causal mask is really tested"
    assert (maps.n_layers, maps.n_heads) == (N_LAYERS, N_HEADS)
    assert maps.encoder_self.shape == (N_LAYERS, N_HEADS, S, S)
    assert maps.decoder_self.shape == (N_LAYERS, N_HEADS, T, T)
    assert maps.cross.shape == (N_LAYERS, N_HEADS, T, S)
    for weights in (maps.encoder_self, maps.decoder_self, maps.cross):
        assert weights.dtype == torch.float32 and weights.device.type == "cpu"
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (maps.decoder_self.triu(diagonal=1) == 0).all(), "no position attends to a later one"
    assert (maps.decoder_self[..., torch.ones(T, T, dtype=torch.bool).tril()] > 0).all(), "and to every earlier one"
    assert not torch.equal(maps.encoder_self[0, 0], maps.encoder_self[0, 1]), "heads differ"


@pytest.mark.slow
def test_draw_attention_writes_one_picture_per_layer_and_kind(maps: AttentionMaps, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    paths = draw_attention(maps, tmp_path / "new" / "folder")
    assert [path.name for path in paths] == expected_names(N_LAYERS)
    assert sorted(p.name for p in (tmp_path / "new" / "folder").iterdir()) == sorted(expected_names(N_LAYERS))
    assert attention_figure_size(N_HEADS) == (1600, 860)
    for path in paths:
        assert path.stat().st_size > 10_000
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (1600, 860)
    assert all(attention_figure_size(h)[0] <= 1600 for h in range(1, 33))
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Figure], "no figure outlives its drawing"


def test_some_layers_are_drawn_when_asked_and_the_papers_is_the_next_to_last(maps: AttentionMaps,
                                                                              tmp_path: Path) -> None:
    assert [paper_layer(n) for n in (1, 2, 6, 8)] == [1, 1, 5, 7]
    paths = draw_attention(maps, tmp_path, layers=[N_LAYERS])
    assert [path.name for path in paths] == [name for name in expected_names(N_LAYERS)
                                              if name.endswith(f"layer{N_LAYERS}.png")]


def test_draw_positional_encoding_writes_one_png_where_asked(tmp_path: Path) -> None:
    path = draw_positional_encoding(64, 100, tmp_path / "pe" / "positional.png")
    assert path == tmp_path / "pe" / "positional.png" and path.stat().st_size > 10_000
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1000, 550)


# -- end to end: the callback of src/train.py and src/visualize.py on a real checkpoint ---------------

@pytest.fixture
def run_dir(tiny_run: TrainedRun) -> Path:
    """The session's tiny training run (read only): two layers, attention drawn at the end."""
    return tiny_run.run_dir


@pytest.mark.slow
def test_training_ends_by_drawing_the_papers_layer(run_dir: Path) -> None:
    """Two layers: the paper's "layer 5 of 6" is the next to last, layer 1: a picture of each kind."""
    pictures = sorted((run_dir / "attention").glob("*.png"))
    assert [p.name for p in pictures] == sorted(name for name in expected_names(2) if name.endswith("layer1.png"))
    assert all(p.stat().st_size > 10_000 for p in pictures)


@pytest.mark.slow
def test_visualize_draws_a_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    """A copy of the run's folder: the pictures go to <run>/attention/<checkpoint>_<sentence>, beside those
    training drew at its end, which stay as they were (before: into attention/ itself, over them)."""
    shutil.copytree(run_dir / "checkpoints", tmp_path / "run" / "checkpoints", symlinks=True)
    shutil.copytree(run_dir / "attention", tmp_path / "run" / "attention")
    drawn = {path.name: path.read_bytes() for path in (tmp_path / "run" / "attention").iterdir()}
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run_tool("src/visualize.py", f"ckpt={ckpt}", "text=Two dogs play in the snow.", "positional_encoding=true",
                      cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    out = tmp_path / "run" / "attention" / f"{ckpt.resolve().stem}_two-dogs-play-in-the-snow"
    assert ckpt.resolve().stem == "step0000004"  # last.ckpt names the newest step's file
    names = expected_names(2) + ["positional_encoding.png"]
    assert result.stdout.splitlines() == [str(out / name) for name in names]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert {path.name: path.read_bytes() for path in out.parent.iterdir() if path.is_file()} == drawn
    assert all((out / name).stat().st_size > 10_000 for name in names)
    assert "Two dogs play in the snow. → " in result.stderr
    assert list(cwd.iterdir()) == [], "Hydra writes nothing beside (no .hydra/, no log file)"


@pytest.mark.parametrize("ckpt", ["missing", "not given", "not a checkpoint"])
def test_visualize_without_a_checkpoint_says_so(ckpt: str, tmp_path: Path) -> None:
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    args = {"missing": [f"ckpt={tmp_path / 'nope.ckpt'}"], "not given": [],
            "not a checkpoint": [f"ckpt={tmp_path / 'text.ckpt'}"]}[ckpt]
    result = run_tool("src/visualize.py", *args, f"out={tmp_path / 'out'}", cwd=tmp_path, check=False, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("visualize.py: "), result.stderr
    expected = {"missing": "nope.ckpt: checkpoint not found", "not given": "ckpt=<checkpoint file>",
                "not a checkpoint": "text.ckpt: not a readable checkpoint"}[ckpt]
    assert expected in lines[0]
    assert not (tmp_path / "out").exists()
