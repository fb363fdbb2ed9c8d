/**
 * A small stand-in for the `vscode` module: enough of the API for the extension and
 * vscode-languageclient to activate, start the real server and answer inline
 * completions under plain node. It records what the extension does (status bar,
 * messages, commands, providers) so a test can look, and plays VS Code's part where
 * the extension relies on it (configuration, documents, re-asking after
 * `editor.action.inlineSuggest.trigger`).
 */

/* eslint-disable @typescript-eslint/no-extraneous-class -- empty stand-ins for VS Code's classes */

import * as fs from "node:fs";
import * as path from "node:path";
import Module from "node:module";

type Listener<T> = (event: T) => unknown;

export class Disposable {
  static from(...items: { dispose(): unknown }[]): Disposable {
    return new Disposable(() => {
      for (const item of items) {
        item.dispose();
      }
    });
  }

  constructor(private readonly callback: () => unknown) {}

  dispose(): void {
    this.callback();
  }
}

export class EventEmitter<T> {
  private readonly listeners = new Set<Listener<T>>();

  readonly event = (listener: Listener<T>, thisArgs?: unknown, disposables?: Disposable[]): Disposable => {
    const bound: Listener<T> = (e) => listener.call(thisArgs, e);
    this.listeners.add(bound);
    const disposable = new Disposable(() => this.listeners.delete(bound));
    disposables?.push(disposable);
    return disposable;
  };

  fire(event: T): void {
    for (const listener of [...this.listeners]) {
      listener(event);
    }
  }

  dispose(): void {
    this.listeners.clear();
  }
}

export class CancellationError extends Error {}

export class CancellationTokenSource {
  private readonly emitter = new EventEmitter<void>();
  private readonly state = { cancelled: false };
  readonly token: { readonly isCancellationRequested: boolean; onCancellationRequested: EventEmitter<void>["event"] };

  constructor() {
    const state = this.state;
    this.token = {
      get isCancellationRequested(): boolean {
        return state.cancelled;
      },
      onCancellationRequested: this.emitter.event,
    };
  }

  cancel(): void {
    if (!this.state.cancelled) {
      this.state.cancelled = true;
      this.emitter.fire();
    }
  }

  dispose(): void {
    this.emitter.dispose();
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
  ) {}

  static parse(value: string): Uri {
    const match = /^([a-z][a-z0-9+.-]*):(?:\/\/[^/]*)?(.*)$/i.exec(value);
    return match ? new Uri(match[1], decodeURIComponent(match[2])) : new Uri("file", value);
  }

  static file(fsPath: string): Uri {
    return new Uri("file", fsPath);
  }

  get fsPath(): string {
    return this.path;
  }

  toString(): string {
    return `${this.scheme}://${this.path.split("/").map(encodeURIComponent).join("/")}`;
  }

  toJSON(): string {
    return this.toString();
  }
}

export class Position {
  constructor(
    readonly line: number,
    readonly character: number,
  ) {}

  isEqual(other: Position): boolean {
    return this.line === other.line && this.character === other.character;
  }

  isBefore(other: Position): boolean {
    return this.line < other.line || (this.line === other.line && this.character < other.character);
  }
}

export class Range {
  readonly start: Position;
  readonly end: Position;

  constructor(start: Position | number, end: Position | number, endLine?: number, endCharacter?: number) {
    if (typeof start === "number" && typeof end === "number") {
      this.start = new Position(start, end);
      this.end = new Position(endLine ?? start, endCharacter ?? end);
    } else {
      this.start = start as Position;
      this.end = end as Position;
    }
  }

  get isEmpty(): boolean {
    return this.start.isEqual(this.end);
  }
}

