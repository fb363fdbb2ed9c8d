/**
 * The `kode.doctor` command: runs `<kode.serverPath> doctor --json` (the setup checks and
 * a timed tiny completion) under a cancellable progress notification, writes each check
 * with its fix to the Kode output and sums it up in a notification.
 */

import * as os from "node:os";

import * as vscode from "vscode";

import { doctorReport, runDoctor, type Level } from "./common/doctor";
import { notFoundMessage, resolveExecutable } from "./common/executable";
import * as settings from "./settings";

const SHOW_OUTPUT = "Show Output";
const OPEN_SETTINGS = "Open Settings";

function reportNotFound(command: string, output: vscode.LogOutputChannel): void {
  output.error(notFoundMessage(command));
  void vscode.window.showErrorMessage(notFoundMessage(command), OPEN_SETTINGS).then((choice) => {
    if (choice) {
      void vscode.commands.executeCommand("workbench.action.openSettings", "kode.serverPath");
    }
  });
}

function notify(severity: Level, message: string): Thenable<string | undefined> {
  if (severity === "error") {
    return vscode.window.showErrorMessage(message, SHOW_OUTPUT);
  }
  if (severity === "warn") {
    return vscode.window.showWarningMessage(message, SHOW_OUTPUT);
  }
  return vscode.window.showInformationMessage(message, SHOW_OUTPUT);
}

/** Runs the check and shows its result; resolves once the notification is up. */
export async function runDoctorCommand(output: vscode.LogOutputChannel): Promise<void> {
  const command = settings.serverPath();
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? os.homedir();
  const executable = resolveExecutable(command, process.env, cwd);
  if (executable === undefined) {
    reportNotFound(command, output);
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
    reportNotFound(command, output);
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
