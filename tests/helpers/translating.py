"""What the tests of translate.py and evaluate.py share: the decoding settings and sentences the
translate tests use on the session's tiny run, and evaluate.py run in this process with W&B off."""

from __future__ import annotations

from tests.helpers.inprocess import run_tool

# A length penalty this strong keeps the 4-step model from ending every translation at once (its
# translations with the task's α are all empty), so each line gets a translation of its own and a
# line in the wrong place shows; beam 1 keeps it quick. The CPU, as the reference is computed here.
SETTINGS = {"beam_size": 1, "alpha": 20.0, "max_len_offset": 5}
ARGUMENTS = [f"decoding.{key}={value}" for key, value in SETTINGS.items()] + ["device=cpu"]
SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow.", "A woman sings on a stage.",
             "A little girl in a pink dress climbs the stairs of a wooden house."]


def evaluate(*arguments: str, **options):
    """``src/evaluate.py`` with ``arguments`` and W&B off; options as run_tool's."""
    return run_tool("src/evaluate.py", *arguments, "wandb=disabled", **options)
