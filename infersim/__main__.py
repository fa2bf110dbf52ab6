"""`python -m infersim`: the command line (infersim.cli.main)."""

import sys

from infersim.cli.main import main

sys.exit(main())
