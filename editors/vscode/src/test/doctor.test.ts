/**
 * `kode doctor --json` in the extension: the report turned into output lines and a
 * summary (pure), the process run (a fake `kode` script) and the `kode.doctor` command in
 * the fake VS Code (no real server, no model).
 */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { doctorReport, parseChecks, progressStep, runDoctor, type Check } from "../common/doctor";
import { install, recorded, vscode } from "./fakeVscode";

const OK: Check[] = [
  { name: "python", status: "OK", detail: "Python 3.11.7 (/venv/bin/python); Kode 0.1.0", fix: null },
  { name: "model default", status: "OK", detail: "Qwen2.5-Coder-1.5B-Instruct: 1,066 MiB, sha256 verified", fix: null },
];
const WARN: Check = {
  name: "machine load",
  status: "WARN",
  detail: "load 2.64 (1 min) on 2 core(s): the machine is busy",
  fix: "close what keeps it busy: python (pid 12, 95%)",
};
const FAIL: Check = {
  name: "model small",
  status: "FAIL",
  detail: "Qwen2.5-Coder-0.5B-Instruct: part 2 of 3 missing",
  fix: "kode models install small",
};

const json = (checks: unknown): string => JSON.stringify(checks, null, 2);

describe("doctorReport", () => {
  it("says all OK when every check passed", () => {
    const report = doctorReport({ code: 0, stdout: json(OK), stderr: "" });
    assert.equal(report.severity, "info");
    assert.equal(report.summary, "Kode setup: all 2 checks OK.");
    assert.deepEqual(
      report.lines.map((l) => l.text),
      [
        "OK    python: Python 3.11.7 (/venv/bin/python); Kode 0.1.0",
        "OK    model default: Qwen2.5-Coder-1.5B-Instruct: 1,066 MiB, sha256 verified",
        "Kode setup: all 2 checks OK.",
      ],
    );
  });

  it("names the warnings, with each fix below its check", () => {
    const report = doctorReport({ code: 0, stdout: json([...OK, WARN]), stderr: "" });
    assert.equal(report.severity, "warn");
    assert.equal(report.summary, "Kode setup: 1 warning (machine load). The fixes are in the Kode output.");
    assert.deepEqual(report.lines.slice(2, 4), [
      { level: "warn", text: "WARN  machine load: load 2.64 (1 min) on 2 core(s): the machine is busy" },
      { level: "warn", text: "      fix: close what keeps it busy: python (pid 12, 95%)" },
    ]);
  });

  it("reports a FAIL (exit status 1) as a problem, warnings beside it", () => {
    const report = doctorReport({ code: 1, stdout: json([...OK, WARN, FAIL]), stderr: "kode doctor: the load\n" });
    assert.equal(report.severity, "error");
    assert.equal(
      report.summary,
      "Kode setup: 1 problem (model small); 1 warning (machine load). The fixes are in the Kode output.",
    );
    assert.deepEqual(report.lines.slice(4, 6), [
      { level: "error", text: "FAIL  model small: Qwen2.5-Coder-0.5B-Instruct: part 2 of 3 missing" },
      { level: "error", text: "      fix: kode models install small" },
    ]);
    assert.equal(report.checks.length, 4);
  });

  it("says why malformed output is no report, with the end of stderr", () => {
    const crashed = doctorReport(
      { code: 1, stdout: "", stderr: "kode doctor: Python and Kode\nTraceback (most recent call last):\nImportError: x\n" },
      "/venv/bin/kode",
    );
    assert.equal(crashed.severity, "error");
    assert.equal(crashed.summary, "Kode: kode doctor failed: it printed no report (exit status 1).");
    assert.deepEqual(
      crashed.lines.map((l) => l.text),
      [
        "/venv/bin/kode doctor --json: it printed no report (exit status 1)",
        "  kode doctor: Python and Kode",
        "  Traceback (most recent call last):",
        "  ImportError: x",
      ],
    );
    assert.match(doctorReport({ code: 0, stdout: "[{", stderr: "" }).summary, /not JSON/);
    assert.match(doctorReport({ code: 0, stdout: "{}", stderr: "" }).summary, /not a list of checks/);
    assert.match(doctorReport({ code: 0, stdout: "[]", stderr: "" }).summary, /not a list of checks/);
    const badStatus = json([OK[0], { name: "x", status: "BAD", detail: "", fix: null }]);
    assert.match(doctorReport({ code: 0, stdout: badStatus, stderr: "" }).summary, /check 2 of its output/);
    assert.equal(typeof parseChecks(json([{ name: "x", status: "OK", detail: 3 }])), "string");
    assert.deepEqual(parseChecks(json([{ name: "x", status: "OK", detail: "d" }])), [
      { name: "x", status: "OK", detail: "d", fix: null },
    ]);
    const killed = doctorReport({ code: null, signal: "SIGKILL", stdout: "", stderr: "" });
    assert.match(killed.summary, /killed by SIGKILL/);
  });

  it("names a kode older than the command, a spawn error and a cancelled run", () => {
    const old = doctorReport({
      code: 2,
      stdout: "",
      stderr: "kode: error: argument command: invalid choice: 'doctor' (choose from 'lsp', 'complete')\n",
    });
    assert.match(old.summary, /older than `kode doctor`/);
    const error = Object.assign(new Error("spawn kode EACCES"), { code: "EACCES" });
    assert.match(doctorReport({ code: null, stdout: "", stderr: "", error }).summary, /could not be started \(EACCES\)/);
    const cancelled = doctorReport({ code: null, stdout: "", stderr: "", cancelled: true });
    assert.equal(cancelled.summary, "Kode: kode doctor cancelled.");
  });

  it("reads the steps from stderr", () => {
    assert.equal(progressStep("kode doctor: the load on the machine\n"), "the load on the machine");
    assert.equal(progressStep("some warning"), undefined);
  });
});

