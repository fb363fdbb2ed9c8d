/**
 * Installing the Kode server from VS Code: finding a Python, running the installer that
 * both editors share (editors/install/kode_install.py) and reading its JSON lines, and
 * which server to start. No `vscode` here, so the tests run under plain node.
 *
 * The installer makes `<target>/current/bin/kode` and marks it complete with
 * `<target>/current/kode-install.json`; its docstring describes the layout, the steps
 * and the lines it prints.
 */

import { execFile, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";

import { type Environment, resolveExecutable } from "./executable";

export const MIN_PYTHON = [3, 11] as const;

/** Looked up on PATH after the Python extension's interpreter: the newest first. */
export const PYTHON_NAMES = ["python3.13", "python3.12", "python3.11", "python3"] as const;

export interface Python {
  executable: string;
  version: [number, number, number];
}

export function isRecentEnough(version: readonly number[]): boolean {
  const [major = 0, minor = 0] = version;
  return major > MIN_PYTHON[0] || (major === MIN_PYTHON[0] && minor >= MIN_PYTHON[1]);
}

/** `executable`'s version, or undefined when it does not run (a pyenv shim without it). */
export function pythonVersion(executable: string): Promise<[number, number, number] | undefined> {
  return new Promise((resolve) => {
    execFile(
      executable,
      ["-c", "import sys; print('%d %d %d' % sys.version_info[:3])"],
      { timeout: 20_000 },
      (error, stdout) => {
        const parts = stdout.trim().split(" ").map(Number);
        resolve(!error && parts.length === 3 && parts.every(Number.isInteger) ? (parts as [number, number, number]) : undefined);
      },
    );
  });
}

/**
 * The Python to run the installer with: the first of `preferred` (the Python extension's
 * interpreter) and of PYTHON_NAMES on PATH that is 3.11 or newer; else the first that
 * runs at all, so that the installer itself says it is too old and how to get a newer
 * one; undefined when none runs.
 */
export async function findPython(
  preferred: readonly string[],
  env: Environment,
  cwd: string,
  version: (executable: string) => Promise<[number, number, number] | undefined> = pythonVersion,
): Promise<Python | undefined> {
  let fallback: Python | undefined;
  const seen = new Set<string>();
  for (const name of [...preferred, ...PYTHON_NAMES]) {
    const executable = resolveExecutable(name, env, cwd);
    if (executable === undefined || seen.has(executable)) {
      continue;
    }
    seen.add(executable);
    const found = await version(executable);
    if (found === undefined) {
      continue;
    }
    if (isRecentEnough(found)) {
      return { executable, version: found };
    }
    fallback ??= { executable, version: found };
  }
  return fallback;
}

/** A line the installer printed on stdout. */
export interface InstallEvent {
  event: "start" | "step" | "skip" | "progress" | "done" | "error" | "cancelled";
  step?: string;
  index?: number;
  total?: number;
  title?: string;
  message?: string;
  fraction?: number;
  /** The fraction of the whole install done. */
  overall?: number;
  fix?: string | null;
  log?: string | null;
  kode?: string;
  version?: string;
  seconds?: number;
}

const EVENTS: readonly string[] = ["start", "step", "skip", "progress", "done", "error", "cancelled"];

export function parseEvent(line: string): InstallEvent | undefined {
  try {
    const value = JSON.parse(line) as unknown;
    if (typeof value === "object" && value !== null && EVENTS.includes((value as { event?: string }).event ?? "")) {
      return value as InstallEvent;
    }
  } catch {
    // not a line of the installer's protocol
  }
  return undefined;
}

/** How a run of the installer ended. */
export interface InstallRun {
  code: number | null;
  /** The `done` line: `kode` is the server to start. */
  done?: InstallEvent;
  /** The `error` line: what failed and the command that fixes it. */
  error?: InstallEvent;
  cancelled: boolean;
  /** The Python could not be started. */
  spawnError?: NodeJS.ErrnoException;
}

export interface InstallOptions {
  python: string;
  script: string;
  target: string;
  source: string;
  onEvent?: (event: InstallEvent) => void;
  /** Each line the installer's commands print (pip, CMake, the model assembly). */
  onOutput?: (line: string) => void;
  /** Aborting sends SIGTERM: the installer stops its command and exits 130. */
  signal?: AbortSignal;
  env?: NodeJS.ProcessEnv;
}

function lines(onLine: (line: string) => void): (chunk: string) => void {
  let pending = "";
  return (chunk) => {
    const parts = (pending + chunk).split(/\r?\n|\r/);
    pending = parts.pop() ?? "";
    for (const part of parts) {
      if (part.trim() !== "") {
        onLine(part);
      }
    }
  };
}

/** Runs `<python> <script> <target> <source>` to its end; never rejects. */
export function runInstaller(options: InstallOptions): Promise<InstallRun> {
  return new Promise((resolve) => {
    const run: InstallRun = { code: null, cancelled: false };
    const child = spawn(options.python, [options.script, options.target, options.source], {
      env: options.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const onAbort = (): void => {
      child.kill("SIGTERM");
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    child.stdout.on(
      "data",
      lines((line) => {
        const event = parseEvent(line);
        if (event === undefined) {
          options.onOutput?.(line);
          return;
        }
        if (event.event === "done") {
          run.done = event;
        } else if (event.event === "error") {
          run.error = event;
        } else if (event.event === "cancelled") {
          run.cancelled = true;
        }
        options.onEvent?.(event);
      }),
    );
    child.stderr.on("data", lines((line) => options.onOutput?.(line)));
    let settled = false;
    const settle = (code: number | null): void => {
      if (!settled) {
        settled = true;
        options.signal?.removeEventListener("abort", onAbort);
        run.code = code;
        run.cancelled ||= options.signal?.aborted === true && !run.done;
        resolve(run);
      }
    };
    // A Python that cannot be started may never emit "close".
    child.once("error", (error: NodeJS.ErrnoException) => {
      run.spawnError = error;
      settle(null);
    });
    child.once("close", settle);
  });
}

/**
 * The installed server in `target`, or undefined: only a complete environment's (the
 * installer's `installed_kode`, the same rule).
 */
export function installedKode(target: string): string | undefined {
  const env = path.join(target, "current");
  const kode = path.join(env, "bin", "kode");
  try {
    fs.accessSync(path.join(env, "kode-install.json"));
    fs.accessSync(kode, fs.constants.X_OK);
    return kode;
  } catch {
    return undefined;
  }
}

/**
 * The server command: `kode.serverPath` where the user set it; else the server installed
 * from VS Code (the user chose it: it wins over an older `kode` on PATH); else `kode`
 * on PATH.
 */
export function serverCommand(configured: string | undefined, installed: string | undefined): string {
  return configured ?? installed ?? "kode";
}

/** What the extension carries to install: the installer and a Kode wheel. */
export interface Bundle {
  script: string;
  source: string;
}

/**
 * `npm run package` puts the installer and the Kode wheel in `dist/`. Run from a clone
 * (no `dist/`), the installer and the source folder of the repository serve instead.
 */
export function findBundle(extensionPath: string): Bundle | undefined {
  const dist = path.join(extensionPath, "dist");
  const wheels = fs.existsSync(dist) ? fs.readdirSync(dist).filter((name) => /^kode-.*\.whl$/.test(name)) : [];
  const script = path.join(dist, "install", "kode_install.py");
  if (wheels.length === 1 && fs.existsSync(script)) {
    return { script, source: path.join(dist, wheels[0] ?? "") };
  }
  const repository = path.resolve(extensionPath, "..", "..");
  const inRepository = path.join(repository, "editors", "install", "kode_install.py");
  if (fs.existsSync(inRepository) && fs.existsSync(path.join(repository, "pyproject.toml"))) {
    return { script: inRepository, source: repository };
  }
  return undefined;
}

/** Turns the installer's lines into a notification's message and percent increments. */
export class ProgressText {
  private done = 0;
  private title = "";

  /** `{ message, increment }` for `progress.report`, or undefined for a line to skip. */
  update(event: InstallEvent): { message: string; increment: number } | undefined {
    if (event.event === "step" || event.event === "skip") {
      this.title = `${event.index ?? "?"}/${event.total ?? "?"} ${event.title ?? event.step ?? ""}`;
    } else if (event.event !== "progress") {
      return undefined;
    }
    const overall = Math.round(100 * (event.overall ?? this.done / 100));
    const increment = Math.max(0, overall - this.done);
    this.done += increment;
    const detail = event.event === "progress" && event.message ? `: ${event.message}` : "";
    return { message: `${this.title}${detail}`, increment };
  }
}

function minutes(seconds: number): string {
  const whole = Math.round(seconds);
  return whole < 60 ? `${whole} s` : `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

/** The notification after a run: its text, its severity, and the command to copy. */
export function installOutcome(run: InstallRun, python: string): { message: string; severity: "info" | "error"; fix?: string } {
  if (run.done) {
    const took = run.done.seconds !== undefined ? ` in ${minutes(run.done.seconds)}` : "";
    return { message: `Kode: the server (Kode ${run.done.version ?? "?"}) is installed${took}.`, severity: "info" };
  }
  if (run.cancelled) {
    return { message: "Kode: the install was cancelled; install again to go on where it stopped.", severity: "info" };
  }
  if (run.spawnError) {
    return { message: `Kode: could not run ${python}: ${run.spawnError.message}`, severity: "error" };
  }
  if (run.error) {
    const fix = run.error.fix ?? undefined;
    const what = (run.error.message ?? "").split("\n")[0];
    const how = fix ? ` To fix it: ${fix}` : "";
    return { message: `Kode: the server could not be installed: ${what}.${how}`, severity: "error", ...(fix ? { fix } : {}) };
  }
  return { message: `Kode: the installer ended with exit status ${String(run.code)} (see the Kode output).`, severity: "error" };
}

/** Says that the server's version differs from the extension's, or undefined. */
export function versionMismatch(serverVersion: string | undefined, extensionVersion: string): string | undefined {
  if (serverVersion === undefined || serverVersion === extensionVersion) {
    return undefined;
  }
  return `Kode: the server is Kode ${serverVersion}, this extension Kode ${extensionVersion}.`;
}
