import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { PartialParams } from "../common/protocol";
import { type CompletionKey, type Outcome, StreamingCompletions } from "../common/streaming";
import { type Deferred, deferred, FakeSource, NEVER, sleep } from "./helpers";

const URI = "file:///project/a.py";
const KEY: CompletionKey = { uri: URI, version: 3, line: 4, character: 8 };

interface Harness {
  streaming: StreamingCompletions<string, FakeSource>;
  sources: FakeSource[];
  retriggers: string[];
  requests: Deferred<string | null>[];
  start: (token: FakeSource) => Promise<string | null>;
}

function harness(graceMs = 20): Harness {
  const sources: FakeSource[] = [];
  const retriggers: string[] = [];
  const requests: Deferred<string | null>[] = [];
  const streaming = new StreamingCompletions<string, FakeSource>({
    createSource: () => {
      const source = new FakeSource();
      sources.push(source);
      return source;
    },
    retrigger: (uri) => retriggers.push(uri),
    graceMs,
    retriggerTimeoutMs: 50,
  });
  const start = (_token: FakeSource): Promise<string | null> => {
    const request = deferred<string | null>();
    requests.push(request);
    return request.promise;
  };
  return { streaming, sources, retriggers, requests, start };
}

function partial(text: string, overrides: Partial<PartialParams> = {}): PartialParams {
  return {
    requestId: 7,
    textDocument: { uri: URI, version: KEY.version },
    position: { line: KEY.line, character: KEY.character },
    text,
    ...overrides,
  };
}

function sent(id: number | string = 7, key: CompletionKey = KEY) {
  return { id, uri: key.uri, position: { line: key.line, character: key.character } };
}

