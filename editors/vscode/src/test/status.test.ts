import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { KodeStats, LastCompletion, LastGeneration } from "../common/protocol";
import { formatStatus, lastLatency, shortModel } from "../common/status";

function stats(
  answer: Partial<LastCompletion> | null,
  generation: Partial<LastGeneration> = {},
): KodeStats {
  const answered: LastCompletion = {
    answerMs: 700,
    fromCache: false,
    completionTokens: 31,
    ttftMs: 100,
    generationMs: 700,
    tokensPerS: 50,
  };
  const base: LastGeneration = {
    promptTokens: 120,
    reusedPromptTokens: 100,
    evaluatedPromptTokens: 20,
    completionTokens: 30,
    decodeSteps: 30,
    stepsAfterCancel: 0,
    finishReason: "end",
    ttftMs: 100,
    totalMs: 700,
    speculation: { method: "none", steps: 30, drafted: 0, acceptedMean: 0 },
  };
  return {
    backend: "llama.cpp",
    model: "qwen2.5-coder-0.5b-instruct.gguf",
    lastCompletion: answer === null ? null : { ...answered, ...answer },
    counters:
      answer === null
        ? null
        : {
            generations: 1,
            cancelled: 0,
            decodeCalls: 31,
            generationSteps: 30,
            stepsAfterCancel: 0,
            promptTokens: 120,
            promptTokensReused: 100,
            promptTokensEvaluated: 20,
            completionTokens: 30,
            last: { ...base, ...generation },
          },
    settings: { backend: "local" },
  };
}

describe("status bar text", () => {
  it("shows the last answer, not the backend's last generation", () => {
    // After an answer of 13 s, a one-token background preparation was the backend's last
    // generation: the status bar said `176 ms · 10000 tok/s` (seen in the real VS Code).
    const latency = lastLatency(stats({ answerMs: 13270, tokensPerS: 9.6 }, { totalMs: 176, ttftMs: 175.9, completionTokens: 1 }));
    assert.deepEqual(latency, { totalMs: 13270, tokensPerSecond: 9.6 });
    assert.equal(lastLatency(stats({ tokensPerS: null }))?.tokensPerSecond, undefined);
    assert.equal(lastLatency(stats(null)), undefined);
    assert.equal(lastLatency(undefined), undefined);
    const older = stats({});
    delete older.lastCompletion; // a server without it
    assert.equal(lastLatency(older), undefined);
  });

  it("shows backend, model, latency and speed", () => {
    const view = formatStatus("running", true, stats({}));
    assert.equal(view.text, "$(sparkle) Kode: llama.cpp qwen2.5-coder-0.5b-instruct · 700 ms · 50 tok/s");
    assert.match(view.tooltip, /backend: llama\.cpp \(setting: local\)/);
    assert.match(view.tooltip, /last completion: 700 ms, 50\.0 tokens\/s/);
  });

  it("says when the model is not loaded, completions are off or the server is down", () => {
    const idle: KodeStats = { backend: null, model: null, counters: null, settings: {} };
    assert.equal(formatStatus("running", true, idle).text, "$(sparkle) Kode");
    assert.match(formatStatus("running", true, idle).tooltip, /model: not loaded yet/);
    assert.equal(formatStatus("running", false, stats({})).text, "$(circle-slash) Kode");
    assert.equal(formatStatus("failed", true, undefined).text, "$(error) Kode");
    assert.equal(formatStatus("starting", true, undefined).text, "$(loading~spin) Kode");
  });

  it("says when a next edit is waiting, and what Tab does", () => {
    const waiting = formatStatus("running", true, stats({}), { on: true, waiting: { line: 41, atCursor: false } });
    assert.equal(
      waiting.text,
      "$(sparkle) Kode: $(arrow-right) next edit: line 42 · llama.cpp qwen2.5-coder-0.5b-instruct · 700 ms · 50 tok/s",
    );
    assert.match(waiting.tooltip, /next edit waiting at line 42: Tab jumps to it, Tab again applies it, Escape dismisses it/);
    const here = formatStatus("running", true, stats({}), { on: true, waiting: { line: 41, atCursor: true } });
    assert.match(here.tooltip, /line 42: Tab applies it,/);
    const none = formatStatus("running", true, stats({}), { on: true });
    assert.doesNotMatch(none.text, /next edit/);
    assert.match(none.tooltip, /next edits: on/);
    assert.match(formatStatus("running", true, stats({})).tooltip, /next edits: off/);
    // Completions off: nothing about edits, whatever is drawn.
    const off = formatStatus("running", false, stats({}), { on: true, waiting: { line: 1, atCursor: false } });
    assert.equal(off.text, "$(circle-slash) Kode");
  });

  it("shortens model paths", () => {
    assert.equal(shortModel("/models/My-Model.Q4.GGUF"), "My-Model.Q4");
    assert.equal(shortModel(null), undefined);
  });
});
