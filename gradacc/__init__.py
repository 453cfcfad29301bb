"""gradacc: see, and trust, gradient accumulation."""

from gradacc.config import RunConfig, effective_batch
from gradacc.errors import GradaccError, RunFailed

__all__ = ["RunConfig", "GradaccError", "RunFailed", "effective_batch"]
__version__ = "0.1.0"