describe("StreamingCompletions", () => {
  it("answers with the final result when no partial comes", async () => {
    const h = harness();
    const answer = h.streaming.provide(KEY, NEVER, h.start);
    assert.equal(h.requests.length, 1);
    h.requests[0]?.resolve("return n");
    assert.deepEqual(await answer, { kind: "final", result: "return n" });
    assert.equal(h.sources[0]?.cancelled, false);
  });

  it("maps an empty or failed request to no suggestion", async () => {
    const h = harness();
    const empty = h.streaming.provide(KEY, NEVER, h.start);
    h.requests[0]?.resolve(null);
    assert.deepEqual(await empty, { kind: "none" });
    const other = { ...KEY, version: 4 };
    const failed = h.streaming.provide(other, NEVER, h.start);
    h.requests[1]?.reject(new Error("boom"));
    assert.deepEqual(await failed, { kind: "none" });
  });

  it("hands a partial to the waiting call, then re-asks for the longer text and the final", async () => {
    const h = harness();
    const first = h.streaming.provide(KEY, NEVER, h.start);
    h.streaming.requestSent(sent());
    assert.equal(h.streaming.partial(partial("if n < 2:")), true);
    assert.deepEqual(await first, { kind: "partial", text: "if n < 2:" });

    // Nobody waits now: the next partial asks the editor to ask again, once.
    assert.equal(h.streaming.partial(partial("if n < 2:\n    return n")), true);
    assert.equal(h.streaming.partial(partial("if n < 2:\n    return n\n")), true);
    assert.deepEqual(h.retriggers, [URI]);

    // The re-ask joins the running request and gets the newest text at once.
    const second = await h.streaming.provide(KEY, NEVER, h.start);
    assert.deepEqual(second, { kind: "partial", text: "if n < 2:\n    return n\n" });
    assert.equal(h.requests.length, 1, "no second request for the same key");

    // The final answer is authoritative; as a partial was shown, one more re-ask.
    h.requests[0]?.resolve("if n < 2:\n    return n");
    await sleep(0);
    assert.deepEqual(h.retriggers, [URI, URI]);
    assert.deepEqual(await h.streaming.provide(KEY, NEVER, h.start), {
      kind: "final",
      result: "if n < 2:\n    return n",
    });
  });

  it("ignores partials of other requests and other document versions", () => {
    const h = harness();
    void h.streaming.provide(KEY, NEVER, h.start);
    assert.equal(h.streaming.partial(partial("early")), false, "id not known yet");
    h.streaming.requestSent(sent(7));
    assert.equal(h.streaming.partial(partial("x", { requestId: 6 })), false);
    assert.equal(h.streaming.partial(partial("x", { textDocument: { uri: URI, version: 2 } })), false);
    assert.equal(h.streaming.partial(partial("x", { textDocument: { uri: "file:///b.py", version: 3 } })), false);
    assert.equal(h.streaming.partial(partial("x")), true);
  });

  it("binds only a request for the session's position", () => {
    const h = harness();
    void h.streaming.provide(KEY, NEVER, h.start);
    h.streaming.requestSent(sent(5, { ...KEY, character: 2 }));
    assert.equal(h.streaming.partial(partial("x", { requestId: 5 })), false);
    h.streaming.requestSent(sent(6));
    assert.equal(h.streaming.partial(partial("x", { requestId: 6 })), true);
  });

  it("cancels the running request when asked at another key", async () => {
    const h = harness();
    const first = h.streaming.provide(KEY, NEVER, h.start);
    const second = h.streaming.provide({ ...KEY, version: 4, character: 9 }, NEVER, h.start);
    assert.equal(h.sources[0]?.cancelled, true);
    assert.deepEqual(await first, { kind: "none" });
    h.requests[0]?.resolve("stale");
    h.requests[1]?.resolve("fresh");
    assert.deepEqual(await second, { kind: "final", result: "fresh" });
  });

  it("treats another selected suggest-widget item as another request", async () => {
    const h = harness();
    const withNumber = { ...KEY, selected: "4:7-4:8 number" };
    const plain = h.streaming.provide(KEY, NEVER, h.start);
    const selected = h.streaming.provide(withNumber, NEVER, h.start);
    assert.equal(h.requests.length, 2, "the item changes what the server completes");
    assert.equal(h.sources[0]?.cancelled, true);
    assert.deepEqual(await plain, { kind: "none" });
    h.requests[1]?.resolve("number > 1:");
    assert.deepEqual(await selected, { kind: "final", result: "number > 1:" });
    // The same item again joins the finished session.
    assert.deepEqual(await h.streaming.provide({ ...withNumber }, NEVER, h.start), {
      kind: "final",
      result: "number > 1:",
    });
    assert.equal(h.requests.length, 2);
  });

  it("cancels on an edit, a cursor move elsewhere and an explicit cancel", () => {
    const h = harness();
    void h.streaming.provide(KEY, NEVER, h.start);
    h.streaming.documentChanged("file:///other.py");
    h.streaming.cursorMoved(URI, KEY.line, KEY.character);
    assert.equal(h.sources[0]?.cancelled, false);
    h.streaming.documentChanged(URI);
    assert.equal(h.sources[0]?.cancelled, true);

    void h.streaming.provide(KEY, NEVER, h.start);
    h.streaming.cursorMoved(URI, KEY.line + 1, 0);
    assert.equal(h.sources[1]?.cancelled, true);

    void h.streaming.provide(KEY, NEVER, h.start);
    h.streaming.cancel();
    assert.equal(h.sources[2]?.cancelled, true);
    assert.equal(h.sources[2]?.disposed, true);
    assert.equal(h.streaming.current, undefined);
  });

  it("keeps the request through a cancelled call that is followed by a re-ask", async () => {
    const h = harness(30);
    const vscodeToken = new FakeSource();
    const first = h.streaming.provide(KEY, vscodeToken, h.start);
    vscodeToken.cancel(); // VS Code cancels the old call when it asks again...
    assert.deepEqual(await first, { kind: "none" });
    const again = h.streaming.provide(KEY, NEVER, h.start); // ...and asks again at once
    await sleep(60);
    assert.equal(h.sources[0]?.cancelled, false);
    h.requests[0]?.resolve("done");
    assert.deepEqual(await again, { kind: "final", result: "done" });
  });

  it("cancels an orphaned request after the grace period", async () => {
    const h = harness(20);
    const vscodeToken = new FakeSource();
    const answer: Promise<Outcome<string>> = h.streaming.provide(KEY, vscodeToken, h.start);
    vscodeToken.cancel();
    assert.deepEqual(await answer, { kind: "none" });
    assert.equal(h.sources[0]?.cancelled, false);
    await sleep(60);
    assert.equal(h.sources[0]?.cancelled, true);
  });

  it("does not start a request for an already cancelled call", async () => {
    const h = harness();
    const token = new FakeSource();
    token.cancel();
    assert.deepEqual(await h.streaming.provide(KEY, token, h.start), { kind: "none" });
    assert.equal(h.requests.length, 0);
  });
});
