/**
 * Next edits (`kode/inlineEdit`, docs/protocol.md): when to ask, which answer to draw,
 * and what Tab and Escape do. No `vscode` import: the editor side (src/nextEdits.ts)
 * draws, moves the cursor and applies, through `NextEditHost`; the tests drive this
 * with fakes.
 *
 * The rules, in order:
 * 1. Ask after an edit of the active document and a pause with no further edit
 *    (`PAUSE_MS`: the server builds its edit history from the `didChange`s), for the
 *    document's version and the cursor, only while completions and next edits are on;
 *    not after an undo or a redo (the user is taking edits back: an edit then is a guess
 *    against them, and the server, whose history groups edits by the second, proposed
 *    the very edit just undone when the undo followed it within one).
 * 2. An edit of that document, another active editor, Escape or next edits turned off
 *    cancel the request in flight (its token: `$/cancelRequest`) and hide the edit drawn.
 * 3. An answer is drawn only while its `textDocument.version` is the document's version
 *    and it answers the latest request: a version that has moved on never shows an edit.
 * 4. The completion wins at the cursor: while VS Code asks for an inline completion at
 *    this version and place, or shows one (its answer was a completion and the cursor has
 *    not left its place), no next edit is drawn. Where that answer was the server's own next edit
 *    (an item with a `range` on the cursor's line) and VS Code draws it as ghost text
 *    (`ghostTextShows`), it is left to VS Code, never drawn twice.
 * 5. Tab with the cursor on the edit's lines applies it, as one edit; elsewhere it moves
 *    the cursor to the edit's start. Which keys reach `tab` is package.json's business:
 *    never while a completion, the suggest widget or a snippet has Tab.
 */

import { type InlineEdit, inlineEdits, type InlineEditParams, type LspPosition, type LspRange } from "./protocol";
import type { SourceLike } from "./streaming";

/** The pause after an edit before the next edit is asked for. */
export const PAUSE_MS = 350;

/** The active editor, as the next edits see it. */
export interface ActiveDocument {
  uri: string;
  version: number;
  cursor: LspPosition;
  lineText(line: number): string;
}

/** What `NextEdits` needs from the editor. */
export interface NextEditHost<T> {
  /** The active editor's document and cursor (undefined: none, or not a text editor). */
  active(): ActiveDocument | undefined;
  /** Whether completions and next edits are both on. */
  enabled(): boolean;
  /** Sends `kode/inlineEdit`; the token cancels it. */
  request(params: InlineEditParams, token: T): Promise<unknown>;
  createSource(): SourceLike<T>;
  /** Runs `callback` after `ms`; dispose() cancels it. */
  schedule(callback: () => void, ms: number): { dispose(): void };
  /** Draws the edit to show (undefined: none): called whenever that changes. */
  show(view: NextEditView | undefined): void;
  /** Moves the cursor to `position` and reveals it. */
  jump(position: LspPosition, range: LspRange): void;
  /** Applies `edit` to its document as one undoable edit; false if it could not. */
  apply(edit: InlineEdit): Promise<boolean>;
  log(message: string): void;
}

export interface NextEditView {
  edit: InlineEdit;
  /** The cursor is on the edit's lines: Tab applies it (else Tab jumps there). */
  atCursor: boolean;
}

/** What VS Code's inline completion answered at a version: the completion rule (4). */
export type InlineAnswer =
  | { kind: "asked" }
  | { kind: "none" }
  | { kind: "completion" }
  | { kind: "edit"; range: LspRange; text: string };

interface InlineState {
  uri: string;
  version: number;
  position: LspPosition;
  answer: InlineAnswer;
}

interface Flight<T> {
  uri: string;
  version: number;
  source: SourceLike<T>;
  cancelled: boolean;
}

/** How an ask ended, for the by-hand command's message. */
export type AskOutcome = "shown" | "none" | "stale" | "off" | "cancelled" | "failed";

export function samePosition(a: LspPosition, b: LspPosition): boolean {
  return a.line === b.line && a.character === b.character;
}

