"""The run's settings, below everything that uses them: the typed schemas of conf/ (schemas.py,
trainer.py; the other tools' in tools.py), where a run trains (hardware.py) and the plan settled
from both before anything is built (plan.py; resolved into the config by resolvers.py).

Importing this package registers what composing conf/ needs: the schemas in Hydra's ConfigStore and
the resolvers ``${aiayn.plan:}`` and ``${aiayn.gpus_per_node:}``. Nothing here imports training,
data or the model.
"""

from aiayn.config import identity, resolvers, schemas, tools  # noqa: F401  (registered on import)
