/**
 * Next edits' rules (common/nextEdit.ts) with a fake editor: when to ask, what is drawn,
 * what Tab and Escape do; and package.json's Tab and Escape bindings.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  type ActiveDocument,
  classifyInline,
  endOf,
  ghostTextShows,
  type NextEditHost,
  NextEdits,
  type NextEditView,
  offScreen,
  oneLine,
  PAUSE_MS,
} from "../common/nextEdit";
import type { InlineEdit, InlineEditParams, LspPosition } from "../common/protocol";
import { boundCommand, deferred, type Deferred, FakeSource } from "./helpers";

const URI = "file:///project/shapes.py";

function edit(version: number, line = 1, text = "count"): InlineEdit {
  return {
    textDocument: { uri: URI, version },
    range: { start: { line, character: 12 }, end: { line, character: 13 } },
    text,
  };
}

interface Sent {
  params: InlineEditParams;
  source: FakeSource;
  answer: Deferred<unknown>;
}

/** The editor side: one document, its cursor, timers run by hand. */
class Host implements NextEditHost<FakeSource> {
  uri = URI;
  version = 2;
  cursor: LspPosition = { line: 0, character: 15 };
  lines = ["def scale(count, k):", "    total = n * k", "    return total + n"];
  on = true;
  readonly sent: Sent[] = [];
  readonly timers: { callback: () => void; ms: number; disposed: boolean }[] = [];
  readonly shown: (NextEditView | undefined)[] = [];
  readonly applied: InlineEdit[] = [];
  private lastSource: FakeSource | undefined;

  active(): ActiveDocument | undefined {
    return {
      uri: this.uri,
      version: this.version,
      cursor: this.cursor,
      lineText: (line) => this.lines[line] ?? "",
    };
  }

  enabled(): boolean {
    return this.on;
  }

  request(params: InlineEditParams, token: FakeSource): Promise<unknown> {
    assert.equal(token, this.lastSource?.token, "the request must carry its own source's token");
    const answer = deferred<unknown>();
    this.sent.push({ params, source: token, answer });
    return answer.promise;
  }

  createSource(): FakeSource {
    this.lastSource = new FakeSource();
    return this.lastSource;
  }

  schedule(callback: () => void, ms: number): { dispose(): void } {
    const timer = { callback, ms, disposed: false };
    this.timers.push(timer);
    return {
      dispose: () => {
        timer.disposed = true;
      },
    };
  }

  /** The pause ends: runs the timers still pending. */
  pause(): void {
    for (const timer of this.timers.splice(0)) {
      if (!timer.disposed) {
        timer.callback();
      }
    }
  }

  show(view: NextEditView | undefined): void {
    this.shown.push(view);
  }

  jump(position: LspPosition): void {
    this.cursor = position;
  }

  apply(applied: InlineEdit): Promise<boolean> {
    this.applied.push(applied);
    return Promise.resolve(true);
  }

  log(): void {
    // the tests read the outcomes, not the log
  }

  get view(): NextEditView | undefined {
    return this.shown.at(-1);
  }
}

/** A rename typed at the parameter, the pause, and the request it brings. */
async function askedAfterAnEdit(host: Host, model: NextEdits<FakeSource>): Promise<Sent> {
  model.documentChanged(URI);
  host.pause();
  await Promise.resolve();
  const sent = host.sent.at(-1);
  assert.ok(sent, "no kode/inlineEdit after the pause");
  return sent;
}

/** Answers `sent` and lets the answer be handled. */
async function answer(sent: Sent, ...edits: InlineEdit[]): Promise<void> {
  sent.answer.resolve({ edits });
  await new Promise((resolve) => setImmediate(resolve));
}

