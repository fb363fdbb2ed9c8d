import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { Message, MessageWriter } from "vscode-languageserver-protocol";
import { Emitter } from "vscode-languageserver-protocol";

import { inlineCompletionRequest, type SentCompletionRequest, TappedWriter } from "../common/tap";

function request(id: number, method: string, params: unknown): Message {
  return { jsonrpc: "2.0", id, method, params } as Message;
}

const PARAMS = { textDocument: { uri: "file:///a.py" }, position: { line: 2, character: 4 }, context: {} };

describe("TappedWriter", () => {
  it("recognises inline-completion requests only", () => {
    assert.deepEqual(inlineCompletionRequest(request(3, "textDocument/inlineCompletion", PARAMS)), {
      id: 3,
      uri: "file:///a.py",
      position: { line: 2, character: 4 },
    });
    assert.equal(inlineCompletionRequest(request(4, "textDocument/hover", PARAMS)), undefined);
    assert.equal(inlineCompletionRequest(request(5, "textDocument/inlineCompletion", {})), undefined);
    const notification = { jsonrpc: "2.0", method: "textDocument/inlineCompletion", params: PARAMS } as Message;
    assert.equal(inlineCompletionRequest(notification), undefined);
  });

  it("reports, then passes every message on", async () => {
    const written: Message[] = [];
    const events: string[] = [];
    const inner: MessageWriter = {
      onError: new Emitter<[Error, Message | undefined, number | undefined]>().event,
      onClose: new Emitter<undefined>().event,
      write: (message) => {
        written.push(message);
        return Promise.resolve();
      },
      end: () => events.push("end"),
      dispose: () => events.push("dispose"),
    };
    const seen: SentCompletionRequest[] = [];
    const writer = new TappedWriter(inner, (sent) => seen.push(sent));
    await writer.write(request(1, "initialize", {}));
    await writer.write(request(2, "textDocument/inlineCompletion", PARAMS));
    writer.end();
    writer.dispose();
    assert.equal(written.length, 2);
    assert.deepEqual(seen.map((sent) => sent.id), [2]);
    assert.deepEqual(events, ["end", "dispose"]);
  });
});
