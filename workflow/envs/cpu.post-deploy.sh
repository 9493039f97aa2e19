#!/usr/bin/env bash
# Run by Snakemake inside the environment of cpu.yaml right after conda created it.
set -euo pipefail
exec bash "$(dirname "$0")/install" cpu python