describe("next edits: when to ask", () => {
  it("asks once the edits pause, for the document's version and the cursor", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    model.documentChanged(URI);
    host.version = 3;
    model.documentChanged(URI); // typed on within the pause: the first wait is dropped
    assert.deepEqual(
      host.timers.map((timer) => [timer.ms, timer.disposed]),
      [
        [PAUSE_MS, true],
        [PAUSE_MS, false],
      ],
    );
    assert.equal(host.sent.length, 0, "asked before the pause");
    host.pause();
    await Promise.resolve();
    assert.deepEqual(
      host.sent.map((sent) => sent.params),
      [{ textDocument: { uri: URI, version: 3 }, position: { line: 0, character: 15 } }],
    );
  });

  it("does not ask after an undo or a redo, and still dismisses", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    model.documentChanged(URI, false);
    assert.equal(model.view, undefined);
    assert.deepEqual(host.timers.filter((timer) => !timer.disposed), [], "asked after the undo");
  });

  it("does not ask while next edits are off, nor for another document", () => {
    const host = new Host();
    const model = new NextEdits(host);
    model.documentChanged("output:///kode"); // an output channel that grows
    assert.equal(host.timers.length, 0);
    host.on = false;
    model.documentChanged(URI);
    assert.equal(host.timers.length, 0);
  });

  it("cancels the request in flight when the user edits again, and never draws its answer", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    const first = await askedAfterAnEdit(host, model);
    host.version = 3;
    model.documentChanged(URI);
    assert.ok(first.source.cancelled, "the request in flight was not cancelled ($/cancelRequest)");
    await answer(first, edit(3)); // even an answer naming the new version: it is not the latest ask
    assert.equal(model.view, undefined);
    const second = await askedAfterAnEdit(host, model);
    assert.equal(second.params.textDocument.version, 3);
    assert.ok(!second.source.cancelled);
  });
});

describe("next edits: what is drawn", () => {
  it("never draws the answer to a request dismissed in flight, even for the same version", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    const sent = await askedAfterAnEdit(host, model);
    model.dismiss(); // Escape while the server works it out
    assert.ok(sent.source.cancelled);
    await answer(sent, edit(2)); // the server answered before it saw the cancellation
    assert.equal(model.view, undefined, "the edit came back after Escape");
  });

  it("draws an answer for the document's current version", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.deepEqual(host.view, { edit: edit(2), atCursor: false });
  });

  it("drops an answer whose version is not the document's any more", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    const sent = await askedAfterAnEdit(host, model);
    host.version = 3; // an edit the model has not been told of yet (its event comes later)
    await answer(sent, edit(2));
    assert.equal(model.view, undefined, "a stale edit was drawn");
    // An answer naming another version than the one asked about is stale too.
    host.version = 2;
    const again = await askedAfterAnEdit(host, model);
    await answer(again, edit(1));
    assert.equal(model.view, undefined);
    assert.ok(host.shown.every((view) => view === undefined), JSON.stringify(host.shown));
  });

  it("hides an edit drawn once the version moves on", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.ok(model.view);
    host.version = 3;
    model.cursorMoved(); // any event that looks again, before the change event itself
    assert.equal(model.view, undefined);
  });

  it("is dismissed by Escape, by an edit, by another editor and by turning next edits off", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    const dismissals: [string, () => void][] = [
      ["Escape", () => { model.dismiss(); }],
      ["an edit", () => { model.documentChanged(URI); }],
      ["another editor", () => { model.activeEditorChanged(); }],
      ["next edits off", () => { host.on = false; model.settingsChanged(); }],
    ];
    for (const [what, dismiss] of dismissals) {
      host.on = true;
      await answer(await askedAfterAnEdit(host, model), edit(2));
      assert.ok(model.view, `nothing drawn before ${what}`);
      dismiss();
      assert.equal(model.view, undefined, `${what} left the edit drawn`);
      assert.equal(host.view, undefined, `${what}: the editor still draws it`);
    }
  });

  it("waits while VS Code asks for a completion, and shows nothing beside one", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    const cursor = { ...host.cursor };
    model.inlineAsked(URI, 2, cursor);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.equal(model.view, undefined, "drawn while the completion could still win");
    model.inlineAnswered(URI, 2, cursor, { kind: "completion" });
    assert.equal(model.view, undefined, "drawn beside the completion's ghost text");
    host.cursor = { line: 0, character: 3 }; // VS Code hides the ghost text when the cursor leaves
    model.cursorMoved();
    assert.ok(model.view, "not drawn once the completion was gone");
    // No completion at the cursor: the edit shows as soon as that is known.
    model.dismiss();
    model.inlineAsked(URI, 2, host.cursor);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.equal(model.view, undefined);
    model.inlineAnswered(URI, 2, host.cursor, { kind: "none" });
    assert.ok(model.view);
    // An ask VS Code never answers (it cancels it when the cursor moves on) wins only at
    // its place: once the cursor left it, the edit shows.
    model.dismiss();
    model.inlineAsked(URI, 2, host.cursor);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.equal(model.view, undefined);
    host.cursor = { line: 0, character: 4 };
    model.cursorMoved();
    assert.ok(model.view, "held for ever by an ask the cursor left");
  });

  it("leaves an edit on the cursor's line to VS Code's ghost text, once", async () => {
    // `return count * k + n`: the cursor after the renamed use, the next use on its line.
    const host = new Host();
    host.lines[1] = "    return count * k + n";
    host.cursor = { line: 1, character: 16 };
    const rename = { ...edit(2), range: { start: { line: 1, character: 23 }, end: { line: 1, character: 24 } } };
    const model = new NextEdits(host);
    model.inlineAsked(URI, 2, host.cursor);
    model.inlineAnswered(URI, 2, host.cursor, { kind: "edit", range: rename.range, text: "count" });
    await answer(await askedAfterAnEdit(host, model), rename);
    assert.equal(model.view, undefined, "drawn twice: as ghost text and as a decoration");
    // An edit VS Code cannot draw as ghost text (it removes letters) is drawn by Kode.
    const shorter = { ...rename, text: "c" };
    host.lines[1] = "    return c * k + count";
    model.inlineAsked(URI, 2, host.cursor);
    model.inlineAnswered(URI, 2, host.cursor, { kind: "edit", range: rename.range, text: "c" });
    await answer(await askedAfterAnEdit(host, model), shorter);
    assert.deepEqual(model.view, { edit: shorter, atCursor: true });
  });
});

