#!/usr/bin/env bash
# Per-SASS-instruction profile of one kernel (ncu's source page), for where a kernel's issue
# slots and stalls go. Usage (after the in-place build; results in $OUT):
#   scripts/profile_source.sh NAME KERNEL_REGEX python3 -m scripts.profile_attention cora 128 4 bwd
# Writes $OUT/NAME_sass.csv (one row per instruction: executed count, stall samples by reason).
set -uo pipefail
name=$1; kre=$2; shift 2
rep=/tmp/$name
timeout 300 ncu --clock-control none --set full --import-source no -k "regex:$kre" --launch-skip 2 \
  --launch-count 1 -f -o "$rep" "$@" > "$OUT/${name}_ncu.log" 2>&1 || tail -5 "$OUT/${name}_ncu.log"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
ncu -i "$rep.ncu-rep" --page details --csv > "$OUT/${name}_details.csv" 2>&1
wc -l "$OUT/${name}_sass.csv"
