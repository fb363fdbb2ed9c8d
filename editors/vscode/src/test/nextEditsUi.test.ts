/**
 * Next edits in the fake `vscode` module (src/nextEdits.ts over common/nextEdit.ts), with
 * a scripted `kode/inlineEdit`: the rename typed at one use is asked about after the
 * pause, the edit at the next use is drawn (struck through, the new text after it, the
 * context keys set), Tab jumps, Tab applies it as one edit that one undo takes back; a
 * stale answer is dropped; Escape and typing on dismiss it and cancel the request.
 */

import assert from "node:assert/strict";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";

import type { InlineEdit, InlineEditParams } from "../common/protocol";
import {
  activate,
  CancellationTokenSource,
  FakeEditor,
  type FakeDecorationType,
  install,
  Position,
  Range,
  recorded,
  textDocument,
  vscode,
} from "./fakeVscode";
import { deferred, type Deferred } from "./helpers";

type NextEditsModule = typeof import("../nextEdits");
type Token = InstanceType<typeof CancellationTokenSource>["token"];

const TEXT = "def scale(n, k):\n    total = n * k\n    return total + n\n";
const PAUSE_MS = 5;

interface Sent {
  params: InlineEditParams;
  token: Token;
  answer: Deferred<unknown>;
}

async function until(what: string, probe: () => boolean, ms = 2000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!probe()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}

function logChannel() {
  const lines: string[] = [];
  const log = (message: string) => lines.push(message);
  return { lines, trace: log, debug: log, info: log, warn: log, error: log };
}

