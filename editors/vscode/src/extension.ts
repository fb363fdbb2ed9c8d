/**
 * Entry point: wires the server, the status bar and the commands together.
 *
 * extension.ts (commands, events) -> server.ts (language client) -> settings.ts (kode.*)
 */

import * as vscode from "vscode";

import type { AskOutcome } from "./common/nextEdit";
import { BACKENDS, type Backend } from "./common/settings";
import { runDoctorCommand } from "./doctor";
import { ServerInstaller } from "./install";
import { NextEditUI } from "./nextEdits";
import { KodeServer, type ServerSource } from "./server";
import * as settings from "./settings";
import { StatusBar } from "./statusBar";

let server: KodeServer | undefined;

const BACKEND_DESCRIPTIONS: Record<Backend, string> = {
  local: "llama.cpp on this machine",
  remote: "the server in kode.remote.url (SGLang or OpenAI-compatible)",
  auto: "remote while it answers within its latency budget, else local",
};

const ASK_MESSAGES: Record<Exclude<AskOutcome, "shown">, string> = {
  none: "no next edit here",
  stale: "the document changed before the next edit came",
  off: "next edits are off, or no editor is active",
  cancelled: "the next edit was not asked for to the end",
  failed: "asking for the next edit failed (see the Kode output)",
};

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("Kode", { log: true });
  const status = new StatusBar();
  status.update({ enabled: settings.isEnabled(), nextEdits: settings.nextEdits() });

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
  // `kode` is created below; the next edits call it only once both exist.
  const next = new NextEditUI(
    (params, token) => kode.inlineEdit(params, token),
    output,
    {
      changed: (view) => {
        status.update({ nextEdit: view && { line: view.edit.range.start.line, atCursor: view.atCursor } });
      },
    },
    (uri) => kode.protocolUri(uri),
  );
  const kode: KodeServer = new KodeServer(
    output,
    {
      stateChanged: (state) => {
        status.update({ state });
        if (state === "running") {
          refreshStats();
        } else {
          next.dismiss();
        }
      },
      completed: refreshStats,
      inlineAsked: (document, position) => {
        next.inlineAsked(document, position);
      },
      inlineAnswered: (document, position, selected, items) => {
        next.inlineAnswered(document, position, selected, items);
      },
    },
    source,
  );
  server = kode;

  const setNextEdits = async (on: boolean): Promise<void> => {
    await settings.setNextEdits(on);
    void vscode.window.setStatusBarMessage(`Kode: next edits ${on ? "on" : "off"}`, 2000);
  };

  const setEnabled = async (enabled: boolean): Promise<void> => {
    await settings.setEnabled(enabled);
    void vscode.window.setStatusBarMessage(`Kode: completions ${enabled ? "on" : "off"}`, 2000);
  };

  context.subscriptions.push(
    output,
    status,
    next,
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
    vscode.commands.registerCommand("kode.dismiss", () => {
      next.dismiss(); // Escape dismisses a next edit held behind the suggestion too
      return kode.dismiss();
    }),
    vscode.commands.registerCommand("kode.closeSuggestWidget", () => kode.closeSuggestWidget()),
    vscode.commands.registerCommand("kode.acceptNextWord", () => kode.acceptNextWord()),
    vscode.commands.registerCommand("kode.suggestNextEdit", async () => {
      if (!settings.nextEdits()) {
        const choice = await vscode.window.showInformationMessage(
          "Kode: next edits are off (setting kode.nextEdits).",
          "Turn On",
        );
        if (choice) {
          await setNextEdits(true);
        }
        return;
      }
      const outcome = await next.ask();
      if (outcome !== "shown") {
        void vscode.window.setStatusBarMessage(`Kode: ${ASK_MESSAGES[outcome]}`, 3000);
      }
    }),
    vscode.commands.registerCommand("kode.toggleNextEdits", () => setNextEdits(!settings.nextEdits())),
    vscode.commands.registerCommand("kode.acceptNextEdit", () => next.tab()),
    vscode.commands.registerCommand("kode.dismissNextEdit", () => {
      next.dismiss();
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (!event.affectsConfiguration(settings.SECTION)) {
        return;
      }
      status.update({ enabled: settings.isEnabled(), nextEdits: settings.nextEdits() });
      next.settingsChanged();
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
