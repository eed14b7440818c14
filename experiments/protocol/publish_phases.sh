#!/usr/bin/env bash
# Copies a comparison's finished phase records (kilobytes each) from its run folder into results/, where they
# are committed as they finish: `--resume` reads them back in another session (docs/results.md, the reviewed
# protocol), and the comparison's tables and plots once it has finished (experiments/protocol/comparison_summary.py reads
# them). Usage: bash experiments/protocol/publish_phases.sh NAME [RUNS_FOLDER]
# A seed group's run (NAME-seeds-A-B, experiments/protocol/rerun.sh) goes to results/.../NAME/seed-groups/seeds-A-B: its
# report records there, its tuning records (the whole task's) to the task's own checkpoints.
# NAME alone publishes its seed groups (runs/NAME-seeds-*) too, so one command serves a task run in groups.
set -euo pipefail
name="${1:?usage: bash experiments/protocol/publish_phases.sh NAME [RUNS_FOLDER]}"
run="${2:-runs}/$name"
if [[ ! "$name" =~ -seeds-[0-9]+-[0-9]+$ ]]; then
  shopt -s nullglob
  groups=("$run"-seeds-*-*/config.json)
  shopt -u nullglob
  published=0
  for group in "${groups[@]}"; do
    group="${group%/config.json}"
    [[ "${group##*/}" =~ ^$name-seeds-[0-9]+-[0-9]+$ ]] || continue  # not one of NAME's groups
    bash "$0" "${group##*/}" "${2:-runs}"
    published=$((published + 1))
  done
  [ "$published" -gt 0 ] && [ ! -f "$run/config.json" ] && exit 0  # the groups have not merged yet
fi
out="results/compare-reference-recipes/$name"
tuning="$out"
if [[ "$name" =~ ^(.+)-(seeds-[0-9]+-[0-9]+)$ ]]; then
  tuning="results/compare-reference-recipes/${BASH_REMATCH[1]}"
  out="$tuning/seed-groups/${BASH_REMATCH[2]}"
fi
[ -f "$run/config.json" ] || { echo "error: no comparison run at $run (no config.json there)" >&2; exit 1; }
mkdir -p "$out/checkpoints" "$tuning/checkpoints"
shopt -s nullglob
# The run folder's own files: config.json, and once the comparison has finished its tables, CSVs, summary.json,
# curves and plots (megabytes in all; the checkpoints and TensorBoard folders stay behind). A seed group's
# tables are those of a few seeds, written again for all of them by the merged comparison: its config.json and
# summary.json (which says it has finished) only.
files=("$run"/*)
[ "$out" = "$tuning" ] || files=("$run"/config.json "$run"/summary.json)
for file in "${files[@]}"; do if [ -f "$file" ]; then cp "$file" "$out/"; fi; done
records=("$run"/checkpoints/*.json)
for record in "${records[@]}"; do
  case "$record" in
    *-report.json) cp "$record" "$out/checkpoints/" ;;
    *) cp "$record" "$tuning/checkpoints/" ;;
  esac
done
where="$out"
[ "$out" = "$tuning" ] || where="$out (its tuning records in $tuning)"
echo "${#records[@]} phase records of $name in $where"
