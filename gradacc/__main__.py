import sys

from gradacc.cli import main

sys.exit(main())