function isEmptyRange(range: LspRange): boolean {
  return samePosition(range.start, range.end);
}

/** Whether `cursor` is on one of the lines `range` touches (Tab applies there). */
export function onEditLines(cursor: LspPosition, range: LspRange): boolean {
  return cursor.line >= range.start.line && cursor.line <= range.end.line;
}

function isSubsequence(needle: string, haystack: string): boolean {
  let at = 0;
  for (const char of haystack) {
    if (at < needle.length && needle[at] === char) {
      at += 1;
    }
  }
  return at === needle.length;
}

/**
 * Whether VS Code draws `edit`, answered as an inline completion item with a `range`, as
 * ghost text with the cursor at `cursor` (`lineText`: the edit's line). The rule of VS
 * Code 1.139 (`InlineCompletionItem.isVisible`, in code-server 4.139.1's bundle):
 * without the common prefix of old and new text, the edit must start on the cursor's
 * line; the new text before the cursor must start with the old text before it, and the
 * old text after the cursor must be a subsequence of the new text after it, letters
 * compared without case (so only insertions show); where the edit starts in the line's
 * indentation, leading blanks do not count. `n` -> `count` shows (inserted around the
 * `n`), `total` -> `sum` does not.
 */
export function ghostTextShows(edit: { range: LspRange; text: string }, cursor: LspPosition, lineText: string): boolean {
  const { start, end } = edit.range;
  if (start.line !== end.line || cursor.line !== start.line) {
    return false;
  }
  const old = lineText.slice(start.character, end.character);
  let common = 0;
  while (common < old.length && common < edit.text.length && old[common] === edit.text[common]) {
    common += 1;
  }
  const column = start.character + common;
  const oldText = old.slice(common);
  const newText = edit.text.slice(common);
  if (oldText === "" && newText === "") {
    return false;
  }
  const split = Math.max(0, cursor.character - column);
  let newBefore = newText.slice(0, split);
  let newAfter = newText.slice(split);
  let oldBefore = oldText.slice(0, split);
  let oldAfter = oldText.slice(split);
  const indentation = lineText.length - lineText.trimStart().length;
  if (column <= indentation) {
    oldBefore = oldBefore.trimStart();
    if (oldBefore === "") {
      oldAfter = oldAfter.trimStart();
    }
    newBefore = newBefore.trimStart();
    if (newBefore === "") {
      newAfter = newAfter.trimStart();
    }
  }
  return (
    newBefore.startsWith(oldBefore) &&
    oldAfter.length <= newAfter.length &&
    isSubsequence(oldAfter.toLowerCase(), newAfter.toLowerCase())
  );
}

/**
 * What an inline-completion answer was, for rule 4: items with no range, or an empty
 * one at the cursor, or the suggest widget item's range (`selected`), are completions;
 * an item with another range is the server's next edit on the cursor's line.
 */
export function classifyInline(
  position: LspPosition,
  selected: LspRange | undefined,
  items: readonly { text: string; range?: LspRange | undefined }[] | undefined,
): InlineAnswer {
  const item = items?.find((candidate) => candidate.text !== "");
  if (!item) {
    return { kind: "none" };
  }
  const range = item.range;
  const atCursor = range === undefined || (isEmptyRange(range) && samePosition(range.start, position));
  const overSelected =
    range !== undefined && selected !== undefined && samePosition(range.start, selected.start) && samePosition(range.end, selected.end);
  if (atCursor || overSelected) {
    return { kind: "completion" };
  }
  return { kind: "edit", range, text: item.text };
}

/** Where the edit lies against the lines on screen: undefined when one of them shows. */
export function offScreen(range: LspRange, visible: readonly LspRange[]): "above" | "below" | undefined {
  if (visible.length === 0) {
    return undefined;
  }
  if (visible.some((shown) => range.start.line <= shown.end.line && range.end.line >= shown.start.line)) {
    return undefined;
  }
  const first = Math.min(...visible.map((shown) => shown.start.line));
  return range.end.line < first ? "above" : "below";
}

