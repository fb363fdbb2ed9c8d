/**
 * Next edits in VS Code: decorations for what goes and what comes, the context keys the
 * Tab and Escape bindings read (package.json), the cursor jump and the one-step apply.
 * When to ask and what to draw is common/nextEdit.ts.
 *
 * VS Code's own inline-edit UI (`isInlineEdit`, `displayLocation`) is proposed API, so an
 * edit away from the cursor is drawn with decorations: the replaced text struck through
 * on a removal colour, the new text after it (`after`, line breaks as `⏎`), a mark in the
 * overview ruler, and, while the edit's lines are off screen, a hint at the end of the
 * cursor's line saying where it is. An edit on the cursor's line that VS Code draws as
 * ghost text (the server answers the inline completion with it) is left to VS Code.
 */

import * as vscode from "vscode";

import {
  type ActiveDocument,
  type AskOutcome,
  classifyInline,
  endOf,
  type InlineAnswer,
  NextEdits,
  type NextEditView,
  offScreen,
  oneLine,
} from "./common/nextEdit";
import type { InlineEdit, InlineEditParams, LspPosition, LspRange } from "./common/protocol";
import * as settings from "./settings";

/** Context keys for `when` clauses (package.json's Tab and Escape bindings). */
export const SHOWN_KEY = "kode.nextEditShown";
export const AT_CURSOR_KEY = "kode.nextEditAtCursor";

/** Theme colours contributed in package.json (`contributes.colors`). */
export const COLORS = {
  removedBackground: "kode.nextEdit.removedBackground",
  removedForeground: "kode.nextEdit.removedForeground",
  insertedBackground: "kode.nextEdit.insertedBackground",
  insertedForeground: "kode.nextEdit.insertedForeground",
  hintForeground: "kode.nextEdit.hintForeground",
  marker: "kode.nextEdit.marker",
} as const;

export type InlineEditRequest = (params: InlineEditParams, token: vscode.CancellationToken) => Promise<unknown>;

export interface NextEditEvents {
  /** The edit drawn changed (undefined: none): the status bar says so. */
  changed(view: NextEditView | undefined): void;
}

function toRange(range: LspRange): vscode.Range {
  return new vscode.Range(range.start.line, range.start.character, range.end.line, range.end.character);
}

function toLsp(position: vscode.Position): LspPosition {
  return { line: position.line, character: position.character };
}

export class NextEditUI implements vscode.Disposable {
  private readonly model: NextEdits<vscode.CancellationToken>;
  private readonly removed: vscode.TextEditorDecorationType;
  private readonly inserted: vscode.TextEditorDecorationType;
  private readonly hint: vscode.TextEditorDecorationType;
  private readonly subscriptions: { dispose(): unknown }[] = [];
  private decorated: vscode.TextEditor | undefined;
  private context = { shown: false, atCursor: false };

