import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { expandHome, notFoundMessage, resolveExecutable } from "../common/executable";

describe("resolveExecutable", { skip: process.platform === "win32" }, () => {
  let dir = "";
  let tool = "";

  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "kode-exe-"));
    tool = path.join(dir, "kode");
    fs.writeFileSync(tool, "#!/bin/sh\n", { mode: 0o755 });
    fs.writeFileSync(path.join(dir, "not-executable"), "", { mode: 0o644 });
  });

  after(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("finds a bare name on PATH", () => {
    assert.equal(resolveExecutable("kode", { PATH: `/nonexistent:${dir}` }, "/"), tool);
  });

  it("takes a name with a directory as a path, relative to cwd", () => {
    assert.equal(resolveExecutable(tool, { PATH: "" }, "/"), tool);
    assert.equal(resolveExecutable("./kode", { PATH: "" }, dir), tool);
  });

  it("returns undefined for missing, empty and non-executable commands", () => {
    assert.equal(resolveExecutable("kode", { PATH: "/nonexistent" }, "/"), undefined);
    assert.equal(resolveExecutable("  ", { PATH: dir }, "/"), undefined);
    assert.equal(resolveExecutable("not-executable", { PATH: dir }, "/"), undefined);
    assert.equal(resolveExecutable(dir, { PATH: "" }, "/"), undefined, "a directory is no executable");
  });

  it("expands ~ and explains how to fix a missing server", () => {
    assert.equal(expandHome("~/bin/kode"), path.join(os.homedir(), "bin/kode"));
    assert.equal(expandHome("kode"), "kode");
    assert.match(notFoundMessage("kode"), /kode\.serverPath/);
  });
});
