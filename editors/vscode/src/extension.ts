/**
 * Entry point: wires the server, the status bar and the commands together.
 *
 * extension.ts (commands, events) -> server.ts (language client) -> settings.ts (kode.*)
 */

import * as vscode from "vscode";

import { BACKENDS, type Backend } from "./common/settings";
import { runDoctorCommand } from "./doctor";
import { ServerInstaller } from "./install";
import { KodeServer, type ServerSource } from "./server";
import * as settings from "./settings";
import { StatusBar } from "./statusBar";

let server: KodeServer | undefined;

const BACKEND_DESCRIPTIONS: Record<Backend, string> = {
  local: "llama.cpp on this machine",
  remote: "the server in kode.remote.url (SGLang or OpenAI-compatible)",
  auto: "remote while it answers within its latency budget, else local",
};

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("Kode", { log: true });
  const status = new StatusBar();
  status.update({ enabled: settings.isEnabled() });

  let refresh: ReturnType<typeof setTimeout> | undefined;
  const refreshStats = (): void => {
    clearTimeout(refresh);
    refresh = setTimeout(() => {
      void server?.stats().then((stats) => {
        status.update({ stats });
      });
    }, 250);
  };

  // Installed from here, the server is started at once: no reload.
  const installer: ServerInstaller = new ServerInstaller(context, output, () => kode.restart());
  const source: ServerSource = {
    command: () => installer.command(),
    notFound: (command: string) => void installer.notFound(command),
    started: (executable: string, version: string | undefined) => void installer.started(executable, version),
  };
  const kode: KodeServer = new KodeServer(
    output,
    {
      stateChanged: (state) => {
        status.update({ state });
        if (state === "running") {
          refreshStats();
        }
      },
      completed: refreshStats,
    },
    source,
  );
  server = kode;

  const setEnabled = async (enabled: boolean): Promise<void> => {
    await settings.setEnabled(enabled);
    void vscode.window.setStatusBarMessage(`Kode: completions ${enabled ? "on" : "off"}`, 2000);
  };

  context.subscriptions.push(
    output,
    status,
    kode,
    { dispose: () => { clearTimeout(refresh); } },
    vscode.commands.registerCommand("kode.enable", () => setEnabled(true)),
    vscode.commands.registerCommand("kode.disable", () => setEnabled(false)),
    vscode.commands.registerCommand("kode.toggle", () => setEnabled(!settings.isEnabled())),
    vscode.commands.registerCommand("kode.selectBackend", async () => {
      const current = settings.backend();
      const picked = await vscode.window.showQuickPick(
        BACKENDS.map((name) => ({
          label: name,
          description: name === current ? "(current)" : "",
          detail: BACKEND_DESCRIPTIONS[name],
          backend: name,
        })),
        { title: "Kode: completion backend", placeHolder: `now: ${current}` },
      );
      if (picked) {
        await settings.setBackend(picked.backend);
      }
    }),
    vscode.commands.registerCommand("kode.restartServer", () => kode.restart()),
    vscode.commands.registerCommand("kode.showOutput", () => {
      output.show();
    }),
    vscode.commands.registerCommand("kode.doctor", () => runDoctorCommand(output, source)),
    vscode.commands.registerCommand("kode.installServer", () => installer.install()),
    vscode.commands.registerCommand("kode.dismiss", () => kode.dismiss()),
    vscode.commands.registerCommand("kode.closeSuggestWidget", () => kode.closeSuggestWidget()),
    vscode.commands.registerCommand("kode.acceptNextWord", () => kode.acceptNextWord()),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (!event.affectsConfiguration(settings.SECTION)) {
        return;
      }
      status.update({ enabled: settings.isEnabled() });
      if (settings.needsRestart(event)) {
        await kode.restart();
      } else if (settings.affectsServer(event)) {
        await kode.sendSettings();
        refreshStats();
      }
    }),
  );

  await kode.start();
}

export async function deactivate(): Promise<void> {
  await server?.stop();
  server = undefined;
}