describe("next edits: Tab", () => {
  it("jumps to the edit, then applies it once", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.equal(await model.tab(), "jumped");
    assert.deepEqual(host.cursor, { line: 1, character: 12 });
    assert.deepEqual(host.applied, [], "applied on the first Tab");
    assert.equal(model.view?.atCursor, true);
    assert.equal(await model.tab(), "applied");
    assert.deepEqual(host.applied, [edit(2)]);
    assert.equal(model.view, undefined);
    assert.equal(await model.tab(), "none", "a third Tab found an edit");
    assert.equal(host.applied.length, 1);
  });

  it("applies at once with the cursor on the edit's line", async () => {
    const host = new Host();
    host.cursor = { line: 1, character: 0 };
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    assert.equal(await model.tab(), "applied");
  });

  it("does nothing with a stale edit", async () => {
    const host = new Host();
    const model = new NextEdits(host);
    await answer(await askedAfterAnEdit(host, model), edit(2));
    host.version = 3;
    assert.equal(await model.tab(), "none");
    assert.deepEqual(host.applied, []);
  });
});

describe("package.json: Tab and Escape", () => {
  const shown = ["kode.nextEditShown", "editorTextFocus"];

  it("binds Tab to the next edit only while one is drawn", () => {
    assert.equal(boundCommand("tab", new Set(shown)), "kode.acceptNextEdit");
    assert.equal(boundCommand("tab", new Set([...shown, "kode.nextEditAtCursor"])), "kode.acceptNextEdit");
    assert.equal(boundCommand("tab", new Set(["editorTextFocus"])), undefined);
  });

  it("never takes Tab from a completion, the suggest widget, a snippet or Tab-moves-focus", () => {
    for (const other of [
      "inlineSuggestionVisible",
      "suggestWidgetVisible",
      "inSnippetMode",
      "inlineEditIsVisible",
      "editorTabMovesFocus",
      "editorReadonly",
    ]) {
      assert.equal(boundCommand("tab", new Set([...shown, other])), undefined, `Tab taken with ${other}`);
    }
  });

  it("binds Escape to dismiss it; with a completion showing, Escape is the completion's", () => {
    assert.equal(boundCommand("escape", new Set(shown)), "kode.dismissNextEdit");
    assert.equal(
      boundCommand("escape", new Set([...shown, "inlineSuggestionVisible", "config.kode.enabled"])),
      "kode.dismiss",
    );
    assert.equal(
      boundCommand("escape", new Set([...shown, "suggestWidgetVisible", "config.kode.enabled"])),
      "kode.closeSuggestWidget",
    );
    assert.equal(boundCommand("escape", new Set([...shown, "inSnippetMode"])), undefined);
  });
});

