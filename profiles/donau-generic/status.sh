#!/usr/bin/env bash
# Snakemake cluster-generic status command for Donau: prints success | running | failed for a job id.
set -euo pipefail
jobid="$1"
state=$(djob "$jobid" 2>/dev/null | awk 'NR==2 {print $3}')
case "$state" in
  SUCCEEDED) echo success ;;
  FAILED|KILLED|STOPPED|ABNORMAL) echo failed ;;
  "") echo failed ;;
  *) echo running ;;
esac
