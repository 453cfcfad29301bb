"""A rank of the app's launch (``python -m gradacc.training.run.rank CONFIG.json``) with one change: rank 1 fails at
its second optimizer step, as a rank that loses its device would. tests/training/test_fsdp.py launches it through gradacc.training.run.launch (accelerate launch, as the app
does); each process notes its pid in GRADACC_TEST_PIDS so the test can see that none is left.
"""

import os
import runpy
from pathlib import Path

from gradacc.training import distributed
from gradacc.training.backends import reporting

Path(os.environ["GRADACC_TEST_PIDS"], str(os.getpid())).touch()
if distributed.rank() == 1:
    reported = reporting.StepReporter.step

    def failing_step(self, window, *, step, **figures):
        if step == 2:
            raise RuntimeError("rank 1 lost its device")
        return reported(self, window, step=step, **figures)

    reporting.StepReporter.step = failing_step
runpy.run_module("gradacc.training.run.rank", run_name="__main__")
