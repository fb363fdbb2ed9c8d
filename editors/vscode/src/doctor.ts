/**
 * The `kode.doctor` command: runs `<the server> doctor --json` (the setup checks and
 * a timed tiny completion) under a cancellable progress notification, writes each check
 * with its fix to the Kode output and sums it up in a notification.
 */

import * as os from "node:os";

import * as vscode from "vscode";

import { doctorReport, runDoctor, type Level } from "./common/doctor";
import { resolveExecutable } from "./common/executable";
import type { ServerSource } from "./server";

const SHOW_OUTPUT = "Show Output";

function notify(severity: Level, message: string): Thenable<string | undefined> {
  if (severity === "error") {
    return vscode.window.showErrorMessage(message, SHOW_OUTPUT);
  }
  if (severity === "warn") {
    return vscode.window.showWarningMessage(message, SHOW_OUTPUT);
  }
  return vscode.window.showInformationMessage(message, SHOW_OUTPUT);
}

/**
 * Runs the check with the server `source` names and shows its result; resolves once the
 * notification is up. A missing server is the source's to report (with its install offer).
 */
export async function runDoctorCommand(
  output: vscode.LogOutputChannel,
  source: Pick<ServerSource, "command" | "notFound">,
): Promise<void> {
  const { command } = source.command();
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? os.homedir();
  const executable = resolveExecutable(command, process.env, cwd);
  if (executable === undefined) {
    source.notFound(command);
    return;
  }
  output.info(`${executable} doctor --json: checking the setup and timing a tiny completion`);
  const run = await vscode.window.withProgress(
    {
      location: vscode.ProgressLocation.Notification,
      title: "Kode: checking the setup (kode doctor)",
      cancellable: true,
    },
    (progress, token) => {
      const abort = new AbortController();
      const listener = token.onCancellationRequested(() => {
        abort.abort();
      });
      return runDoctor(executable, [], {
        cwd,
        signal: abort.signal,
        onStep: (step) => {
          progress.report({ message: step });
        },
      }).finally(() => {
        listener.dispose();
      });
    },
  );
  if (run.error?.code === "ENOENT") {
    source.notFound(command);
    return;
  }
  const report = doctorReport(run, executable);
  for (const line of report.lines) {
    output[line.level](line.text);
  }
  if (run.cancelled) {
    return;
  }
  void notify(report.severity, report.summary).then((choice) => {
    if (choice === SHOW_OUTPUT) {
      output.show();
    }
  });
}