export class Selection extends Range {
  constructor(
    readonly anchor: Position,
    readonly active: Position,
  ) {
    super(anchor.isBefore(active) ? anchor : active, anchor.isBefore(active) ? active : anchor);
  }
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export class MarkdownString {
  constructor(public value = "") {}

  appendMarkdown(value: string): this {
    this.value += value;
    return this;
  }

  appendCodeblock(code: string, language = ""): this {
    this.value += `\n\`\`\`${language}\n${code}\n\`\`\`\n`;
    return this;
  }
}

export enum OverviewRulerLane {
  Left = 1,
  Center = 2,
  Right = 4,
  Full = 7,
}

export enum DecorationRangeBehavior {
  OpenOpen = 0,
  ClosedClosed = 1,
  OpenClosed = 2,
  ClosedOpen = 3,
}

export enum TextEditorRevealType {
  Default = 0,
  InCenter = 1,
  InCenterIfOutsideViewport = 2,
  AtTop = 3,
}

export enum TextDocumentChangeReason {
  Undo = 1,
  Redo = 2,
}

export class InlineCompletionItem {
  constructor(
    public insertText: string | { value: string },
    public range?: Range,
    public command?: unknown,
  ) {}
}

export class InlineCompletionList {
  constructor(public items: InlineCompletionItem[]) {}
}

/** Classes the language client extends at load time; Kode's server needs none of them. */
export class CallHierarchyItem {}
export class CodeAction {}
export class CodeLens {}
export class CompletionItem {}
export class Diagnostic {}
export class DocumentLink {}
export class InlayHint {}
export class SymbolInformation {}
export class TypeHierarchyItem {}

export class SnippetString {
  constructor(public value = "") {}
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export enum ConfigurationTarget {
  Global = 1,
  Workspace = 2,
  WorkspaceFolder = 3,
}

export enum LogLevel {
  Off = 0,
  Trace = 1,
  Debug = 2,
  Info = 3,
  Warning = 4,
  Error = 5,
}

export enum ProgressLocation {
  SourceControl = 1,
  Window = 10,
  Notification = 15,
}

export enum InlineCompletionTriggerKind {
  Invoke = 0,
  Automatic = 1,
}

export class TabInputText {}
export class TabInputTextDiff {}
export class TabInputNotebook {}
export class TabInputCustom {}

export interface FakeDocument {
  uri: Uri;
  fileName: string;
  languageId: string;
  version: number;
  isClosed: boolean;
  isDirty: boolean;
  isUntitled: boolean;
  lineCount: number;
  eol: number;
  getText(range?: Range): string;
  lineAt(line: number): { text: string; range: Range };
  offsetAt(position: Position): number;
  positionAt(offset: number): Position;
}

/** A document whose text `editDocument` changes, as typing or an edit would. */
export class TextDocumentFake implements FakeDocument {
  readonly uri: Uri;
  isClosed = false;
  isDirty = false;
  isUntitled = false;
  eol = 1;
  private text: string;

  constructor(
    readonly fileName: string,
    text: string,
    readonly languageId: string,
    public version: number,
  ) {
    this.uri = Uri.file(fileName);
    this.text = text;
  }

  private get lines(): string[] {
    return this.text.split("\n");
  }

  get lineCount(): number {
    return this.lines.length;
  }

  getText(range?: Range): string {
    return range ? this.text.slice(this.offsetAt(range.start), this.offsetAt(range.end)) : this.text;
  }

  lineAt(line: number): { text: string; range: Range } {
    const text = this.lines[line] ?? "";
    return { text, range: new Range(line, 0, line, text.length) };
  }

  offsetAt(position: Position): number {
    const lines = this.lines;
    const before = lines.slice(0, position.line).reduce((sum, line) => sum + line.length + 1, 0);
    return before + Math.min(position.character, (lines[position.line] ?? "").length);
  }

  positionAt(offset: number): Position {
    const lines = this.lines;
    let line = 0;
    let rest = offset;
    while (line < lines.length - 1 && rest > (lines[line] ?? "").length) {
      rest -= (lines[line] ?? "").length + 1;
      line += 1;
    }
    return new Position(line, rest);
  }

