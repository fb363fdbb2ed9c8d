/**
 * The language client: starts `kode lsp`, sends the settings, and turns streamed partial
 * completions into re-asks of VS Code's inline-suggestion UI (see common/streaming.ts).
 */

import * as cp from "node:child_process";
import * as os from "node:os";
import * as readline from "node:readline";

import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  type LanguageClientOptions,
  type MessageTransports,
  State,
  StreamMessageReader,
  StreamMessageWriter,
} from "vscode-languageclient/node";

import { resolveExecutable } from "./common/executable";
import {
  CURSOR_METHOD,
  INLINE_EDIT_METHOD,
  type InlineEditParams,
  isPartialParams,
  type KodeStats,
  PARTIAL_METHOD,
  STATS_METHOD,
} from "./common/protocol";
import type { ServerState } from "./common/status";
import { StreamingCompletions } from "./common/streaming";
import { TappedWriter } from "./common/tap";
import * as settings from "./settings";

type InlineResult = vscode.InlineCompletionItem[] | vscode.InlineCompletionList;

/** The language client's own inline-completion provider, which the middleware wraps. */
type NextInlineProvider = (
  document: vscode.TextDocument,
  position: vscode.Position,
  context: vscode.InlineCompletionContext,
  token: vscode.CancellationToken,
) => vscode.ProviderResult<InlineResult>;

function rangeText(range: vscode.Range): string {
  return `${range.start.line}:${range.start.character}-${range.end.line}:${range.end.character}`;
}

/** How long the cursor must rest before the server is told where it is. */
const CURSOR_SETTLE_MS = 150;

export interface ServerEvents {
  /** The server started, stopped or failed. */
  stateChanged(state: ServerState): void;
  /** A completion finished: time to refresh the status bar's numbers. */
  completed(): void;
  /** VS Code asked for an inline completion here (the next edits wait for it). */
  inlineAsked?(document: vscode.TextDocument, position: vscode.Position): void;
  /** ... and this was the answer (undefined: none, cancelled or failed). */
  inlineAnswered?(
    document: vscode.TextDocument,
    position: vscode.Position,
    selected: vscode.Range | undefined,
    items: readonly vscode.InlineCompletionItem[] | undefined,
  ): void;
}

/** Which server to start, and what to do when it is missing or has started. */
export interface ServerSource {
  /** The command (a name on PATH or a path) and where it comes from, for the log. */
  command(): { command: string; origin: string };
  /** It was not found (the message says so). */
  notFound(command: string): void;
  /** It started and reported its version (`serverInfo`). */
  started(executable: string, version: string | undefined): void;
}

