import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { CLIENT_KEYS, isBackend, REMOTE_KEYS, SERVER_KEYS, toServerSettings } from "../common/settings";
import { contributedDefaults } from "./helpers";

function reader(values: Record<string, unknown>): (key: string) => unknown {
  return (key) => values[key];
}

describe("toServerSettings", () => {
  it("sends server settings only, nesting remote.*", () => {
    const sent = toServerSettings(
      reader({
        serverPath: "/opt/kode/bin/kode",
        trace: { server: "verbose" },
        enabled: true,
        model: "small",
        maxTokens: 64,
        "remote.url": "http://gpu:30000",
        "remote.timeoutMs": 800,
      }),
    );
    assert.deepEqual(sent, {
      enabled: true,
      model: "small",
      maxTokens: 64,
      remote: { url: "http://gpu:30000", timeoutMs: 800 },
    });
  });

  it("leaves unset values to the server but keeps null", () => {
    assert.deepEqual(toServerSettings(reader({ seed: null })), { seed: null });
    assert.deepEqual(toServerSettings(reader({})), {});
  });

  it("knows the backends", () => {
    assert.equal(isBackend("auto"), true);
    assert.equal(isBackend("cloud"), false);
  });
});

describe("package.json", () => {
  it("contributes exactly the server settings plus the client-only ones", () => {
    const contributed = [...contributedDefaults().keys()].sort();
    const expected = [
      ...SERVER_KEYS.map((key) => `kode.${key}`),
      ...REMOTE_KEYS.map((key) => `kode.remote.${key}`),
      "kode.serverPath",
      "kode.trace.server",
    ].sort();
    assert.deepEqual(contributed, expected);
    assert.deepEqual([...CLIENT_KEYS], ["serverPath", "trace"]);
  });
});
