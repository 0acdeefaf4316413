"""Export a checkpoint for the tools everyone serves with:
`python src/export.py ckpt=<file.ckpt> format=hf|ctranslate2 out=<folder> [average_last=k] [quantization=int8]`.

``format=hf`` writes a Hugging Face MarianMT folder (weights, tokenizer files, generation settings,
model card); ``format=ctranslate2`` converts that into a CTranslate2 model (``quantization=int8``:
8-bit weights). ``average_last=k`` exports the average of the checkpoint and the k - 1 before it by
step (§6.1). ``decoding.*`` over the checkpoint's own settings are what the export serves with
(the generation settings; the CTranslate2 model's ``aiayn.json``), as its engine serves them
(aiayn.decoding.declarations): a setting it cannot serve is refused, never dropped. A model
MarianMT cannot express (learned positions, heads not d_model / h wide, restricted attention), a
missing package or a bad setting is one line on stderr, exit 2, before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.given import averaged_count, one_checkpoint
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reports_composition_errors, reports_errors
from aiayn.cli.naming import CONFIG_DIR, tool_command
from aiayn.decoding.settings import Decoding, asked
from aiayn.errors import ConfigError

FORMATS = ("hf", "ctranslate2")


@read_by_hydra("export")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    for key in ("ckpt", "out"):
        if OmegaConf.is_missing(cfg, key) or cfg[key] in (None, ""):
            raise ConfigError(f"give {key}=...  (usage: {tool_command()} ckpt=<file.ckpt> format=hf out=<folder>)")
    if cfg.format not in FORMATS:
        raise ConfigError(f"format={cfg.format} is not one of {', '.join(FORMATS)}")
    if cfg.quantization is not None and cfg.format != "ctranslate2":
        raise ConfigError(f"quantization={cfg.quantization} is for format=ctranslate2 only; leave it out for "
                          f"format={cfg.format}")
    k = averaged_count(cfg.average_last)
    wanted = asked(cfg.decoding)  # checked before anything is loaded
    ckpt = Path(one_checkpoint(cfg.ckpt))
    if ckpt.is_dir():
        from aiayn.checkpoints.io import folder_given

        raise ConfigError(f"ckpt={folder_given(ckpt)}")

    from aiayn.checkpoints.averaging import average_into, window_ending_at
    from aiayn.checkpoints.trained import load_trained
    from aiayn.decoding.packages import require
    from aiayn.export.marian import check_expressible, check_the_papers_network

    # The export says what it wrote in one line; transformers' bars of writing and reading back a
    # model this size (a second each) say nothing more.
    require("transformers").utils.logging.disable_progress_bar()
    if cfg.format == "ctranslate2":
        require("ctranslate2")
    averaged = window_ending_at(ckpt, k)  # DataError: too few, before anything is loaded
    trained = load_trained(ckpt, "cpu")
    # What the export records and serves with, as its engine serves it.
    decoding = Decoding.of(trained.decoding, wanted, engine=f"{'hf' if cfg.format == 'hf' else 'ctranslate2'} export",
                           where="the checkpoint's decoding.")
    check_the_papers_network(trained.model, str(ckpt))  # not a model class of one's own (docs/extending.md)
    check_expressible(trained.model, str(ckpt))  # ConfigError naming the setting Marian cannot hold
    steps = average_into(trained, averaged)  # §6.1: the weights averaged over the k checkpoints ending at ckpt (or in it)
    if cfg.format == "hf":
        from aiayn.export.huggingface import export_huggingface

        out = export_huggingface(trained, Path(cfg.out), ckpt=ckpt, steps=steps, decoding=decoding)
    else:
        from aiayn.export.ctranslate2 import export_ctranslate2

        out = export_ctranslate2(trained, Path(cfg.out), ckpt=ckpt, steps=steps, quantization=cfg.quantization,
                                 decoding=decoding)
    what = f"step {steps[-1]}" + (f", averaged over steps {', '.join(map(str, steps))}" if len(steps) > 1 else "")
    print(f"exported {ckpt} ({what}) as {cfg.format}"
          + (f" ({cfg.quantization})" if cfg.quantization else "") + f" -> {out}")


if __name__ == "__main__":
    main()