  /** Replaces `range` with `text` (the caller moves the version on); the change as VS Code describes it. */
  replace(range: Range, text: string): { range: Range; rangeOffset: number; rangeLength: number; text: string } {
    const start = this.offsetAt(range.start);
    const end = this.offsetAt(range.end);
    this.text = this.text.slice(0, start) + text + this.text.slice(end);
    this.isDirty = true;
    return { range, rangeOffset: start, rangeLength: end - start, text };
  }
}

export function textDocument(file: string, text: string, languageId = "python", version = 1): TextDocumentFake {
  return new TextDocumentFake(file, text, languageId, version);
}

function disposable(): Disposable {
  return new Disposable(() => undefined);
}

/** package.json's configuration defaults, overridable per test. */
function contributedDefaults(): Record<string, unknown> {
  const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "package.json"), "utf8")) as {
    contributes: { configuration: { properties: Record<string, { default?: unknown }> } };
  };
  const out: Record<string, unknown> = {};
  for (const [name, schema] of Object.entries(manifest.contributes.configuration.properties)) {
    out[name] = schema.default;
  }
  return out;
}

export interface StatusItem {
  text: string;
  tooltip: string;
  command: string;
  name: string;
}

/** What the fake recorded, and the knobs a test turns. */
export const recorded = {
  /** package.json's defaults (VS Code's `defaultValue`). */
  settings: contributedDefaults(),
  /** User settings (`globalValue`); `update` writes here. */
  userSettings: {} as Record<string, unknown>,
  /** Workspace settings (`workspaceValue`). */
  workspaceSettings: {} as Record<string, unknown>,
  /** Workspace folder settings (`workspaceFolderValue`). */
  folderSettings: {} as Record<string, unknown>,
  statusItems: [] as StatusItem[],
  errors: [] as string[],
  /** showInformationMessage's messages. */
  infos: [] as string[],
  /** Progress notifications: their titles, then each message reported. */
  progress: [] as string[],
  executed: [] as string[],
  commands: new Map<string, (...args: unknown[]) => unknown>(),
  inlineProviders: [] as {
    provideInlineCompletionItems(...args: unknown[]): Promise<unknown>;
  }[],
  /** Called for `editor.action.inlineSuggest.trigger`, as VS Code would ask again. */
  onTrigger: undefined as (() => void) | undefined,
  /** Called for `editor.action.inlineSuggest.hide`. */
  onHide: undefined as (() => void) | undefined,
  /** Called for `hideSuggestWidget` (VS Code's suggest widget closes). */
  onHideSuggestWidget: undefined as (() => void) | undefined,
  /** The button a message's reader presses (undefined: the message is closed). */
  choose: undefined as ((message: string, buttons: string[]) => string | undefined) | undefined,
  /** Context keys set with the `setContext` command. */
  context: new Map<string, unknown>(),
  /** Decoration types created (`createTextEditorDecorationType`), in order. */
  decorationTypes: [] as FakeDecorationType[],
  /** Messages shown in the status bar (`setStatusBarMessage`). */
  statusMessages: [] as string[],
};

export interface FakeDecorationType {
  key: string;
  options: Record<string, unknown>;
  dispose(): void;
}

const emitters = {
  open: new EventEmitter<FakeDocument>(),
  close: new EventEmitter<FakeDocument>(),
  change: new EventEmitter<{ document: FakeDocument; contentChanges: unknown[]; reason: TextDocumentChangeReason | undefined }>(),
  configuration: new EventEmitter<{ affectsConfiguration(section: string): boolean }>(),
  selection: new EventEmitter<unknown>(),
  activeEditor: new EventEmitter<unknown>(),
  visibleRanges: new EventEmitter<unknown>(),
};

export interface DecorationOptionsLike {
  range: Range;
  hoverMessage?: unknown;
  renderOptions?: { after?: { contentText?: string }; before?: { contentText?: string } };
}

/**
 * A text editor: its selection, visible lines and decorations, and `edit`, which applies
 * its replacements as one change (one undo step, `undo` takes it back).
 */
