/**
 * The `kode.*` configuration section: what goes to the server, what the extension keeps.
 */

import * as vscode from "vscode";

import { type Backend, type ServerSettings, toServerSettings, userValue } from "./common/settings";

export const SECTION = "kode";

function section(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION);
}

/**
 * The object sent as `initializationOptions` and in `workspace/didChangeConfiguration`:
 * only the keys the user set (`inspect`, not `get`, which would return package.json's
 * defaults and so override the server's own).
 */
export function serverSettings(): ServerSettings {
  const config = section();
  return toServerSettings((key) => userValue(config.inspect(key)));
}

/**
 * The server command (`kode.serverPath`, without the `lsp` argument) where the user set
 * it (any scope); undefined when not set (the installed server or `kode` on PATH, see
 * common/install.ts `serverCommand`).
 */
export function configuredServerPath(): string | undefined {
  const info = section().inspect<string>("serverPath");
  return info?.workspaceFolderValue ?? info?.workspaceValue ?? info?.globalValue;
}

/** Where the effective `kode.serverPath` comes from, for the log (see README: code-server). */
export function serverPathOrigin(): string {
  const info = section().inspect<string>("serverPath");
  if (info?.workspaceFolderValue !== undefined) {
    return "workspace folder settings";
  }
  if (info?.workspaceValue !== undefined) {
    return "workspace settings";
  }
  if (info?.globalValue !== undefined) {
    return "user settings";
  }
  return "the default (no kode.serverPath set where this extension host can see it)";
}

export function isEnabled(): boolean {
  return section().get<boolean>("enabled", true);
}

/** `kode.nextEdits`: the extension asks `kode/inlineEdit` only while it is on. */
export function nextEdits(): boolean {
  return section().get<boolean>("nextEdits", false);
}

export function backend(): string {
  return section().get<string>("backend", "local");
}

/** Whether a change needs a new server process rather than a settings notification. */
export function needsRestart(event: vscode.ConfigurationChangeEvent): boolean {
  return event.affectsConfiguration(`${SECTION}.serverPath`);
}

export function affectsServer(event: vscode.ConfigurationChangeEvent): boolean {
  return event.affectsConfiguration(SECTION) && !needsRestart(event);
}

/** Writes a setting where it currently takes effect (workspace if set there, else user). */
async function update(key: string, value: unknown): Promise<void> {
  const config = section();
  const info = config.inspect(key);
  const target =
    info?.workspaceValue !== undefined
      ? vscode.ConfigurationTarget.Workspace
      : vscode.ConfigurationTarget.Global;
  await config.update(key, value, target);
}

export function setEnabled(enabled: boolean): Promise<void> {
  return update("enabled", enabled);
}

export function setBackend(value: Backend): Promise<void> {
  return update("backend", value);
}

export function setNextEdits(on: boolean): Promise<void> {
  return update("nextEdits", on);
}