  constructor(
    private readonly request: InlineEditRequest,
    private readonly output: vscode.LogOutputChannel,
    private readonly events: NextEditEvents,
    /** The protocol URI of a document (the language client's converter). */
    private readonly protocolUri: (uri: vscode.Uri) => string = (uri) => uri.toString(),
    pauseMs?: number,
  ) {
    this.removed = vscode.window.createTextEditorDecorationType({
      textDecoration: "line-through",
      backgroundColor: new vscode.ThemeColor(COLORS.removedBackground),
      color: new vscode.ThemeColor(COLORS.removedForeground),
      rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
    });
    this.inserted = vscode.window.createTextEditorDecorationType({
      after: {
        color: new vscode.ThemeColor(COLORS.insertedForeground),
        backgroundColor: new vscode.ThemeColor(COLORS.insertedBackground),
      },
      overviewRulerColor: new vscode.ThemeColor(COLORS.marker),
      overviewRulerLane: vscode.OverviewRulerLane.Center,
      rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
    });
    this.hint = vscode.window.createTextEditorDecorationType({
      after: { color: new vscode.ThemeColor(COLORS.hintForeground), margin: "0 0 0 2em" },
      rangeBehavior: vscode.DecorationRangeBehavior.ClosedClosed,
    });
    this.model = new NextEdits<vscode.CancellationToken>(
      {
        active: () => this.active(),
        enabled: () => settings.isEnabled() && settings.nextEdits(),
        request: (params, token) => this.request(params, token),
        createSource: () => new vscode.CancellationTokenSource(),
        schedule: (callback, ms) => {
          const timer = setTimeout(callback, ms);
          return { dispose: () => { clearTimeout(timer); } };
        },
        show: (view) => {
          this.draw(view);
        },
        jump: (position, range) => {
          this.jump(position, range);
        },
        apply: (edit) => this.apply(edit),
        log: (message) => {
          this.output.trace(message);
        },
      },
      pauseMs,
    );
    this.subscriptions.push(
      this.removed,
      this.inserted,
      this.hint,
      vscode.workspace.onDidChangeTextDocument((event) => {
        if (event.contentChanges.length > 0) {
          // `reason`: Undo or Redo; undefined for typing and edits.
          this.model.documentChanged(this.protocolUri(event.document.uri), event.reason === undefined);
        }
      }),
      vscode.window.onDidChangeTextEditorSelection((event) => {
        if (event.textEditor === vscode.window.activeTextEditor) {
          this.model.cursorMoved();
          if (this.model.view) {
            this.draw(this.model.view); // the off-screen hint follows the cursor's line
          }
        }
      }),
      vscode.window.onDidChangeTextEditorVisibleRanges((event) => {
        if (event.textEditor === this.decorated) {
          this.draw(this.model.view);
        }
      }),
      vscode.window.onDidChangeActiveTextEditor(() => {
        this.model.activeEditorChanged();
      }),
    );
  }

  /** The edit drawn now, if any. */
  get view(): NextEditView | undefined {
    return this.model.view;
  }

  /** *Kode: Suggest the Next Edit* and the pause after an edit. */
  ask(): Promise<AskOutcome> {
    return this.model.ask();
  }

  /** Tab: jump to the edit, or apply it; with none drawn, Tab does what it would have. */
  async tab(): Promise<void> {
    const done = await this.model.tab();
    if (done === "none") {
      // The context key lagged behind (the edit went a moment ago): the key is the user's.
      await vscode.commands.executeCommand("tab");
    }
  }

  dismiss(): void {
    this.model.dismiss();
  }

  settingsChanged(): void {
    this.model.settingsChanged();
  }

  /** The inline-completion provider was asked at this place (server.ts's middleware). */
  inlineAsked(document: vscode.TextDocument, position: vscode.Position): void {
    this.model.inlineAsked(this.protocolUri(document.uri), document.version, toLsp(position));
  }

  /** ... and answered `items` (undefined or empty: nothing). */
  inlineAnswered(
    document: vscode.TextDocument,
    position: vscode.Position,
    selected: vscode.Range | undefined,
    items: readonly vscode.InlineCompletionItem[] | undefined,
  ): void {
    const answer: InlineAnswer = classifyInline(
      toLsp(position),
      selected && { start: toLsp(selected.start), end: toLsp(selected.end) },
      items?.map((item) => ({
        text: typeof item.insertText === "string" ? item.insertText : item.insertText.value,
        range: item.range && { start: toLsp(item.range.start), end: toLsp(item.range.end) },
      })),
    );
    this.model.inlineAnswered(this.protocolUri(document.uri), document.version, toLsp(position), answer);
  }

  dispose(): void {
    this.model.dispose();
    for (const subscription of this.subscriptions) {
      subscription.dispose();
    }
  }

  private active(): ActiveDocument | undefined {
    const editor = vscode.window.activeTextEditor;
    if (!editor) {
      return undefined;
    }
    const document = editor.document;
    return {
      uri: this.protocolUri(document.uri),
      version: document.version,
      cursor: toLsp(editor.selection.active),
      lineText: (line) => (line < document.lineCount ? document.lineAt(line).text : ""),
    };
  }