export class FakeEditor {
  selection: Selection;
  visibleRanges: Range[];
  readonly decorations = new Map<FakeDecorationType, DecorationOptionsLike[]>();
  /** Each `edit` call: its replacements and the options it was given. */
  readonly edits: { replacements: { range: Range; text: string }[]; options: unknown }[] = [];
  readonly revealed: Range[] = [];
  private readonly undoStack: { range: Range; text: string }[][] = [];

  constructor(readonly document: TextDocumentFake) {
    this.selection = new Selection(new Position(0, 0), new Position(0, 0));
    this.visibleRanges = [new Range(0, 0, Math.max(0, document.lineCount - 1), 0)];
  }

  get selections(): Selection[] {
    return [this.selection];
  }

  setDecorations(type: FakeDecorationType, ranges: DecorationOptionsLike[]): void {
    this.decorations.set(type, ranges);
  }

  revealRange(range: Range): void {
    this.revealed.push(range);
  }

  /** Moves the cursor as a click or a key would (the selection event fires). */
  moveCursor(line: number, character: number): void {
    const at = new Position(line, character);
    this.selection = new Selection(at, at);
    emitters.selection.fire({ textEditor: this, selections: [this.selection], kind: undefined });
  }

  edit(
    callback: (builder: { replace(range: Range, text: string): void; insert(at: Position, text: string): void }) => void,
    options?: unknown,
  ): Promise<boolean> {
    const replacements: { range: Range; text: string }[] = [];
    callback({
      replace: (range, text) => replacements.push({ range, text }),
      insert: (at, text) => replacements.push({ range: new Range(at, at), text }),
    });
    this.edits.push({ replacements, options });
    this.undoStack.push(this.change(replacements, undefined));
    return Promise.resolve(true);
  }

  /** Types `text` over `range` (an edit of the user's, not through `edit`). */
  type(range: Range, text: string): void {
    this.undoStack.push(this.change([{ range, text }], undefined));
    const end = this.document.positionAt(this.document.offsetAt(range.start) + text.length);
    this.moveCursor(end.line, end.character);
  }

  /** Ctrl+Z: takes back the last edit whole. */
  undo(): void {
    const inverse = this.undoStack.pop();
    if (inverse) {
      this.change(inverse, TextDocumentChangeReason.Undo);
    }
  }

  /** Applies replacements (last first, so earlier ranges hold) and fires one change event. */
  private change(replacements: { range: Range; text: string }[], reason: TextDocumentChangeReason | undefined) {
    const document = this.document;
    const ascending = [...replacements].sort((a, b) => document.offsetAt(a.range.start) - document.offsetAt(b.range.start));
    // Where each new text will lie once all are applied, and what it replaced: the undo.
    let shift = 0;
    const taken = ascending.map(({ range, text }) => {
      const start = document.offsetAt(range.start) + shift;
      const old = document.getText(range);
      shift += text.length - old.length;
      return { start, end: start + text.length, text: old };
    });
    const contentChanges = [...ascending].reverse().map(({ range, text }) => document.replace(range, text));
    document.version += 1;
    const inverse = taken.map(({ start, end, text }) => ({
      range: new Range(document.positionAt(start), document.positionAt(end)),
      text,
    }));
    emitters.change.fire({ document, contentChanges, reason });
    return inverse;
  }
}

function configuration(section?: string) {
  const prefix = section ? `${section}.` : "";
  const lookup = (key: string): unknown => {
    const full = prefix + key;
    for (const layer of [recorded.folderSettings, recorded.workspaceSettings, recorded.userSettings]) {
      if (full in layer) {
        return layer[full];
      }
    }
    if (full in recorded.settings) {
      return recorded.settings[full];
    }
    // A section object, e.g. get("remote") or get("trace").
    const children = Object.keys(recorded.settings).filter((name) => name.startsWith(`${full}.`));
    if (children.length === 0) {
      return undefined;
    }
    const out: Record<string, unknown> = {};
    for (const child of children) {
      out[child.slice(full.length + 1)] = lookup(child.slice(prefix.length));
    }
    return out;
  };
  return {
    get: (key: string, fallback?: unknown) => lookup(key) ?? fallback,
    has: (key: string) => lookup(key) !== undefined,
    inspect: (key: string) => ({
      key: prefix + key,
      defaultValue: recorded.settings[prefix + key],
      globalValue: recorded.userSettings[prefix + key],
      workspaceValue: recorded.workspaceSettings[prefix + key],
      workspaceFolderValue: recorded.folderSettings[prefix + key],
    }),
    update: (key: string, value: unknown) => {
      const full = prefix + key;
      recorded.userSettings[full] = value;
      emitters.configuration.fire({
        affectsConfiguration: (name: string) => full === name || full.startsWith(`${name}.`),
      });
      return Promise.resolve();
    },
  };
}

