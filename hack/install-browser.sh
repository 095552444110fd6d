#!/usr/bin/env bash
# Install (once) Debian's Chromium for the report's screenshot test
# (tests/unit/test_pipeline_report.py); prints the browser's path. Idempotent.
set -euo pipefail
# shellcheck source=hack/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
apt_install_missing chromium
command -v chromium