describe("runDoctor and the kode.doctor command", { skip: process.platform === "win32" }, () => {
  let dir = "";
  let fake = "";
  let slow = "";

  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "kode-doctor-"));
    fake = path.join(dir, "kode");
    // A `kode` that reports one FAIL: progress on stderr, the JSON on stdout, exit 1.
    fs.writeFileSync(
      fake,
      [
        "#!/bin/sh",
        'echo "args: $*" >&2',
        "echo 'kode doctor: Python and Kode' >&2",
        "echo 'kode doctor: the default models' >&2",
        `cat <<'EOF'\n${json([...OK, WARN, FAIL])}\nEOF`,
        "exit 1",
        "",
      ].join("\n"),
      { mode: 0o755 },
    );
    slow = path.join(dir, "slow-kode");
    fs.writeFileSync(slow, "#!/bin/sh\necho 'kode doctor: timing' >&2\nexec sleep 30\n", { mode: 0o755 });
  });

  after(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("runs <kode> doctor --json, passing the steps on", async () => {
    const steps: string[] = [];
    const run = await runDoctor(fake, ["--skip-model"], { onStep: (step) => steps.push(step) });
    assert.equal(run.code, 1);
    assert.match(run.stderr, /^args: doctor --json --skip-model$/m);
    assert.deepEqual(steps, ["Python and Kode", "the default models"]);
    assert.equal(doctorReport(run).checks.length, 4);
  });

  it("kills the process when cancelled, and says ENOENT for a missing one", async () => {
    const abort = new AbortController();
    const started = Date.now();
    const run = await runDoctor(slow, [], {
      signal: abort.signal,
      onStep: () => {
        abort.abort(); // as the progress notification's Cancel does, once it runs
      },
    });
    assert.equal(run.cancelled, true);
    assert.ok(Date.now() - started < 10_000, "not killed");
    assert.equal(doctorReport(run).summary, "Kode: kode doctor cancelled.");
    const missing = await runDoctor(path.join(dir, "nonexistent"));
    assert.equal(missing.error?.code, "ENOENT");
  });

  it("the command writes each check to the Kode output and sums them up", async () => {
    install();
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- after install(): doctor.js requires "vscode"
    const { runDoctorCommand } = require("../doctor") as typeof import("../doctor");
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- after install(): install.js requires "vscode"
    const { ServerInstaller } = require("../install") as typeof import("../install");
    const output = vscode.window.createOutputChannel("Kode") as unknown as {
      lines: string[];
    } & Parameters<typeof runDoctorCommand>[0];
    const context = { globalStorageUri: vscode.Uri.file(dir), extensionPath: dir, extension: { packageJSON: { version: "0.1.0" } } };
    const installer = new ServerInstaller(context as never, output, () => Promise.resolve());
    const source = { command: () => installer.command(), notFound: (command: string) => void installer.notFound(command) };
    recorded.userSettings["kode.serverPath"] = fake;
    await runDoctorCommand(output, source);
    assert.deepEqual(recorded.progress, ["Kode: checking the setup (kode doctor)", "Python and Kode", "the default models"]);
    assert.deepEqual(output.lines.slice(1), [
      "[info] OK    python: Python 3.11.7 (/venv/bin/python); Kode 0.1.0",
      "[info] OK    model default: Qwen2.5-Coder-1.5B-Instruct: 1,066 MiB, sha256 verified",
      "[warn] WARN  machine load: load 2.64 (1 min) on 2 core(s): the machine is busy",
      "[warn]       fix: close what keeps it busy: python (pid 12, 95%)",
      "[error] FAIL  model small: Qwen2.5-Coder-0.5B-Instruct: part 2 of 3 missing",
      "[error]       fix: kode models install small",
      "[error] Kode setup: 1 problem (model small); 1 warning (machine load). The fixes are in the Kode output.",
    ]);
    assert.deepEqual(recorded.errors, [
      "Kode setup: 1 problem (model small); 1 warning (machine load). The fixes are in the Kode output.",
    ]);

    recorded.errors.length = 0;
    recorded.userSettings["kode.serverPath"] = "/nonexistent/bin/kode";
    await runDoctorCommand(output, source);
    assert.equal(recorded.errors.length, 1);
    assert.match(recorded.errors[0] ?? "", /"\/nonexistent\/bin\/kode" was not found.*kode\.serverPath/);
  });
});
