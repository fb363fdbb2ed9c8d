/**
 * Installing the server from VS Code: the pure parts (the installer's lines as a progress
 * notification, the outcome, which server to start, which Python), the installer run as a
 * process (its fake steps, tests/fakes/install_steps.py: the protocol, a cancel and the
 * resume), and the offer in the fake VS Code: no server found, "Install the Kode Server"
 * pressed, the server installed and started without a reload, and a server of another
 * version named with an update.
 */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { resolveExecutable } from "../common/executable";
import {
  findBundle,
  findPython,
  type InstallEvent,
  installedKode,
  installOutcome,
  parseEvent,
  ProgressText,
  runInstaller,
  serverCommand,
  versionMismatch,
} from "../common/install";
import { install, recorded, vscode } from "./fakeVscode";

const ROOT = path.resolve(__dirname, "..", "..", "..", "..");
const FAKE_STEPS = path.join(ROOT, "tests", "fakes", "install_steps.py");
const STEP_MS = 60_000;

/** The Python next to KODE_BIN (the test venv's), else python3 on PATH. */
function python(): string {
  const kode = resolveExecutable(process.env.KODE_BIN ?? "kode", process.env, process.cwd());
  const beside = kode && path.join(path.dirname(kode), "python3");
  const found = beside && fs.existsSync(beside) ? beside : resolveExecutable("python3", process.env, process.cwd());
  assert.ok(found, "no Python to run the installer with");
  return found;
}

