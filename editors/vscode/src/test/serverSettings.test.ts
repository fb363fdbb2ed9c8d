/**
 * settings.ts in the fake `vscode` module of fakeVscode.ts: what the extension sends to
 * the server is what the user set, never package.json's defaults (so a default changed
 * in the server reaches VS Code users), while the extension's own reads still see them.
 */

import assert from "node:assert/strict";
import { beforeEach, describe, it } from "node:test";

import { CLIENT_DEFAULTS } from "../common/settings";
import { install, recorded } from "./fakeVscode";

install();
// eslint-disable-next-line @typescript-eslint/no-require-imports -- after install(): settings.js requires "vscode"
const settings = require("../settings") as typeof import("../settings");

describe("serverSettings", () => {
  beforeEach(() => {
    recorded.userSettings = {};
    recorded.workspaceSettings = {};
    recorded.folderSettings = {};
  });

  it("sends nothing the user did not set (package.json's defaults stay out)", () => {
    // The fake's configuration has every package.json default, as VS Code's has.
    assert.equal(recorded.settings["kode.maxLines"], 32);
    assert.equal(recorded.settings["kode.remote.timeoutMs"], 5000);
    assert.deepEqual(settings.serverSettings(), { ...CLIENT_DEFAULTS });
  });

  it("sends a value the user set, even one equal to the default", () => {
    recorded.userSettings["kode.maxLines"] = recorded.settings["kode.maxLines"];
    recorded.userSettings["kode.temperature"] = 0;
    recorded.userSettings["kode.remote.url"] = "http://gpu:30000";
    const sent = settings.serverSettings();
    assert.deepEqual(sent, {
      ...CLIENT_DEFAULTS,
      maxLines: 32,
      temperature: 0,
      remote: { url: "http://gpu:30000" },
    });
    assert.equal("maxTokens" in sent, false);
  });

  it("takes the folder's value over the workspace's over the user's", () => {
    recorded.userSettings["kode.maxTokens"] = 64;
    recorded.userSettings["kode.model"] = "small";
    recorded.userSettings["kode.seed"] = 7;
    recorded.workspaceSettings["kode.maxTokens"] = 96;
    recorded.workspaceSettings["kode.seed"] = null; // a real value: no seed
    recorded.folderSettings["kode.maxTokens"] = 112;
    recorded.workspaceSettings["kode.remote.timeoutMs"] = 800;
    assert.deepEqual(settings.serverSettings(), {
      ...CLIENT_DEFAULTS,
      maxTokens: 112,
      model: "small",
      seed: null,
      remote: { timeoutMs: 800 },
    });
  });

  it("lets the user turn off what the extension turns on", () => {
    recorded.userSettings["kode.partialCompletions"] = false;
    assert.deepEqual(settings.serverSettings(), { partialCompletions: false });
  });

  it("never sends the client-only settings", () => {
    recorded.userSettings["kode.serverPath"] = "/opt/kode/bin/kode";
    recorded.userSettings["kode.trace.server"] = "verbose";
    assert.deepEqual(settings.serverSettings(), { ...CLIENT_DEFAULTS });
  });

  it("still reads the extension's own settings with their defaults", () => {
    assert.equal(settings.isEnabled(), true);
    assert.equal(settings.backend(), "local");
    assert.equal(settings.configuredServerPath(), undefined);
    recorded.userSettings["kode.enabled"] = false;
    recorded.workspaceSettings["kode.backend"] = "remote";
    assert.equal(settings.isEnabled(), false);
    assert.equal(settings.backend(), "remote");
    recorded.folderSettings["kode.serverPath"] = "/opt/kode/bin/kode";
    assert.equal(settings.configuredServerPath(), "/opt/kode/bin/kode");
    delete recorded.folderSettings["kode.serverPath"];
    // Sent because the user set them.
    assert.deepEqual(settings.serverSettings(), { ...CLIENT_DEFAULTS, enabled: false, backend: "remote" });
  });
});
