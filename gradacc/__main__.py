import sys

from gradacc.cli import main
from gradacc.training import distributed

code = main()
if distributed.world_size() > 1:  # a rank of accelerate launch / torchrun: out without the interpreter's teardown
    distributed.exit_rank(code)
sys.exit(code)
