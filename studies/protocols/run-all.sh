#!/usr/bin/env bash
# Runs every group of the protocols study in order, two cells at a time; a rerun skips finished cells and resumes
# killed ones. Usage: bash studies/protocols/run-all.sh [OUT]   (default results/studies/protocols)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/studies/protocols}
for group in recurrent standard-t5 recurrent-fire recurrent-abacus-fire recurrent-abacus-k100 standard-fire recurrent-rope-budget \
             perplexity-nope-start perplexity-t5-init perplexity-t5-xt perplexity-small perplexity-t5-scaled; do
    posbench sweep "studies/protocols/$group.toml" --out "$out/$group" --jobs 2 || echo "group $group: exit $?"
done