describe("next edits in a fake VS Code", () => {
  let module: NextEditsModule;
  let ui: InstanceType<NextEditsModule["NextEditUI"]>;
  let editor: FakeEditor;
  let sent: Sent[];
  let changes: unknown[];
  let uri: string;
  let removed: FakeDecorationType;
  let inserted: FakeDecorationType;
  let hint: FakeDecorationType;

  before(() => {
    install();
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- after install(): nextEdits.js requires "vscode"
    module = require("../nextEdits") as NextEditsModule;
  });

  beforeEach(() => {
    recorded.userSettings["kode.nextEdits"] = true;
    recorded.decorationTypes.length = 0;
    recorded.context.clear();
    sent = [];
    changes = [];
    ui = new module.NextEditUI(
      (params, token) => {
        const answer = deferred<unknown>();
        sent.push({ params, token: token as Token, answer });
        return answer.promise;
      },
      logChannel() as never,
      { changed: (view) => changes.push(view) },
      undefined,
      PAUSE_MS,
    );
    [removed, inserted, hint] = recorded.decorationTypes as [FakeDecorationType, FakeDecorationType, FakeDecorationType];
    editor = new FakeEditor(textDocument("/tmp/kode-next-edit/shapes.py", TEXT));
    uri = editor.document.uri.toString();
    activate(editor);
  });

  afterEach(() => {
    ui.dispose();
  });

  after(() => {
    activate(undefined);
  });

  /** `n` -> `count` typed over the parameter, then the pause: the request it brings. */
  async function renamed(): Promise<Sent> {
    const before = sent.length;
    editor.type(new Range(0, 10, 0, 11), "count");
    await until("kode/inlineEdit after the pause", () => sent.length > before);
    const request = sent.at(-1);
    assert.ok(request);
    return request;
  }

  /** The server's answer: the rename at the next use, for `version`. */
  function nextUse(version: number): InlineEdit {
    return {
      textDocument: { uri, version },
      range: { start: { line: 1, character: 12 }, end: { line: 1, character: 13 } },
      text: "count",
    };
  }

  async function answered(request: Sent, ...edits: InlineEdit[]): Promise<void> {
    request.answer.resolve({ edits });
    await new Promise((resolve) => setImmediate(resolve));
  }

  function drawn(): { removed: string[]; inserted: string[]; hint: string[] } {
    const text = (type: FakeDecorationType) =>
      (editor.decorations.get(type) ?? []).map(
        ({ range, renderOptions }) =>
          `${String(range.start.line)}:${String(range.start.character)}-${String(range.end.line)}:${String(range.end.character)}` +
          (renderOptions?.after?.contentText === undefined ? "" : ` ${renderOptions.after.contentText}`),
      );
    return { removed: text(removed), inserted: text(inserted), hint: text(hint) };
  }

  it("asks after the pause with the document's version and the cursor, and draws the answer", async () => {
    const request = await renamed();
    assert.deepEqual(request.params, {
      textDocument: { uri, version: 2 },
      position: { line: 0, character: 15 },
    });
    await answered(request, nextUse(2));
    assert.deepEqual(drawn(), { removed: ["1:12-1:13"], inserted: ["1:13-1:13 count"], hint: [] });
    assert.equal(recorded.context.get(module.SHOWN_KEY), true);
    assert.notEqual(recorded.context.get(module.AT_CURSOR_KEY), true);
    assert.equal(changes.at(-1) !== undefined, true, "the status bar was not told");
    // What goes is struck through; both draw in the theme colours package.json contributes.
    assert.equal(removed.options.textDecoration, "line-through");
    assert.deepEqual(removed.options.backgroundColor, new vscode.ThemeColor(module.COLORS.removedBackground));
    assert.deepEqual((inserted.options.after as { color: unknown }).color, new vscode.ThemeColor(module.COLORS.insertedForeground));
    assert.deepEqual(inserted.options.overviewRulerColor, new vscode.ThemeColor(module.COLORS.marker));
  });

  it("drops an answer whose version is not the document's", async () => {
    const request = await renamed();
    await answered(request, nextUse(1));
    assert.deepEqual(drawn(), { removed: [], inserted: [], hint: [] });
    assert.notEqual(recorded.context.get(module.SHOWN_KEY), true);
  });

  it("Tab jumps to the edit, Tab again applies it as one edit that one undo takes back", async () => {
    await answered(await renamed(), nextUse(2));
    await ui.tab();
    assert.deepEqual(editor.selection.active, new Position(1, 12), "Tab did not move the cursor to the edit");
    assert.equal(editor.revealed.length, 1, "the edit was not revealed");
    assert.equal(editor.edits.length, 0, "the first Tab applied the edit");
    assert.equal(recorded.context.get(module.AT_CURSOR_KEY), true);
    const before = editor.document.getText();
    await ui.tab();
    assert.equal(editor.edits.length, 1, "not one edit");
    assert.equal(editor.edits[0]?.replacements.length, 1);
    assert.deepEqual(editor.edits[0]?.options, { undoStopBefore: true, undoStopAfter: true });
    assert.equal(editor.document.getText(), "def scale(count, k):\n    total = count * k\n    return total + n\n");
    assert.deepEqual(editor.selection.active, new Position(1, 17), "the cursor is not after the new text");
    assert.deepEqual(drawn(), { removed: [], inserted: [], hint: [] });
    assert.equal(recorded.context.get(module.SHOWN_KEY), false);
    const asked = sent.length;
    editor.undo();
    assert.equal(editor.document.getText(), before, "one undo did not take the edit back");
    await new Promise((resolve) => setTimeout(resolve, 10 * PAUSE_MS));
    assert.equal(sent.length, asked, "a next edit was asked for after the undo");
  });

  it("Tab with no edit drawn types a Tab (the context key lagged behind)", async () => {
    const from = recorded.executed.length;
    await ui.tab();
    assert.deepEqual(recorded.executed.slice(from), ["tab"]);
    assert.equal(editor.edits.length, 0);
  });

  it("Escape dismisses the edit", async () => {
    await answered(await renamed(), nextUse(2));
    ui.dismiss();
    assert.deepEqual(drawn(), { removed: [], inserted: [], hint: [] });
    assert.equal(recorded.context.get(module.SHOWN_KEY), false);
    assert.equal(changes.at(-1), undefined);
    await ui.tab(); // nothing to apply any more
    assert.equal(editor.edits.length, 0);
  });

  it("typing on dismisses the edit and cancels the request in flight", async () => {
    await answered(await renamed(), nextUse(2));
    const request = await renamed(); // `count` typed over `count`: a new version, a new request
    assert.deepEqual(drawn(), { removed: [], inserted: [], hint: [] }, "the edit survived typing");
    editor.type(new Range(2, 0, 2, 0), "#");
    assert.ok(request.token.isCancellationRequested, "the request in flight was not cancelled");
    await answered(request, nextUse(request.params.textDocument.version));
    assert.deepEqual(drawn(), { removed: [], inserted: [], hint: [] }, "a cancelled request's answer was drawn");
  });

  it("points from the cursor's line to an edit off screen", async () => {
    editor.visibleRanges = [new Range(0, 0, 0, 20)];
    await answered(await renamed(), nextUse(2));
    assert.deepEqual(drawn().hint, ["0:20-0:20 ↓ next edit at line 2 (Tab)"]);
    editor.visibleRanges = [new Range(0, 0, 2, 0)];
    editor.moveCursor(0, 3);
    assert.deepEqual(drawn().hint, []);
  });
});
