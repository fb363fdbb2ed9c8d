/**
 * `kode doctor --json`: running it and turning its report into the lines of the Kode
 * output and one summary (no `vscode` here, so the tests run under plain node).
 *
 * The report is a JSON list of `{name, status: OK|WARN|FAIL, detail, fix}` on stdout; the
 * progress ("kode doctor: <step>") goes to stderr; exit status 1 when a check failed.
 */

import { spawn } from "node:child_process";

export const DOCTOR_ARGS = ["doctor", "--json"] as const;

export type CheckStatus = "OK" | "WARN" | "FAIL";

export interface Check {
  name: string;
  status: CheckStatus;
  detail: string;
  fix: string | null;
}

/** How a run of `kode doctor` ended. */
export interface DoctorRun {
  /** The exit status; null when it was killed (see `signal`) or never started. */
  code: number | null;
  signal?: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** It could not be started (ENOENT, EACCES): the spawn error. */
  error?: NodeJS.ErrnoException;
  cancelled?: boolean;
}

export type Level = "info" | "warn" | "error";

export interface DoctorReport {
  /** For the output channel: one line per check, each fix on a line below it. */
  lines: { level: Level; text: string }[];
  /** For the notification. */
  summary: string;
  severity: Level;
  checks: Check[];
}

const STATUSES: readonly string[] = ["OK", "WARN", "FAIL"];
const LEVELS: Record<CheckStatus, Level> = { OK: "info", WARN: "warn", FAIL: "error" };

function isCheck(value: unknown): value is Check {
  if (typeof value !== "object" || value === null) {
    return false;
  }
  const v = value as Record<string, unknown>;
  return (
    typeof v.name === "string" &&
    typeof v.status === "string" &&
    STATUSES.includes(v.status) &&
    typeof v.detail === "string" &&
    (v.fix === null || v.fix === undefined || typeof v.fix === "string")
  );
}

/** The checks in `stdout`, or a sentence saying why it is no report. */
export function parseChecks(stdout: string): Check[] | string {
  let value: unknown;
  try {
    value = JSON.parse(stdout);
  } catch {
    return stdout.trim() === "" ? "it printed no report" : "its output is not JSON";
  }
  if (!Array.isArray(value) || value.length === 0) {
    return "its output is not a list of checks";
  }
  const bad = value.findIndex((item) => !isCheck(item));
  if (bad >= 0) {
    return `check ${bad + 1} of its output is not {name, status: OK|WARN|FAIL, detail, fix}`;
  }
  return (value as Check[]).map((c) => ({ name: c.name, status: c.status, detail: c.detail, fix: c.fix ?? null }));
}

function lastLines(text: string, count = 8): string[] {
  return text
    .split(/\r?\n/)
    .map((line) => line.trimEnd())
    .filter((line) => line !== "")
    .slice(-count);
}

function plural(count: number, word: string): string {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

/** What to show for a run of `<command> doctor --json`. */
export function doctorReport(run: DoctorRun, command = "kode"): DoctorReport {
  const shown = `${command} ${DOCTOR_ARGS.join(" ")}`;
  const failed = (why: string): DoctorReport => ({
    lines: [
      { level: "error", text: `${shown}: ${why}` },
      ...lastLines(run.stderr).map((text) => ({ level: "error" as const, text: `  ${text}` })),
    ],
    summary: `Kode: kode doctor failed: ${why}.`,
    severity: "error",
    checks: [],
  });
  if (run.cancelled) {
    return { lines: [{ level: "info", text: `${shown}: cancelled` }], summary: "Kode: kode doctor cancelled.", severity: "info", checks: [] };
  }
  if (run.error) {
    return failed(`could not be started (${run.error.code ?? run.error.message})`);
  }
  const checks = parseChecks(run.stdout);
  if (typeof checks === "string") {
    const ended =
      run.code !== null ? `exit status ${run.code}` : `killed by ${run.signal ?? "a signal"}`;
    // An old kode without the command: argparse says "invalid choice" on stderr.
    const old = /invalid choice: 'doctor'/.test(run.stderr) ? "; this kode is older than `kode doctor`" : "";
    return failed(`${checks} (${ended})${old}`);
  }
  const lines: DoctorReport["lines"] = [];
  for (const check of checks) {
    const level = LEVELS[check.status];
    lines.push({ level, text: `${check.status.padEnd(4)}  ${check.name}: ${check.detail}` });
    if (check.fix) {
      lines.push({ level, text: `      fix: ${check.fix}` });
    }
  }
  const fails = checks.filter((c) => c.status === "FAIL");
  const warns = checks.filter((c) => c.status === "WARN");
  const names = (list: Check[]): string => list.map((c) => c.name).join(", ");
  let summary: string;
  let severity: Level;
  if (fails.length > 0) {
    const also = warns.length > 0 ? `; ${plural(warns.length, "warning")} (${names(warns)})` : "";
    summary = `Kode setup: ${plural(fails.length, "problem")} (${names(fails)})${also}. The fixes are in the Kode output.`;
    severity = "error";
  } else if (warns.length > 0) {
    summary = `Kode setup: ${plural(warns.length, "warning")} (${names(warns)}). The fixes are in the Kode output.`;
    severity = "warn";
  } else {
    summary = `Kode setup: all ${plural(checks.length, "check")} OK.`;
    severity = "info";
  }
  lines.push({ level: severity, text: summary });
  return { lines, summary, severity, checks };
}

/** The step named on a stderr line ("kode doctor: the load on the machine"), if any. */
export function progressStep(line: string): string | undefined {
  const match = /^kode doctor: (.+)$/.exec(line.trim());
  return match?.[1];
}

export interface RunOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** Each step `kode doctor` announces on stderr. */
  onStep?: (step: string) => void;
  /** Aborting kills the process; the run ends with `cancelled`. */
  signal?: AbortSignal;
}

/** Runs `<executable> doctor --json [extra...]`; never rejects. */
export function runDoctor(executable: string, extra: readonly string[] = [], options: RunOptions = {}): Promise<DoctorRun> {
  return new Promise((resolve) => {
    let stdout = "";
    let stderr = "";
    let pending = "";
    let settled = false;
    const done = (run: DoctorRun): void => {
      if (!settled) {
        settled = true;
        resolve(run);
      }
    };
    if (options.signal?.aborted) {
      done({ code: null, stdout, stderr, cancelled: true });
      return;
    }
    const child = spawn(executable, [...DOCTOR_ARGS, ...extra], {
      cwd: options.cwd,
      env: options.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const onAbort = (): void => {
      child.kill();
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => {
      stdout += chunk;
    });
    child.stderr.on("data", (chunk: string) => {
      stderr += chunk;
      pending += chunk;
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) {
        const step = progressStep(line);
        if (step !== undefined) {
          options.onStep?.(step);
        }
      }
    });
    child.on("error", (error: NodeJS.ErrnoException) => {
      options.signal?.removeEventListener("abort", onAbort);
      done({ code: null, stdout, stderr, error });
    });
    child.on("close", (code, signal) => {
      options.signal?.removeEventListener("abort", onAbort);
      done({ code, signal, stdout, stderr, cancelled: options.signal?.aborted === true });
    });
  });
}