function logChannel(name: string) {
  const lines: string[] = [];
  const log = (level: string) => (message: string) => lines.push(`[${level}] ${message}`);
  return {
    name,
    lines,
    logLevel: LogLevel.Info,
    onDidChangeLogLevel: new EventEmitter<LogLevel>().event,
    trace: log("trace"),
    debug: log("debug"),
    info: log("info"),
    warn: log("warn"),
    error: (message: string | Error) => lines.push(`[error] ${String(message)}`),
    append: (value: string) => lines.push(value),
    appendLine: (value: string) => lines.push(value),
    replace: (value: string) => lines.push(value),
    clear: () => undefined,
    show: () => undefined,
    hide: () => undefined,
    dispose: () => undefined,
  };
}

const documents: FakeDocument[] = [];

const languages: Record<string, unknown> = {
  match: () => 10,
  createDiagnosticCollection: () => ({
    set: () => undefined,
    delete: () => undefined,
    clear: () => undefined,
    dispose: () => undefined,
  }),
  registerInlineCompletionItemProvider: (_selector: unknown, provider: (typeof recorded.inlineProviders)[0]) => {
    recorded.inlineProviders.push(provider);
    return disposable();
  },
};

/** Any other top-level name is an enum-like namespace whose members are their own names. */
function namespace(name: string): unknown {
  return new Proxy({}, { get: (_target, member) => `${name}.${String(member)}` });
}