  private editorFor(edit: InlineEdit): vscode.TextEditor | undefined {
    const editor = vscode.window.activeTextEditor;
    return editor && this.protocolUri(editor.document.uri) === edit.textDocument.uri ? editor : undefined;
  }

  private draw(view: NextEditView | undefined): void {
    const editor = view ? this.editorFor(view.edit) : undefined;
    if (this.decorated && this.decorated !== editor) {
      this.clear(this.decorated);
    }
    this.decorated = editor;
    this.setContext(view !== undefined && editor !== undefined, view?.atCursor === true);
    this.events.changed(editor ? view : undefined);
    if (!view || !editor) {
      return;
    }
    const { edit } = view;
    const range = toRange(edit.range);
    const hover = this.hover(editor.document, edit);
    editor.setDecorations(this.removed, range.isEmpty ? [] : [{ range, hoverMessage: hover }]);
    const comes = oneLine(edit.text);
    editor.setDecorations(this.inserted, [
      {
        range: new vscode.Range(range.end, range.end),
        hoverMessage: hover,
        renderOptions: { after: { contentText: comes === "" ? "" : comes } },
      },
    ]);
    const where = offScreen(
      edit.range,
      editor.visibleRanges.map((shown) => ({ start: toLsp(shown.start), end: toLsp(shown.end) })),
    );
    if (where === undefined) {
      editor.setDecorations(this.hint, []);
      return;
    }
    const cursorLine = editor.selection.active.line;
    const end = editor.document.lineAt(cursorLine).range.end;
    const arrow = where === "above" ? "↑" : "↓";
    editor.setDecorations(this.hint, [
      {
        range: new vscode.Range(end, end),
        renderOptions: {
          after: { contentText: `${arrow} next edit at line ${String(edit.range.start.line + 1)} (Tab)` },
        },
      },
    ]);
  }

  private hover(document: vscode.TextDocument, edit: InlineEdit): vscode.MarkdownString {
    const old = document.getText(toRange(edit.range));
    const lines = [
      ...(old === "" ? [] : old.split("\n").map((line) => `- ${line}`)),
      ...(edit.text === "" ? [] : edit.text.split("\n").map((line) => `+ ${line}`)),
    ];
    const markdown = new vscode.MarkdownString("**Kode: next edit.** Tab jumps here, Tab again applies it, Escape dismisses it.\n\n");
    markdown.appendCodeblock(lines.join("\n"), "diff");
    return markdown;
  }

  private clear(editor: vscode.TextEditor): void {
    editor.setDecorations(this.removed, []);
    editor.setDecorations(this.inserted, []);
    editor.setDecorations(this.hint, []);
  }

  private setContext(shown: boolean, atCursor: boolean): void {
    if (shown !== this.context.shown) {
      void vscode.commands.executeCommand("setContext", SHOWN_KEY, shown);
    }
    if (atCursor !== this.context.atCursor) {
      void vscode.commands.executeCommand("setContext", AT_CURSOR_KEY, atCursor);
    }
    this.context = { shown, atCursor };
  }

  private jump(position: LspPosition, range: LspRange): void {
    const editor = vscode.window.activeTextEditor;
    if (!editor) {
      return;
    }
    const at = new vscode.Position(position.line, position.character);
    editor.selection = new vscode.Selection(at, at);
    editor.revealRange(toRange(range), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
  }

  /** One `editor.edit`, with undo stops on both sides: Ctrl+Z takes it back in one step. */
  private async apply(edit: InlineEdit): Promise<boolean> {
    const editor = this.editorFor(edit);
    if (editor?.document.version !== edit.textDocument.version) {
      return false;
    }
    const range = toRange(edit.range);
    const applied = await editor.edit(
      (builder) => {
        builder.replace(range, edit.text);
      },
      { undoStopBefore: true, undoStopAfter: true },
    );
    if (applied) {
      // The cursor after the new text, as when a completion is accepted.
      const end = endOf(edit.range.start, edit.text);
      const at = new vscode.Position(end.line, end.character);
      editor.selection = new vscode.Selection(at, at);
    } else {
      this.output.warn("the next edit could not be applied (the document changed)");
    }
    return applied;
  }
}
