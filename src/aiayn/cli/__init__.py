"""The command-line tools: ``aiayn-train``, ``aiayn-prepare``, ``aiayn-evaluate``,
``aiayn-translate``, ``aiayn-average``, ``aiayn-visualize`` and ``aiayn-export`` (also
``python src/<name>.py``).

Each composes its Hydra config from the repository's ``conf/`` folder (or ``$AIAYN_CONFIG_DIR``),
reports the errors a user can fix as one line (:mod:`aiayn.cli.errors`) and has a ``--help`` of
its own (``conf/hydra/help/<tool>.yaml``, which uses the resolvers of :mod:`aiayn.cli.naming`).
"""

from __future__ import annotations

import aiayn.cli.naming  # the resolvers of the tools' --help pages and sweep folders (their names: there)
import aiayn.config  # noqa: F401  the schemas and resolvers conf/ composes with, for every tool
from aiayn.cli import run_folder  # noqa: F401  registers ${aiayn.new_run_dir:} (conf/train.yaml's run folder)