const api = {
  version: "1.91.0",
  Disposable,
  EventEmitter,
  CancellationError,
  CancellationTokenSource,
  Uri,
  Position,
  Range,
  InlineCompletionItem,
  InlineCompletionList,
  InlineCompletionTriggerKind,
  Selection,
  ThemeColor,
  MarkdownString,
  OverviewRulerLane,
  DecorationRangeBehavior,
  TextEditorRevealType,
  TextDocumentChangeReason,
  SnippetString,
  CallHierarchyItem,
  CodeAction,
  CodeLens,
  CompletionItem,
  Diagnostic,
  DocumentLink,
  InlayHint,
  SymbolInformation,
  TypeHierarchyItem,
  StatusBarAlignment,
  ConfigurationTarget,
  LogLevel,
  ProgressLocation,
  TabInputText,
  TabInputTextDiff,
  TabInputNotebook,
  TabInputCustom,
  env: { language: "en", appName: "fake-vscode", openExternal: () => Promise.resolve(true) },
  workspace: {
    get textDocuments() {
      return documents;
    },
    notebookDocuments: [],
    workspaceFolders: undefined,
    getConfiguration: configuration,
    onDidOpenTextDocument: emitters.open.event,
    onDidCloseTextDocument: emitters.close.event,
    onDidChangeTextDocument: emitters.change.event,
    onDidSaveTextDocument: new EventEmitter<unknown>().event,
    onWillSaveTextDocument: new EventEmitter<unknown>().event,
    onDidChangeConfiguration: emitters.configuration.event,
    onDidChangeWorkspaceFolders: new EventEmitter<unknown>().event,
    createFileSystemWatcher: () => ({
      onDidCreate: new EventEmitter<unknown>().event,
      onDidChange: new EventEmitter<unknown>().event,
      onDidDelete: new EventEmitter<unknown>().event,
      dispose: () => undefined,
    }),
    applyEdit: () => Promise.resolve(false),
  },
  window: {
    activeTextEditor: undefined as FakeEditor | undefined,
    visibleTextEditors: [],
    tabGroups: { all: [], onDidChangeTabs: new EventEmitter<unknown>().event },
    onDidChangeActiveTextEditor: emitters.activeEditor.event,
    onDidChangeVisibleTextEditors: new EventEmitter<unknown>().event,
    onDidChangeTextEditorSelection: emitters.selection.event,
    onDidChangeTextEditorVisibleRanges: emitters.visibleRanges.event,
    createTextEditorDecorationType: (options: Record<string, unknown>) => {
      const type: FakeDecorationType = {
        key: `decoration-${String(recorded.decorationTypes.length)}`,
        options,
        dispose: () => undefined,
      };
      recorded.decorationTypes.push(type);
      return type;
    },
    createOutputChannel: logChannel,
    createStatusBarItem: () => {
      const item = { text: "", tooltip: "", command: "", name: "", show: () => undefined, dispose: () => undefined };
      recorded.statusItems.push(item);
      return item;
    },
    setStatusBarMessage: (message: string) => {
      recorded.statusMessages.push(message);
      return disposable();
    },
    showErrorMessage: (message: string, ...buttons: string[]) => {
      recorded.errors.push(message);
      return Promise.resolve(recorded.choose?.(message, buttons));
    },
    showWarningMessage: (message: string, ...buttons: string[]) => {
      recorded.errors.push(message);
      return Promise.resolve(recorded.choose?.(message, buttons));
    },
    showInformationMessage: (message: string, ...buttons: string[]) => {
      recorded.infos.push(message);
      return Promise.resolve(recorded.choose?.(message, buttons));
    },
    showQuickPick: () => Promise.resolve(undefined),
    showTextDocument: () => Promise.resolve(undefined),
    withProgress: (options: { title?: string }, task: (progress: unknown, token: unknown) => unknown) => {
      recorded.progress.push(options.title ?? "");
      const report = (value: { message?: string }): void => {
        recorded.progress.push(value.message ?? "");
      };
      return Promise.resolve(task({ report }, new CancellationTokenSource().token));
    },
  },
  languages: new Proxy(languages, {
    // Any other register*Provider: accepted and ignored (the server offers none).
    get: (target, name: string) => target[name] ?? (() => disposable()),
  }),
  commands: {
    registerCommand: (name: string, callback: (...args: unknown[]) => unknown) => {
      recorded.commands.set(name, callback);
      return new Disposable(() => recorded.commands.delete(name));
    },
    executeCommand: (name: string, ...args: unknown[]) => {
      recorded.executed.push(name);
      if (name === "setContext") {
        recorded.context.set(String(args[0]), args[1]);
      } else if (name === "editor.action.inlineSuggest.trigger") {
        recorded.onTrigger?.();
      } else if (name === "editor.action.inlineSuggest.hide") {
        recorded.onHide?.();
      } else if (name === "hideSuggestWidget") {
        recorded.onHideSuggestWidget?.();
      }
      const command = recorded.commands.get(name);
      return Promise.resolve(command ? command(...args) : undefined);
    },
  },
};

export const vscode = new Proxy(api, {
  get: (target, name: string) => (name in target ? target[name as keyof typeof target] : namespace(name)),
});

/** Open a document as VS Code would (the language client sends didOpen). */
export function openDocument(document: FakeDocument): void {
  documents.push(document);
  emitters.open.fire(document);
}

/** Make `editor` the active one, as clicking into it would. */
export function activate(editor: FakeEditor | undefined): void {
  api.window.activeTextEditor = editor;
  emitters.activeEditor.fire(editor);
}

/** Make `require("vscode")` return the fake. */
export function install(): void {
  const loader = Module as unknown as {
    _load(request: string, parent: unknown, isMain: boolean): unknown;
  };
  const original = loader._load.bind(loader);
  loader._load = (request, parent, isMain) => (request === "vscode" ? vscode : original(request, parent, isMain));
}
