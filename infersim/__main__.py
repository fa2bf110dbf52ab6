"""`python -m infersim`: the command line (infersim.cli)."""

import sys

from infersim.cli import main

sys.exit(main())