/** Where `text` ends once inserted at `start` (the cursor after an applied edit). */
export function endOf(start: LspPosition, text: string): LspPosition {
  const lines = text.split(/\r\n|\r|\n/);
  const last = lines.at(-1) ?? "";
  return lines.length === 1
    ? { line: start.line, character: start.character + last.length }
    : { line: start.line + lines.length - 1, character: last.length };
}

/** The new text on one line, for an `after` decoration: line breaks as `⏎`, at most `max` characters. */
export function oneLine(text: string, max = 80): string {
  const flat = text.replace(/\r\n|\r|\n/g, "⏎").replace(/\s+$/, "");
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

/**
 * The next edits of one window. Call the `*Changed` methods from the editor's events,
 * `inlineAsked`/`inlineAnswered` from the inline-completion provider, `tab`, `dismiss`
 * and `ask` from the commands.
 */
export class NextEdits<T> {
  private timer: { dispose(): void } | undefined;
  private flight: Flight<T> | undefined;
  private edit: InlineEdit | undefined;
  private inline: InlineState | undefined;
  private shown: NextEditView | undefined;

  constructor(
    private readonly host: NextEditHost<T>,
    private readonly pauseMs = PAUSE_MS,
  ) {}

  /** The edit drawn now, if any. */
  get view(): NextEditView | undefined {
    return this.shown;
  }

  /**
   * The active document changed (rule 2), then ask after the pause (rule 1); `ask`
   * false for an undo or a redo.
   */
  documentChanged(uri: string, ask = true): void {
    const active = this.host.active();
    const shownHere = this.edit?.textDocument.uri === uri || this.flight?.uri === uri;
    if (active?.uri !== uri && !shownHere) {
      return; // another document (an output channel, a file edited in the background)
    }
    this.stop("edited");
    if (ask && active?.uri === uri && this.host.enabled()) {
      this.timer = this.host.schedule(() => {
        this.timer = undefined;
        void this.ask();
      }, this.pauseMs);
    }
  }

  /** The cursor moved: what Tab does, and whether a completion still shows, may change. */
  cursorMoved(): void {
    this.render();
  }

  /** Another editor became active (rule 2). */
  activeEditorChanged(): void {
    this.stop("another editor");
  }

  /** Settings changed: next edits turned off hide everything (rule 2). */
  settingsChanged(): void {
    if (!this.host.enabled()) {
      this.stop("next edits off");
    }
  }

  /** Escape: cancel and hide. */
  dismiss(): void {
    this.stop("dismissed");
  }

  /** VS Code asks for an inline completion at this version (rule 4). */
  inlineAsked(uri: string, version: number, position: LspPosition): void {
    this.inline = { uri, version, position, answer: { kind: "asked" } };
    this.render();
  }

  /** What that ask was answered (or `none`: cancelled, failed, empty). */
  inlineAnswered(uri: string, version: number, position: LspPosition, answer: InlineAnswer): void {
    const current = this.inline;
    if (current && current.uri === uri && current.version === version && samePosition(current.position, position)) {
      current.answer = answer;
    } else if (answer.kind !== "none") {
      this.inline = { uri, version, position, answer };
    }
    this.render();
  }

  /**
   * Asks now (after the pause, or by hand): cancels the request in flight, then draws
   * the answer if it still fits the document (rule 3).
   */
  async ask(): Promise<AskOutcome> {
    this.timer?.dispose();
    this.timer = undefined;
    const active = this.host.active();
    if (!active || !this.host.enabled()) {
      return "off";
    }
    this.cancelFlight();
    const flight: Flight<T> = {
      uri: active.uri,
      version: active.version,
      source: this.host.createSource(),
      cancelled: false,
    };
    this.flight = flight;
    const params: InlineEditParams = {
      textDocument: { uri: active.uri, version: active.version },
      position: { line: active.cursor.line, character: active.cursor.character },
    };
    let answer: unknown;
    try {
      answer = await this.host.request(params, flight.source.token);
    } catch (error) {
      if (flight.cancelled) {
        return "cancelled";
      }
      this.host.log(`kode/inlineEdit v${String(flight.version)} failed: ${String(error)}`);
      return "failed";
    } finally {
      if (this.flight === flight) {
        this.flight = undefined;
      }
      flight.source.dispose();
    }
    if (flight.cancelled) {
      return "cancelled";
    }
    const edit = inlineEdits(answer).find((candidate) => candidate.textDocument.uri === flight.uri);
    if (!edit) {
      this.host.log(`kode/inlineEdit v${String(flight.version)}: no edit`);
      return "none";
    }
    const now = this.host.active();
    const version = edit.textDocument.version;
    if (version !== flight.version || now?.uri !== flight.uri || now.version !== version) {
      this.host.log(`kode/inlineEdit v${String(version)}: stale, the document is at v${String(now?.version)}`);
      return "stale";
    }
    this.edit = edit;
    this.host.log(`kode/inlineEdit v${String(version)}: an edit at ${rangeText(edit.range)}`);
    this.render();
    return "shown";
  }

  /**
   * Tab (rule 5): jump to the edit, or apply it when the cursor is on its lines. Returns
   * what it did; `none` when no edit is drawn.
   */
  async tab(): Promise<"jumped" | "applied" | "failed" | "none"> {
    this.render();
    const view = this.shown;
    if (!view) {
      return "none";
    }
    if (!view.atCursor) {
      this.host.jump(view.edit.range.start, view.edit.range);
      this.render();
      return "jumped";
    }
    const edit = view.edit;
    this.stop("applied");
    return (await this.host.apply(edit)) ? "applied" : "failed";
  }

  dispose(): void {
    this.stop("disposed");
  }

  private stop(reason: string): void {
    this.timer?.dispose();
    this.timer = undefined;
    if (this.flight) {
      this.host.log(`kode/inlineEdit v${String(this.flight.version)} cancelled: ${reason}`);
    }
    this.cancelFlight();
    this.edit = undefined;
    this.render();
  }

  private cancelFlight(): void {
    const flight = this.flight;
    this.flight = undefined;
    if (flight) {
      flight.cancelled = true;
      flight.source.cancel();
    }
  }

  /** Works out the view (rules 3 and 4) and hands it to the host when it changed. */
  private render(): void {
    const view = this.computeView();
    const before = this.shown;
    if (before?.edit === view?.edit && before?.atCursor === view?.atCursor) {
      return;
    }
    this.shown = view;
    this.host.show(view);
  }

  private computeView(): NextEditView | undefined {
    const edit = this.edit;
    if (!edit) {
      return undefined;
    }
    const active = this.host.active();
    if (active?.uri !== edit.textDocument.uri || active.version !== edit.textDocument.version) {
      this.edit = undefined; // rule 3: a version that moved on never shows it again
      return undefined;
    }
    if (this.completionWins(active)) {
      return undefined;
    }
    return { edit, atCursor: onEditLines(active.cursor, edit.range) };
  }

  private completionWins(active: ActiveDocument): boolean {
    const inline = this.inline;
    if (inline?.uri !== active.uri || inline.version !== active.version) {
      return false;
    }
    const { answer } = inline;
    switch (answer.kind) {
      case "asked": // an ask VS Code left unanswered (cancelled when the cursor moved)
        return samePosition(inline.position, active.cursor); // wins only where it was made
      case "none":
        return false;
      case "completion":
        return samePosition(inline.position, active.cursor);
      case "edit":
        return (
          samePosition(inline.position, active.cursor) &&
          ghostTextShows(answer, active.cursor, active.lineText(answer.range.start.line))
        );
    }
  }
}

function rangeText(range: LspRange): string {
  return `${String(range.start.line)}:${String(range.start.character)}-${String(range.end.line)}:${String(range.end.character)}`;
}
