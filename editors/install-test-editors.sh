#!/usr/bin/env bash
# What the real-editor tests (pytest marker `editor`) need beyond Python: tmux, Chromium
# and libkrb5-dev (code-server's native modules) from Debian, about 1-2 minutes; Node 24
# and code-server from npm, about 7 minutes on 2 loaded cores (mostly compiling).
set -euo pipefail
cd "$(dirname "$0")/.."
apt=(apt-get); [ "$(id -u)" = 0 ] || apt=(sudo apt-get)
"${apt[@]}" update -qq
DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq tmux chromium libkrb5-dev
editors/vscode/e2e/install.sh