describe("next edits: helpers", () => {
  it("tells which edits VS Code draws as ghost text (VS Code 1.139's rule)", () => {
    const line = "    return count * k + n";
    const at = (character: number) => ({ line: 1, character });
    const range = { start: at(23), end: at(24) };
    assert.ok(ghostTextShows({ range, text: "count" }, at(16), line), "n -> count (insertions around the n)");
    assert.ok(ghostTextShows({ range, text: "count" }, at(23), line));
    assert.ok(!ghostTextShows({ range, text: "sum" }, at(16), line), "n -> sum removes the n");
    assert.ok(!ghostTextShows({ range, text: "count" }, { line: 0, character: 16 }, line), "another line");
    assert.ok(!ghostTextShows({ range, text: "n" }, at(16), line), "no change");
    const span = { start: at(11), end: { line: 2, character: 0 } };
    assert.ok(!ghostTextShows({ range: span, text: "x" }, at(11), line), "spans lines");
  });

  it("tells a completion from the server's next edit in an inline answer", () => {
    const cursor = { line: 1, character: 16 };
    const here = { start: cursor, end: cursor };
    const there = { start: { line: 1, character: 23 }, end: { line: 1, character: 24 } };
    assert.deepEqual(classifyInline(cursor, undefined, undefined), { kind: "none" });
    assert.deepEqual(classifyInline(cursor, undefined, [{ text: "", range: here }]), { kind: "none" });
    assert.deepEqual(classifyInline(cursor, undefined, [{ text: " + 1", range: here }]), { kind: "completion" });
    assert.deepEqual(classifyInline(cursor, undefined, [{ text: " + 1" }]), { kind: "completion" });
    assert.deepEqual(classifyInline(cursor, there, [{ text: "number", range: there }]), { kind: "completion" });
    assert.deepEqual(classifyInline(cursor, undefined, [{ text: "count", range: there }]), {
      kind: "edit",
      range: there,
      text: "count",
    });
  });

  it("says where an edit off screen is", () => {
    const lines = (start: number, end: number) => ({ start: { line: start, character: 0 }, end: { line: end, character: 0 } });
    assert.equal(offScreen(lines(50, 50), [lines(0, 30)]), "below");
    assert.equal(offScreen(lines(3, 4), [lines(10, 40)]), "above");
    assert.equal(offScreen(lines(29, 31), [lines(0, 30)]), undefined);
    assert.equal(offScreen(lines(50, 50), [lines(0, 10), lines(45, 60)]), undefined, "folded: a second range shows it");
    assert.equal(offScreen(lines(50, 50), []), undefined);
  });

  it("puts the new text on one line, and finds its end", () => {
    assert.equal(oneLine("count"), "count");
    assert.equal(oneLine("a\n    b\n"), "a⏎    b⏎");
    assert.equal(oneLine("x".repeat(100), 10), `${"x".repeat(9)}…`);
    assert.deepEqual(endOf({ line: 3, character: 4 }, "count"), { line: 3, character: 9 });
    assert.deepEqual(endOf({ line: 3, character: 4 }, "a\nbc"), { line: 4, character: 2 });
  });
});
