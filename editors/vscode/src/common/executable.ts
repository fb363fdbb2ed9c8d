/**
 * Finding the `kode` executable before spawning it, so that a missing server is reported
 * as "not found, install it or set kode.serverPath" rather than as a bare ENOENT.
 */

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

export interface Environment {
  PATH?: string | undefined;
  PATHEXT?: string | undefined;
}

function isExecutableFile(file: string, platform: NodeJS.Platform): boolean {
  try {
    if (!fs.statSync(file).isFile()) {
      return false;
    }
    if (platform !== "win32") {
      fs.accessSync(file, fs.constants.X_OK);
    }
    return true;
  } catch {
    return false;
  }
}

/** `~/x` -> `$HOME/x`; other paths unchanged. */
export function expandHome(command: string): string {
  if (command === "~" || command.startsWith("~/")) {
    return path.join(os.homedir(), command.slice(1));
  }
  return command;
}

/**
 * The absolute path of `command`, or `undefined` when it cannot be run.
 *
 * A command with a directory part (`./venv/bin/kode`, `~/bin/kode`) is taken as a path,
 * relative ones against `cwd`; a bare name is looked up on `PATH` like a shell would.
 */
export function resolveExecutable(
  command: string,
  env: Environment,
  cwd: string,
  platform: NodeJS.Platform = process.platform,
): string | undefined {
  const expanded = expandHome(command.trim());
  if (expanded === "") {
    return undefined;
  }
  const extensions =
    platform === "win32" ? ["", ...(env.PATHEXT ?? ".EXE;.CMD;.BAT").split(";")] : [""];
  const hasDirectory = expanded.includes("/") || (platform === "win32" && expanded.includes("\\"));
  const candidates = hasDirectory
    ? [path.resolve(cwd, expanded)]
    : (env.PATH ?? "")
        .split(platform === "win32" ? ";" : ":")
        .filter((dir) => dir !== "")
        .map((dir) => path.join(dir, expanded));
  for (const candidate of candidates) {
    for (const ext of extensions) {
      if (isExecutableFile(candidate + ext, platform)) {
        return candidate + ext;
      }
    }
  }
  return undefined;
}

export function notFoundMessage(command: string, canInstall = false): string {
  const install = canInstall
    ? `Install it here ("Install the Kode Server": a Python 3.11+ and a C/C++ compiler, ` +
      `about 3.5 GB and, on 2 cores, 10 minutes, most of them building llama.cpp for this CPU), or `
    : `Install Kode into a Python environment (pip install <path to the kode repository>), then `;
  return (
    `Kode: the language server "${command}" was not found. ${install}` +
    `set "kode.serverPath" to its kode executable (e.g. /path/to/.venv/bin/kode) ` +
    `or put that directory on PATH.`
  );
}
