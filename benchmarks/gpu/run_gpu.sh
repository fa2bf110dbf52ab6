#!/usr/bin/env bash
# The measurements a GPU session runs: three commands, each well under the device tool's 10-minute limit
# (docs/measuring-on-gpus.md). Run from the repository root on the GPU machine, each as its own `run`
# (timeout_s 600), with $OUT set by the tool; the files under $OUT come back (at most 8 per command).
#
#   bash benchmarks/gpu/run_gpu.sh bench      # ~7.5 min: kernel tables + host costs   -> $OUT/<card>/ (7 files) + bench.log
#   bash benchmarks/gpu/run_gpu.sh eager      # ~7.5 min: kernel counts + e2e eager      -> $OUT/e2e-<card>-eager.yaml ...
#   bash benchmarks/gpu/run_gpu.sh compiled   # ~8 min:   e2e compiled + compiled counts -> $OUT/e2e-<card>-compiled.yaml ...
#
# Then, on the development machine: python3 benchmarks/gpu/install_results.py <files_at of each command>
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder whose files come back}"
card=$(python3 -c "import sys; sys.path.insert(0, '.'); import torch; from infersim.tabletools.bench.runner import hardware_card_for; print(hardware_card_for(torch.cuda.get_device_name(0)) or 'unknown-gpu')")
case "${1:-}" in
  bench)
    # the plan is ordered so that a run cut by its budget covers every family (docs/measuring-on-gpus.md)
    python3 -m infersim mfu bench --out "$OUT/$card" --time-budget 420 > "$OUT/bench.log" 2>&1 || true
    tail -n 25 "$OUT/bench.log"
    python3 -m infersim mfu compare "aiconfigurator/$card/trtllm-1.3.0rc20" "$OUT/$card" 2>&1 | head -n 40 || true
    ;;
  eager)
    timeout 120 python3 benchmarks/gpu/count_eager_ops.py --out "$OUT" > "$OUT/counts.log" 2>&1 || true
    tail -n 12 "$OUT/counts.log"
    python3 benchmarks/gpu/measure_e2e.py --mode eager --out "$OUT" --budget 400
    ;;
  compiled)
    python3 benchmarks/gpu/measure_e2e.py --mode compiled --out "$OUT" --budget 360
    timeout 100 python3 benchmarks/gpu/count_eager_ops.py --compiled --models llama-3.1-70b --out "$OUT" \
      > "$OUT/counts-compiled.log" 2>&1 || true
    tail -n 4 "$OUT/counts-compiled.log"
    ;;
  *)
    echo "usage: OUT=... bash benchmarks/gpu/run_gpu.sh bench|eager|compiled" >&2
    exit 2
    ;;
esac
