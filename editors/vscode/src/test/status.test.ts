import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { KodeStats, LastGeneration } from "../common/protocol";
import { formatStatus, lastLatency, shortModel } from "../common/status";

function stats(last: Partial<LastGeneration> | null): KodeStats {
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
    counters:
      last === null
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
            last: { ...base, ...last },
          },
    settings: { backend: "local" },
  };
}

describe("status bar text", () => {
  it("computes tokens/s from the decode time after the first token", () => {
    const latency = lastLatency(stats({}));
    assert.ok(latency);
    assert.equal(latency.totalMs, 700);
    assert.equal(latency.tokensPerSecond, 50); // 30 tokens in 600 ms
    assert.equal(lastLatency(stats({ totalMs: 100, ttftMs: 100 }))?.tokensPerSecond, undefined);
    assert.equal(lastLatency(stats({ totalMs: 0 })), undefined);
    assert.equal(lastLatency(stats(null)), undefined);
    assert.equal(lastLatency(undefined), undefined);
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

  it("shortens model paths", () => {
    assert.equal(shortModel("/models/My-Model.Q4.GGUF"), "My-Model.Q4");
    assert.equal(shortModel(null), undefined);
  });
});
