"""Draw a trained model's attention maps (the paper's Figures 3–5) for one sentence:
`python src/visualize.py ckpt=<checkpoint> [text="A man is riding a bike."] [out=<dir>]`.

Translates the sentence with the checkpoint's beam-search settings, writes one PNG per layer
and kind (encoder self-attention, decoder self-attention, encoder-decoder attention) into
``out`` (default ``<run>/attention/<checkpoint>_<sentence>``: beside the pictures training drew, which
it leaves as they are) and prints their paths, one a line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from aiayn.checkpoints.given import one_checkpoint
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reports_composition_errors, reports_errors
from aiayn.cli.naming import CONFIG_DIR, tool_command
from aiayn.cli.outputs import output_folder
from aiayn.decoding.settings import Decoding, asked
from aiayn.decoding.switches import check_device
from aiayn.errors import ConfigError, DataError


@read_by_hydra("visualize")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="visualize")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    if not cfg.ckpt:
        raise ConfigError(f"no checkpoint given; run it as `{tool_command()} ckpt=<checkpoint file>`")
    if not str(cfg.text).strip():
        raise ConfigError("text is empty: give the sentence to draw, text='A man is riding a bike.'")
    positions = cfg.positional_encoding_positions
    if positions < 1:
        raise ConfigError(f"positional_encoding_positions must be a positive whole number, got {positions!r}")
    check_device(cfg.device)
    if cfg.out and Path(cfg.out).exists() and not Path(cfg.out).is_dir():
        raise ConfigError(f"out={cfg.out} is a file; give a folder for the pictures")
    wanted = asked(cfg.decoding)  # checked before anything is loaded
    if (wanted.values.get("nbest") or 1) > 1:  # refused, not ignored: one picture is of one translation
        raise ConfigError(f"decoding.nbest={wanted.values['nbest']}: visualize draws the attention of one translation, "
                          "the best; leave decoding.nbest out")
    ckpt = Path(one_checkpoint(cfg.ckpt)).absolute()
    if not ckpt.is_file():  # before the slow imports (matplotlib)
        from aiayn.checkpoints.io import folder_given, not_found

        raise DataError(f"ckpt={folder_given(ckpt)}" if ckpt.is_dir() else not_found(ckpt))
    from aiayn.analysis import attention_maps, draw_attention, draw_positional_encoding
    from aiayn.checkpoints.layout import run_dir_of
    from aiayn.checkpoints.trained import load_trained

    out = Path(cfg.out) if cfg.out else _default_out(run_dir_of(ckpt.resolve()), ckpt, str(cfg.text))
    output_folder(out, "out" if cfg.out else "the default out", fix="give out=<a folder you can write in>")
    trained = load_trained(ckpt, map_location=cfg.device)
    decoding = Decoding.of(trained.decoding, wanted, where="the checkpoint's decoding.")
    constraint = trained.output_constraint(decoding)  # a parser's: its text read, and its tree written, as translate's
    maps = attention_maps(trained.model, trained.vocab, str(cfg.text), decoding, constraint, trained.raw_text(constraint))
    paths = draw_attention(maps, out)
    if cfg.positional_encoding:
        paths.append(draw_positional_encoding(trained.model.d_model, cfg.positional_encoding_positions,
                                              out / "positional_encoding.png"))
    print(f"{maps.source} → {maps.translation or '(empty translation)'}", file=sys.stderr)
    for path in paths:
        print(path)


def _default_out(run_dir: Path, ckpt: Path, text: str) -> Path:
    """``<run>/attention/<checkpoint>_<sentence>`` (``attention/step0000004_two-dogs-play-in-the-snow``;
    ``last.ckpt`` by the step it names): beside the pictures training drew at its end, in
    ``attention/``, which it leaves as they are, and apart from those of another sentence or step
    (before: ``attention/`` itself, whose pictures of the run were written over without a word)."""
    words = re.sub(r"[^\w]+", "-", text.lower()).strip("-_")[:60].rstrip("-_") or "sentence"
    return run_dir / "attention" / f"{ckpt.resolve().stem}_{words}"


if __name__ == "__main__":
    main()
