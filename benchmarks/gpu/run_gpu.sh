#!/usr/bin/env bash
# The measurements a GPU session runs, in one command (docs/measuring-on-gpus.md): kernel tables, the
# end-to-end validation points (eager and compiled) and two small traces, within 470 s of stages, so that the
# command ends within 8 minutes on one H200. Run from the repository root on the GPU machine:
#
#   OUT=/path/to/results bash benchmarks/gpu/run_gpu.sh all            # writes 5 files under $OUT
#   OUT=/tmp/smoke bash benchmarks/gpu/run_gpu.sh all --smoke          # the same pipeline on the CPU, tiny sizes
#
# Options after `all` go to benchmarks/gpu/run_all.py (--budget, --stages, --stage-budgets; --help lists them).
# Then, on the development machine: python3 benchmarks/gpu/install_results.py <the folder the files came back to>
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  all)
    shift
    : "${OUT:?set OUT to the folder the files go to}"
    exec python3 benchmarks/gpu/run_all.py all --out "$OUT" "$@"
    ;;
  *)
    echo "usage: OUT=... bash benchmarks/gpu/run_gpu.sh all [--smoke] [--budget SECONDS] [--stages ...]" >&2
    exit 2
    ;;
esac
