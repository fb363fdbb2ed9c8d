/**
 * "Install the Kode server": the installer (editors/install/kode_install.py) run with a
 * Python found here, into the extension's global storage, under a cancellable progress
 * notification, its whole output in the Kode output. Also which server to start, and the
 * offer to update one whose version differs from the extension's.
 */

import * as os from "node:os";
import * as path from "node:path";

import * as vscode from "vscode";

import { notFoundMessage } from "./common/executable";
import {
  findBundle,
  findPython,
  installedKode,
  installOutcome,
  ProgressText,
  PYTHON_NAMES,
  runInstaller,
  serverCommand,
  versionMismatch,
} from "./common/install";
import * as settings from "./settings";

export const INSTALL = "Install the Kode Server";
export const UPDATE = "Update the Server";
const OPEN_SETTINGS = "Open Settings";
const SHOW_OUTPUT = "Show Output";
const COPY = "Copy the Command";

interface PythonApi {
  environments?: {
    getActiveEnvironmentPath?(resource?: vscode.Uri): { path: string } | undefined;
    resolveEnvironment?(env: { path: string } | string): Promise<{ executable?: { uri?: vscode.Uri } } | undefined>;
  };
  /** The older API (before `environments`). */
  settings?: {
    getExecutionDetails?(resource?: vscode.Uri): { execCommand?: string[] } | undefined;
  };
}

/**
 * The interpreter selected in the Python extension (`ms-python.python`), if it is
 * installed; any failure of its API counts as none.
 */
async function pythonExtensionInterpreter(): Promise<string | undefined> {
  try {
    const extension = vscode.extensions.getExtension<PythonApi>("ms-python.python");
    if (!extension) {
      return undefined;
    }
    const api = extension.isActive ? extension.exports : await extension.activate();
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri;
    const active = api.environments?.getActiveEnvironmentPath?.(folder);
    if (!active) {
      return api.settings?.getExecutionDetails?.(folder)?.execCommand?.[0];
    }
    const resolved = await api.environments?.resolveEnvironment?.(active);
    return resolved?.executable?.uri?.fsPath ?? active.path;
  } catch {
    return undefined;
  }
}

export class ServerInstaller {
  private running: Promise<string | undefined> | undefined;

  /**
   * @param installed called once a server was installed (the extension restarts its
   *   server: the installed one is then found, no reload needed)
   */
  constructor(
    private readonly context: vscode.ExtensionContext,
    private readonly output: vscode.LogOutputChannel,
    private readonly installed: () => Promise<void>,
  ) {}

  /** The folder the server is installed into. */
  get target(): string {
    return path.join(this.context.globalStorageUri.fsPath, "server");
  }

  private get extensionVersion(): string {
    return (this.context.extension.packageJSON as { version: string }).version;
  }

  /** The server command to start (see `serverCommand`) and where it comes from. */
  command(): { command: string; origin: string } {
    const configured = settings.configuredServerPath();
    const installed = installedKode(this.target);
    const command = serverCommand(configured, installed);
    if (configured !== undefined) {
      return { command, origin: `kode.serverPath from ${settings.serverPathOrigin()}` };
    }
    if (command === installed) {
      return { command, origin: "installed from VS Code (Kode: Install the Kode Server)" };
    }
    return { command, origin: `on PATH: ${settings.serverPathOrigin()}` };
  }

  /** No server was found: say so, and offer to install one unless a path was set. */
  async notFound(command: string): Promise<void> {
    const configured = settings.configuredServerPath() !== undefined;
    const message = notFoundMessage(command, !configured);
    this.output.error(message);
    const choice = await vscode.window.showErrorMessage(message, ...(configured ? [] : [INSTALL]), OPEN_SETTINGS);
    if (choice === INSTALL) {
      await this.install();
    } else if (choice === OPEN_SETTINGS) {
      await vscode.commands.executeCommand("workbench.action.openSettings", "kode.serverPath");
    }
  }

  /** The server started: name a version other than the extension's, with an update. */
  async started(executable: string, version: string | undefined): Promise<void> {
    const mismatch = versionMismatch(version, this.extensionVersion);
    if (mismatch === undefined) {
      return;
    }
    this.output.warn(`${mismatch} (${executable})`);
    const configured = settings.configuredServerPath() !== undefined;
    const action = configured ? OPEN_SETTINGS : UPDATE;
    const hint = configured ? " kode.serverPath names it." : "";
    const choice = await vscode.window.showWarningMessage(`${mismatch}${hint}`, action);
    if (choice === UPDATE) {
      await this.install();
    } else if (choice === OPEN_SETTINGS) {
      await vscode.commands.executeCommand("workbench.action.openSettings", "kode.serverPath");
    }
  }

  /**
   * Installs (or updates, or resumes) the server; resolves to the installed kode, or
   * undefined when it was not installed (the notification said why). One at a time.
   */
  install(): Promise<string | undefined> {
    this.running ??= this.run().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async run(): Promise<string | undefined> {
    const bundle = findBundle(this.context.extensionPath);
    if (!bundle) {
      void vscode.window.showErrorMessage("Kode: this build of the extension carries no Kode server to install (npm run package makes one).");
      return undefined;
    }
    const preferred = await pythonExtensionInterpreter();
    const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? os.homedir();
    const python = await findPython(preferred ? [preferred] : [], process.env, cwd);
    if (!python) {
      const looked = [preferred ? "the Python extension's interpreter" : undefined, ...PYTHON_NAMES].filter(Boolean).join(", ");
      const message = `Kode: no Python found to install the server with (looked for ${looked} on PATH): install Python 3.11 or newer.`;
      this.output.error(message);
      void vscode.window.showErrorMessage(message);
      return undefined;
    }
    const { script, source } = bundle;
    this.output.info(`installing the Kode server: ${python.executable} ${script} ${this.target} ${source}`);
    const text = new ProgressText();
    const run = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: "Kode: installing the server", cancellable: true },
      (progress, token) => {
        const abort = new AbortController();
        const listener = token.onCancellationRequested(() => {
          abort.abort();
        });
        return runInstaller({
          python: python.executable,
          script,
          target: this.target,
          source,
          signal: abort.signal,
          onEvent: (event) => {
            const shown = text.update(event);
            if (shown) {
              progress.report(shown);
            }
            if (event.event === "step" || event.event === "skip") {
              this.output.info(`[install] ${event.event === "skip" ? "done already: " : ""}${shown?.message ?? ""}`);
            }
          },
          onOutput: (line) => {
            this.output.info(`[install] ${line}`);
          },
        }).finally(() => {
          listener.dispose();
        });
      },
    );
    const outcome = installOutcome(run, python.executable);
    if (run.error?.message) {
      this.output.error(`[install] ${run.error.message}${run.error.fix ? `\n  fix: ${run.error.fix}` : ""}`);
    }
    this.output[outcome.severity](outcome.message);
    if (outcome.severity === "info") {
      const again = run.cancelled ? [INSTALL] : [];
      void vscode.window.showInformationMessage(outcome.message, ...again).then((choice) => {
        if (choice === INSTALL) {
          void this.install();
        }
      });
    } else {
      void vscode.window.showErrorMessage(outcome.message, ...(outcome.fix ? [COPY] : []), SHOW_OUTPUT).then((choice) => {
        if (choice === COPY && outcome.fix) {
          void vscode.env.clipboard.writeText(outcome.fix);
        } else if (choice === SHOW_OUTPUT) {
          this.output.show();
        }
      });
    }
    if (run.done) {
      await this.installed();
    }
    return run.done?.kode;
  }
}
