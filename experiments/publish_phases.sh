#!/usr/bin/env bash
# Copies a comparison's finished phase records (kilobytes each) from its run folder into results/, where they
# are committed as they finish: `--resume` reads them back in another session (docs/results.md, the reviewed
# protocol). Usage: bash experiments/publish_phases.sh NAME [RUNS_FOLDER]
set -euo pipefail
name="$1"
run="${2:-runs}/$name"
out="results/compare-reference-recipes/$name"
mkdir -p "$out/checkpoints"
cp "$run/config.json" "$out/config.json"
shopt -s nullglob
records=("$run"/checkpoints/*.json)
for record in "${records[@]}"; do cp "$record" "$out/checkpoints/"; done
echo "${#records[@]} phase records of $name in $out"