async function until(what: string, ms: number, probe: () => boolean): Promise<void> {
  const deadline = Date.now() + ms;
  while (!probe()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function temp(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

describe("the installer's lines", () => {
  it("become a notification's message and percent increments that never go back", () => {
    const text = new ProgressText();
    const lines: InstallEvent[] = [
      { event: "start" },
      { event: "skip", step: "venv", index: 1, total: 3, title: "Making the environment", overall: 0.1 },
      { event: "step", step: "llama", index: 2, total: 3, title: "Building llama.cpp", overall: 0.1 },
      { event: "progress", step: "llama", message: "[1/2] ggml.c", overall: 0.5 },
      { event: "progress", step: "llama", message: "back", overall: 0.4 },
      { event: "step", step: "models", index: 3, total: 3, title: "Assembling the models", overall: 0.8 },
      { event: "done", overall: 1 },
    ];
    const shown = lines.map((line) => text.update(line));
    assert.deepEqual(shown, [
      undefined,
      { message: "1/3 Making the environment", increment: 10 },
      { message: "2/3 Building llama.cpp", increment: 0 },
      { message: "2/3 Building llama.cpp: [1/2] ggml.c", increment: 40 },
      { message: "2/3 Building llama.cpp: back", increment: 0 },
      { message: "3/3 Assembling the models", increment: 30 },
      undefined,
    ]);
    assert.equal(parseEvent('{"event": "done", "kode": "/k"}')?.kode, "/k");
    assert.equal(parseEvent("Collecting pip"), undefined);
    assert.equal(parseEvent('{"event": "other"}'), undefined);
  });

  it("end in one notification: installed, cancelled, or what failed and its fix", () => {
    const done = installOutcome({ code: 0, cancelled: false, done: { event: "done", version: "0.1.0", seconds: 372 } }, "py");
    assert.deepEqual(done, { message: "Kode: the server (Kode 0.1.0) is installed in 6 min 12 s.", severity: "info" });
    assert.equal(installOutcome({ code: 130, cancelled: true }, "py").message, "Kode: the install was cancelled; install again to go on where it stopped.");
    const lacking = installOutcome(
      { code: 3, cancelled: false, error: { event: "error", message: "no C and no C++ compiler on PATH", fix: "sudo apt install build-essential" } },
      "py",
    );
    assert.deepEqual(lacking, {
      message: "Kode: the server could not be installed: no C and no C++ compiler on PATH. To fix it: sudo apt install build-essential",
      severity: "error",
      fix: "sudo apt install build-essential",
    });
    const failed = installOutcome({ code: 1, cancelled: false, error: { event: "error", message: "pip install failed (exit status 1):\nERROR: x", fix: null } }, "py");
    assert.equal(failed.message, "Kode: the server could not be installed: pip install failed (exit status 1):.");
    assert.equal(failed.fix, undefined);
  });

  it("a server of another version is named; which server starts", () => {
    assert.equal(versionMismatch("0.1.0", "0.1.0"), undefined);
    assert.equal(versionMismatch(undefined, "0.1.0"), undefined);
    assert.equal(versionMismatch("0.0.9", "0.1.0"), "Kode: the server is Kode 0.0.9, this extension Kode 0.1.0.");
    assert.equal(serverCommand("/my/kode", "/installed/kode"), "/my/kode");
    assert.equal(serverCommand(undefined, "/installed/kode"), "/installed/kode");
    assert.equal(serverCommand(undefined, undefined), "kode");
  });
});

describe("what the extension installs", () => {
  it("is the wheel and installer in dist/, else the repository it was built in", () => {
    const root = temp("kode-bundle-");
    try {
      const extension = path.join(root, "editors", "vscode");
      fs.mkdirSync(path.join(extension, "dist", "install"), { recursive: true });
      assert.equal(findBundle(extension), undefined, "nothing to install");
      fs.mkdirSync(path.join(root, "editors", "install"));
      fs.writeFileSync(path.join(root, "editors", "install", "kode_install.py"), "");
      fs.writeFileSync(path.join(root, "pyproject.toml"), "");
      const repository = { script: path.join(root, "editors", "install", "kode_install.py"), source: root };
      assert.deepEqual(findBundle(extension), repository, "run from a clone: the repository");
      fs.writeFileSync(path.join(extension, "dist", "kode-0.1.0-py3-none-any.whl"), "");
      assert.deepEqual(findBundle(extension), repository, "a wheel without the installer");
      fs.writeFileSync(path.join(extension, "dist", "install", "kode_install.py"), "");
      assert.deepEqual(findBundle(extension), {
        script: path.join(extension, "dist", "install", "kode_install.py"),
        source: path.join(extension, "dist", "kode-0.1.0-py3-none-any.whl"),
      });
    } finally {
      fs.rmSync(root, { recursive: true, force: true });
    }
  });
});

describe("finding a Python", { skip: process.platform === "win32" }, () => {
  let bin = "";
  const fake = (name: string, script: string): string => {
    const file = path.join(bin, name);
    fs.writeFileSync(file, `#!/bin/sh\n${script}\n`, { mode: 0o755 });
    return file;
  };

  before(() => {
    bin = temp("kode-python-");
  });

  after(() => {
    fs.rmSync(bin, { recursive: true, force: true });
  });

  it("takes the first 3.11+, skips one that does not run, else the first that runs", async () => {
    fake("python3.13", "echo 'pyenv: python3.13: command not found' >&2; exit 127");
    const old = fake("python3.12", "echo 3 10 12");
    const recent = fake("python3", "echo 3 11 4");
    const chosen = fake("chosen-python", "echo 3 12 1");
    const env = { PATH: bin };
    assert.deepEqual(await findPython([], env, bin), { executable: recent, version: [3, 11, 4] });
    assert.deepEqual(await findPython([chosen], env, bin), { executable: chosen, version: [3, 12, 1] });
    fs.rmSync(recent);
    // None recent enough: the old one runs the installer, which says what to install.
    assert.deepEqual(await findPython([], env, bin), { executable: old, version: [3, 10, 12] });
    fs.rmSync(old);
    assert.equal(await findPython([], env, bin), undefined);
  });
});

describe("the installer as a process (fake steps)", { timeout: 4 * STEP_MS }, () => {
  let target = "";

  before(() => {
    target = path.join(temp("kode-install-"), "server");
  });

  after(() => {
    fs.rmSync(path.dirname(target), { recursive: true, force: true });
  });

  it("says when the Python cannot be started", async () => {
    const run = await runInstaller({ python: path.join(target, "no-python"), script: FAKE_STEPS, target, source: ROOT });
    assert.equal(run.spawnError?.code, "ENOENT");
    assert.equal(installOutcome(run, "/x/python3").message, `Kode: could not run /x/python3: ${run.spawnError.message}`);
  });

  it("is cancelled by the abort signal half way, then resumes and completes", async () => {
    const abort = new AbortController();
    const events: InstallEvent[] = [];
    const output: string[] = [];
    const cancelled = await runInstaller({
      python: python(),
      script: FAKE_STEPS,
      target,
      source: ROOT,
      signal: abort.signal,
      env: { ...process.env, KODE_TEST_BLOCK: "1" },
      onEvent: (event) => {
        events.push(event);
        if (event.message === "blocking") {
          abort.abort(); // as the notification's Cancel does
        }
      },
      onOutput: (line) => output.push(line),
    });
    assert.equal(cancelled.code, 130);
    assert.equal(cancelled.cancelled, true);
    assert.equal(events.at(-1)?.event, "cancelled");
    assert.ok(output.some((line) => line.startsWith("$ ")), "the commands' output reaches the log lines");
    assert.equal(installedKode(target), undefined, "a cancelled install is not used");

    const steps: string[] = [];
    const resumed = await runInstaller({
      python: python(),
      script: FAKE_STEPS,
      target,
      source: ROOT,
      onEvent: (event) => steps.push(`${event.event} ${event.step ?? ""}`.trim()),
    });
    assert.equal(resumed.code, 0);
    assert.deepEqual(steps.slice(1, 4), ["skip venv", "skip fetch", "step block"]);
    const kode = path.join(target, "current", "bin", "kode");
    assert.equal(resumed.done?.kode, kode);
    assert.equal(installedKode(target), kode);
  });
});

describe("the offer in a fake VS Code", { timeout: 5 * STEP_MS }, () => {
  const storage = temp("kode-storage-");
  const packageJSON = { version: "0.1.0" };
  const context = {
    subscriptions: [] as { dispose(): unknown }[],
    globalStorageUri: { fsPath: storage },
    extensionPath: path.join(storage, "extension"),
    extension: { packageJSON },
  };
  let extension: typeof import("../extension");
  const path0 = process.env.PATH;
  const status = (): string => recorded.statusItems.at(0)?.text ?? "";

  before(() => {
    // The extension as packaged: dist/ with the installer (here one that runs the fake
    // steps from this repository) and a wheel (here a stand-in: the fake steps install
    // from the repository).
    const dist = path.join(context.extensionPath, "dist");
    fs.mkdirSync(path.join(dist, "install"), { recursive: true });
    fs.writeFileSync(path.join(dist, "kode-0.1.0-py3-none-any.whl"), "");
    fs.writeFileSync(
      path.join(dist, "install", "kode_install.py"),
      `import runpy, sys\nsys.argv = [${JSON.stringify(FAKE_STEPS)}, sys.argv[1], ${JSON.stringify(ROOT)}]\n` +
        `runpy.run_path(${JSON.stringify(FAKE_STEPS)}, run_name="__main__")\n`,
    );
    // A fresh machine: no kode on PATH, a Python and compilers (the installer checks for
    // them); the installed kode runs the real one.
    const kode = resolveExecutable(process.env.KODE_BIN ?? "kode", process.env, process.cwd());
    assert.ok(kode, "the Kode server was not found: set KODE_BIN to the kode executable");
    const bin = path.join(storage, "bin");
    fs.mkdirSync(bin);
    fs.symlinkSync(python(), path.join(bin, "python3"));
    for (const compiler of ["cc", "c++"]) {
      const found = resolveExecutable(compiler, process.env, process.cwd());
      assert.ok(found, `no ${compiler} on PATH: the installer would refuse`);
      fs.symlinkSync(found, path.join(bin, compiler));
    }
    process.env.PATH = bin;
    process.env.KODE_TEST_SERVER = kode;
    recorded.userSettings["kode.model"] = "small";
    recorded.userSettings["kode.engineIdleMinutes"] = 0; // the shared engine ends with the test
    install();
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- after install(): extension.js requires "vscode"
    extension = require("../extension") as typeof import("../extension");
  });

  after(async () => {
    await extension.deactivate();
    for (const subscription of context.subscriptions) {
      subscription.dispose();
    }
    process.env.PATH = path0;
    fs.rmSync(storage, { recursive: true, force: true });
  });

  it("offers the install when no server is found, installs it and starts it", async () => {
    const offered: string[][] = [];
    recorded.choose = (_message, buttons) => {
      offered.push(buttons);
      return buttons.includes("Install the Kode Server") ? "Install the Kode Server" : undefined;
    };
    await extension.activate(context as never);
    await until("the installed server to run", STEP_MS, () => status().startsWith("$(sparkle)")).catch((error: unknown) => {
      const seen = { errors: recorded.errors, infos: recorded.infos, progress: recorded.progress, status: status() };
      throw new Error(`${String(error)}\n${JSON.stringify(seen, null, 2)}`);
    });
    assert.match(recorded.errors[0] ?? "", /"kode" was not found\. Install it here \("Install the Kode Server"/);
    assert.deepEqual(offered[0], ["Install the Kode Server", "Open Settings"]);
    assert.equal(recorded.progress[0], "Kode: installing the server");
    assert.ok(recorded.progress.includes("3/5 Blocking"), recorded.progress.join("\n"));
    assert.match(recorded.infos.at(-1) ?? "", /^Kode: the server \(Kode 0\.1\.0\) is installed in \d+ s\.$/);
    assert.equal(installedKode(path.join(storage, "server")), path.join(storage, "server", "current", "bin", "kode"));
    assert.equal(recorded.errors.length, 1, recorded.errors.join("\n"));
  });

  it("names a server whose version differs from the extension's, with an update", async () => {
    recorded.errors.length = 0;
    const offered: string[][] = [];
    recorded.choose = (message, buttons) => {
      offered.push([message, ...buttons]);
      return undefined;
    };
    packageJSON.version = "9.9.9";
    await vscode.commands.executeCommand("kode.restartServer");
    await until("the warning", STEP_MS, () => offered.length > 0);
    assert.deepEqual(offered[0], ["Kode: the server is Kode 0.1.0, this extension Kode 9.9.9.", "Update the Server"]);
  });

  it("installs with the Python extension's interpreter when it has one", async () => {
    // A Python the Python extension selected (3.12, off PATH) that notes its installer runs.
    const chosen = path.join(storage, "selected", "python");
    fs.mkdirSync(path.dirname(chosen));
    fs.writeFileSync(
      chosen,
      `#!/bin/sh\nif [ "$1" = -c ]; then echo 3 12 1; exit; fi\necho "$@" > ${chosen}.ran\nexec ${python()} "$@"\n`,
      { mode: 0o755 },
    );
    const api = {
      environments: {
        getActiveEnvironmentPath: () => ({ path: path.dirname(chosen) }),
        resolveEnvironment: () => Promise.resolve({ executable: { uri: vscode.Uri.file(chosen) } }),
      },
    };
    Object.assign(vscode, {
      extensions: { getExtension: (id: string) => (id === "ms-python.python" ? { isActive: true, exports: api } : undefined) },
    });
    recorded.choose = () => undefined;
    packageJSON.version = "0.1.0";
    const kode = await vscode.commands.executeCommand("kode.installServer");
    assert.equal(kode, path.join(storage, "server", "current", "bin", "kode"));
    assert.match(fs.readFileSync(`${chosen}.ran`, "utf8"), /kode_install\.py .*server/);
  });
});
