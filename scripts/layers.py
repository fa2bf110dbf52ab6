"""The package's layers, lowest first, each with its modules and their lines.

    python scripts/layers.py

The layers are the ones tests/test_package_structure.py holds the imports to (docs/architecture.md
shows this output, and its test keeps it current).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_package_structure import layer_table  # noqa: E402

if __name__ == "__main__":
    print(layer_table())
