"""Predicted vs measured on the public measurements shipped in infersim/validate/public/validation.yaml.

    python benchmarks/validate_reference.py [--format json] [--mfu-tables DIR] [--reference PATH]

The same as `python -m infersim validate`: kernel points (DeepGEMM FP8 GEMMs, DeepEP dispatch and
combine on H800), stage points (SGLang DeepSeek-R1 on H20 and GB200) and serving points
(TensorRT-LLM offline max-load, MLPerf v4.1; these need the request-level simulator, infersim.serve).
The mapping of points to runs is infersim/validate/points.yaml. Target: median |error|
<= 15% over the expressed points, none above 50%, no real deployment refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.cli.main import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["validate", *sys.argv[1:]]))
