#!/usr/bin/env bash
# Copies a comparison's finished phase records (kilobytes each) from its run folder into results/, where they
# are committed as they finish: `--resume` reads them back in another session (docs/results.md, the reviewed
# protocol), and the comparison's tables and plots once it has finished (experiments/comparison_summary.py reads
# them). Usage: bash experiments/publish_phases.sh NAME [RUNS_FOLDER]
set -euo pipefail
name="$1"
run="${2:-runs}/$name"
out="results/compare-reference-recipes/$name"
[ -f "$run/config.json" ] || { echo "error: no comparison run at $run (no config.json there)" >&2; exit 1; }
mkdir -p "$out/checkpoints"
shopt -s nullglob
# The run folder's own files: config.json, and once the comparison has finished its tables, CSVs, summary.json,
# curves and plots (megabytes in all; the checkpoints and TensorBoard folders stay behind).
for file in "$run"/*; do if [ -f "$file" ]; then cp "$file" "$out/"; fi; done
records=("$run"/checkpoints/*.json)
for record in "${records[@]}"; do cp "$record" "$out/checkpoints/"; done
echo "${#records[@]} phase records of $name in $out"