export class KodeServer implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private child: cp.ChildProcess | undefined;
  private readonly streaming: StreamingCompletions<InlineResult, vscode.CancellationToken>;
  private readonly subscriptions: vscode.Disposable[] = [];
  private cursorTimer: ReturnType<typeof setTimeout> | undefined;
  /** Settings changed after `initializationOptions` were sent, before the server ran. */
  private settingsWhileStarting = false;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly events: ServerEvents,
    private readonly source: ServerSource,
  ) {
    this.streaming = new StreamingCompletions<InlineResult, vscode.CancellationToken>({
      createSource: () => new vscode.CancellationTokenSource(),
      retrigger: (uri) => {
        this.retrigger(uri);
      },
      log: (message) => {
        this.output.trace(message);
      },
    });
    this.subscriptions.push(
      vscode.workspace.onDidChangeTextDocument((event) => {
        if (event.contentChanges.length > 0) {
          this.streaming.documentChanged(this.protocolUri(event.document.uri));
        }
      }),
      vscode.window.onDidChangeTextEditorSelection((event) => {
        const selection = event.selections.at(0);
        if (selection) {
          const { line, character } = selection.active;
          this.streaming.cursorMoved(this.protocolUri(event.textEditor.document.uri), line, character);
        }
        this.cursorSettles(event.textEditor);
      }),
      vscode.window.onDidChangeActiveTextEditor((editor) => {
        this.streaming.cancel("another editor");
        this.cursorSettles(editor);
      }),
      new vscode.Disposable(() => {
        clearTimeout(this.cursorTimer);
      }),
    );
  }

  /**
   * Tells the server where the cursor rests (`kode/didMoveCursor`, docs/protocol.md) once
   * it has stayed put for a moment, so the server can prepare that place while the user
   * reads. Only the active editor's cursor counts.
   */
  private cursorSettles(editor: vscode.TextEditor | undefined): void {
    clearTimeout(this.cursorTimer);
    if (!editor) {
      return;
    }
    this.cursorTimer = setTimeout(() => {
      const active = vscode.window.activeTextEditor;
      if (active !== editor || !this.running || !this.client || !settings.isEnabled()) {
        return;
      }
      const { line, character } = editor.selection.active;
      void this.client
        .sendNotification(CURSOR_METHOD, {
          textDocument: { uri: this.protocolUri(editor.document.uri) },
          position: { line, character },
        })
        .catch((error: unknown) => {
          this.output.warn(`${CURSOR_METHOD} failed: ${String(error)}`);
        });
    }, CURSOR_SETTLE_MS);
  }

  get running(): boolean {
    return this.client?.state === State.Running;
  }

  /** Starts the server; reports (and returns) instead of throwing when it cannot. */
  async start(): Promise<void> {
    if (this.client) {
      return;
    }
    const { command, origin } = this.source.command();
    const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? os.homedir();
    const executable = resolveExecutable(command, process.env, cwd);
    this.output.info(`server ${JSON.stringify(command)}: ${origin}`);
    if (executable === undefined) {
      this.events.stateChanged("failed");
      this.source.notFound(command);
      return;
    }
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
      outputChannel: this.output,
      // A function, so that a restart picks up the settings of that moment.
      initializationOptions: () => settings.serverSettings(),
      // No `synchronize.configurationSection`: it would send the whole `kode` section,
      // serverPath included, and the server rejects keys it does not know.
      middleware: {
        provideInlineCompletionItems: (document, position, context, token, next) =>
          this.provide(document, position, context, token, next),
      },
    };
    const client = new LanguageClient("kode", "Kode", () => this.spawn(executable, cwd), clientOptions);
    this.client = client;
    client.onDidChangeState((event) => {
      if (event.newState === State.Running) {
        if (this.settingsWhileStarting) {
          this.settingsWhileStarting = false;
          void this.sendSettings();
        }
        this.events.stateChanged("running");
      } else if (event.newState === State.Stopped) {
        this.events.stateChanged("stopped");
      } else {
        this.events.stateChanged("starting");
      }
    });
    client.onNotification(PARTIAL_METHOD, (params: unknown) => {
      if (isPartialParams(params)) {
        this.streaming.partial(params);
      }
    });
    this.events.stateChanged("starting");
    try {
      await client.start();
      this.source.started(executable, client.initializeResult?.serverInfo?.version);
    } catch (error) {
      this.output.error(`could not start ${executable} lsp: ${String(error)}`);
      this.events.stateChanged("failed");
    }
  }

  async stop(): Promise<void> {
    this.streaming.cancel("server stopped");
    this.settingsWhileStarting = false; // a new start reads them afresh
    const client = this.client;
    const child = this.child;
    this.client = undefined;
    this.child = undefined;
    if (client) {
      try {
        await client.stop(2000);
      } catch (error) {
        this.output.warn(`stopping the server: ${String(error)}`);
      }
      await client.dispose();
    }
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill();
    }
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** Sends the current settings (`workspace/didChangeConfiguration`). */
  async sendSettings(): Promise<void> {
    this.streaming.cancel("settings changed");
    if (!this.running || !this.client) {
      // Starting: `initializationOptions` were read already; send these once it runs.
      this.settingsWhileStarting = this.client !== undefined;
      return;
    }
    await this.client.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [settings.SECTION]: settings.serverSettings() },
    });
  }

  /** `kode/stats`, or undefined while the server is not running. */
  async stats(): Promise<KodeStats | undefined> {
    if (!this.running || !this.client) {
      return undefined;
    }
    try {
      return await this.client.sendRequest<KodeStats>(STATS_METHOD, {});
    } catch (error) {
      this.output.warn(`kode/stats failed: ${String(error)}`);
      return undefined;
    }
  }

  /**
   * `kode/inlineEdit` (docs/protocol.md): the token's cancellation sends `$/cancelRequest`.
   * Rejects while the server is not running.
   */
  async inlineEdit(params: InlineEditParams, token: vscode.CancellationToken): Promise<unknown> {
    if (!this.running || !this.client) {
      throw new Error("the server is not running");
    }
    return this.client.sendRequest(INLINE_EDIT_METHOD, params, token);
  }

  /**
   * Escape while VS Code's suggest widget shows: close it, then ask for Kode's suggestion
   * for the text as typed. With `editor.quickSuggestions` at its default
   * (`offWhenInlineCompletions`, VS Code 1.139), typing waits 750 ms for an inline
   * suggestion; when none came by then, VS Code opens the widget and stops its inline
   * suggestions for the place (`SuggestModel._waitForInlineCompletionsAndTrigger`). While
   * the widget is open it still asks for suggestions that extend its item; once Escape
   * closed it, it asked for nothing more, so a suggestion slower than 750 ms never showed.
   */
  async closeSuggestWidget(): Promise<void> {
    await vscode.commands.executeCommand("hideSuggestWidget");
    if (settings.isEnabled() && this.running) {
      await vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }
  }

  /**
   * Ctrl+Right while a suggestion shows: accept its next word, then ask again. VS Code's
   * own word-accept lost the rest of Kode's suggestion twice:
   * - over the suggest widget's item, the suggestion lived with the widget (VS Code had
   *   stopped its other inline suggestions, see `closeSuggestWidget`), and the word's
   *   edit closed the widget;
   * - when the word was all of a streamed partial (`<` of `< 2:`, the rest still being
   *   generated), VS Code (1.139, `InlineCompletionsModel._acceptNext`) accepted the
   *   item whole and stopped, asking for nothing more.
   * The ask is answered from the generation the suggestion came from (typed-ahead).
   */
  async acceptNextWord(): Promise<void> {
    await vscode.commands.executeCommand("editor.action.inlineSuggest.acceptNextWord");
    if (settings.isEnabled() && this.running) {
      await vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }
  }

  /** Escape while a suggestion shows: stop streaming into it, then hide it. */
  async dismiss(): Promise<void> {
    this.streaming.cancel("dismissed");
    await vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
  }

  dispose(): void {
    for (const subscription of this.subscriptions) {
      subscription.dispose();
    }
    this.streaming.dispose();
    void this.stop();
  }

  private async provide(
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
    next: NextInlineProvider,
  ): Promise<InlineResult | null> {
    if (!settings.isEnabled()) {
      return null;
    }
    this.events.inlineAsked?.(document, position);
    let items: readonly vscode.InlineCompletionItem[] | undefined;
    try {
      const result = await this.ask(document, position, context, token, next);
      items = !result ? undefined : Array.isArray(result) ? result : result.items;
      return result;
    } finally {
      this.events.inlineAnswered?.(document, position, context.selectedCompletionInfo?.range, items);
    }
  }

  private async ask(
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
    next: NextInlineProvider,
  ): Promise<InlineResult | null> {
    // With an item selected in the suggest widget, VS Code shows only suggestions that
    // extend it over its range; the server answers (partials too) with the item's text
    // and what follows it, made as if the item were accepted.
    const selected = context.selectedCompletionInfo;
    const key = {
      uri: this.protocolUri(document.uri),
      version: document.version,
      line: position.line,
      character: position.character,
      selected: selected && `${rangeText(selected.range)} ${selected.text}`,
    };
    const where = `v${String(key.version)} ${String(key.line)}:${String(key.character)}`;
    const widget = selected ? ` (suggest widget item over ${rangeText(selected.range)})` : "";
    this.output.trace(`inline completion asked at ${where}, trigger ${String(context.triggerKind)}${widget}`);
    const outcome = await this.streaming.provide(key, token, (own) =>
      Promise.resolve(next(document, position, context, own)),
    );
    this.output.trace(`inline completion at ${where}: ${outcome.kind}`);
    switch (outcome.kind) {
      case "partial":
        return new vscode.InlineCompletionList([
          new vscode.InlineCompletionItem(outcome.text, selected?.range ?? new vscode.Range(position, position)),
        ]);
      case "final":
        this.events.completed();
        return outcome.result;
      case "none":
        return null;
    }
  }

  private async spawn(executable: string, cwd: string): Promise<MessageTransports> {
    const child = cp.spawn(executable, ["lsp"], { cwd, env: process.env, stdio: "pipe" });
    await new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", reject);
    });
    this.child = child;
    // The server logs to stderr; its level says what each line is.
    readline.createInterface({ input: child.stderr, crlfDelay: Infinity }).on("line", (line) => {
      this.output.info(`[server] ${line}`);
    });
    child.on("exit", (code, signal) => {
      this.output.info(`kode lsp exited (${signal ?? `code ${String(code)}`})`);
    });
    return {
      reader: new StreamMessageReader(child.stdout),
      writer: new TappedWriter(new StreamMessageWriter(child.stdin), (request) => {
        this.streaming.requestSent(request);
      }),
    };
  }

  /**
   * Makes VS Code ask for inline completions again at the same place, for a longer
   * partial or the final answer. `editor.action.inlineSuggest.trigger` alone is not
   * enough: VS Code (1.139, `InlineCompletionsSource.fetch`) skips an explicit request
   * when the suggestions it shows came from an explicit request at the same position
   * and document version, so from the second re-ask on nothing was asked and the first
   * streamed line stayed on screen. Hiding first clears those suggestions; the new ask
   * is answered at once from what the server has streamed.
   */
  private retrigger(uri: string): void {
    const editor = vscode.window.activeTextEditor;
    if (editor && this.protocolUri(editor.document.uri) === uri) {
      void vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
      void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }
  }

  /** A document's URI as the server knows it (the language client's converter). */
  protocolUri(uri: vscode.Uri): string {
    return this.client ? this.client.code2ProtocolConverter.asUri(uri) : uri.toString();
  }
}
