"""Translate text with a checkpoint: `python src/translate.py ckpt=<file> [input=...] [output=...]`.

One sentence a line in, one translation a line out, in the same order; an empty line gives an
empty line; a line longer than the model can read is truncated with a warning.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from aiayn.checkpoints.trained import load_trained
from aiayn.cli import CONFIG_DIR
from aiayn.cli.errors import check_decoding, reports_errors
from aiayn.data.readers import decode_lines, read_lines
from aiayn.inference import translate


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="translate")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = {key: cfg[key] for key in ("beam_size", "alpha", "max_len_offset", "kv_cache") if cfg[key] is not None}
    check_decoding({**settings, "batch_size": cfg.batch_size})
    trained = load_trained(cfg.ckpt, cfg.device)
    if cfg.input:
        lines = read_lines(cfg.input)
    else:
        lines = list(decode_lines(sys.stdin.buffer, "<stdin>"))
    result = translate(trained.model, trained.vocab, lines, batch_size=cfg.batch_size,
                       **{**trained.decoding, **settings})
    text = "".join(line + "\n" for line in result.texts)
    if cfg.output:
        Path(cfg.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    print(f"translated {len(lines)} lines in {result.seconds:.1f} s ({result.sentences_per_second:.1f} sentences/s)"
          + (f"; {result.truncated} truncated" if result.truncated else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
