"""gradacc: see, and trust, gradient accumulation.

The Python API, in full (docs/python-api.md): ``train(config, on_event)`` trains ``config`` (a ``RunConfig``)
and calls ``on_event`` with every event (``run_started``, ``step`` per optimizer step, ``eval`` per epoch,
``run_ended``) as it happens; it returns the ``run_ended`` event and never raises for bad input or a failed
run (``status`` and ``reason`` say what happened). Importing gradacc imports neither torch nor transformers.
"""

from gradacc.config import RunConfig
from gradacc.steps import effective_batch
from gradacc.errors import GradaccError, RunFailed

__all__ = ["RunConfig", "GradaccError", "RunFailed", "effective_batch", "train", "__version__"]
# The one version string: the package's metadata (pyproject.toml) and `gradacc --version` read it here.
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "train":
        # Only when asked for: the engine would add 50-57 ms to every `import gradacc` (27 ms without it; python
        # -X importtime, 3 tries, 2 busy cores), e.g. to each script `gradacc audit` runs, whose sitecustomize
        # needs none of it.
        from gradacc.training.run.engine import train

        return train
    raise AttributeError(f"module 'gradacc' has no attribute {name!r}")
