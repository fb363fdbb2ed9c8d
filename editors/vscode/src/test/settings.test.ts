import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  CLIENT_DEFAULTS,
  CLIENT_KEYS,
  isBackend,
  REMOTE_KEYS,
  SERVER_KEYS,
  toServerSettings,
  userValue,
} from "../common/settings";
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
      ...CLIENT_DEFAULTS,
      enabled: true,
      model: "small",
      maxTokens: 64,
      remote: { url: "http://gpu:30000", timeoutMs: 800 },
    });
  });

  it("leaves unset values to the server but keeps null", () => {
    assert.deepEqual(toServerSettings(reader({ seed: null })), { ...CLIENT_DEFAULTS, seed: null });
    assert.deepEqual(toServerSettings(reader({})), { ...CLIENT_DEFAULTS });
  });

  it("sends the client's own defaults unless the user set the key", () => {
    assert.deepEqual(CLIENT_DEFAULTS, { partialCompletions: true });
    assert.deepEqual(toServerSettings(reader({ partialCompletions: false })), { partialCompletions: false });
  });

  it("knows the backends", () => {
    assert.equal(isBackend("auto"), true);
    assert.equal(isBackend("cloud"), false);
  });
});

describe("userValue", () => {
  it("takes the folder's, else the workspace's, else the user's value; never the default", () => {
    assert.equal(userValue(undefined), undefined);
    assert.equal(userValue({ defaultValue: 32 } as never), undefined);
    assert.equal(userValue({ globalValue: 32 }), 32);
    assert.equal(userValue({ globalValue: 1, workspaceValue: 2 }), 2);
    assert.equal(userValue({ globalValue: 1, workspaceValue: 2, workspaceFolderValue: 3 }), 3);
    assert.equal(userValue({ globalValue: 7, workspaceValue: null }), null);
    assert.equal(userValue({ globalValue: false }), false);
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

  it("shows the client's own defaults as the defaults", () => {
    // The other defaults are the server's: tests/unit/test_setting_defaults.py.
    const contributed = contributedDefaults();
    for (const [key, value] of Object.entries(CLIENT_DEFAULTS)) {
      assert.deepEqual(contributed.get(`kode.${key}`), value, `default of kode.${key}`);
    }
  });
});
