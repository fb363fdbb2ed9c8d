/**
 * Protocol-level test against the real server: spawns `kode lsp` (KODE_BIN, else `kode`
 * on PATH) with the small model, and talks to it the way the extension does (same
 * initialization options, same tapped writer), without VS Code.
 *
 * `kode/inlineCompletionPartial` notifications are checked when the server sends them;
 * KODE_EXPECT_PARTIALS=1 requires them for the multi-line completion.
 */

import assert from "node:assert/strict";
import * as cp from "node:child_process";
import * as os from "node:os";
import { after, before, describe, it } from "node:test";

import {
  CancellationTokenSource,
  createProtocolConnection,
  DidChangeConfigurationNotification,
  DidOpenTextDocumentNotification,
  ExitNotification,
  InitializedNotification,
  InitializeRequest,
  InlineCompletionRequest,
  type InlineCompletionList,
  type ProtocolConnection,
  ResponseError,
  ShowMessageNotification,
  type ShowMessageParams,
  ShutdownRequest,
  StreamMessageReader,
  StreamMessageWriter,
} from "vscode-languageserver-protocol/node";

import { resolveExecutable } from "../common/executable";
import {
  isPartialParams,
  type KodeStats,
  type PartialParams,
  PARTIAL_METHOD,
  REQUEST_CANCELLED,
  STATS_METHOD,
} from "../common/protocol";
import { SERVER_KEYS } from "../common/settings";
import { type SentCompletionRequest, TappedWriter } from "../common/tap";
import { contributedDefaults } from "./helpers";

const STEP_MS = 60_000;
const URI = "file:///tmp/kode-vscode-test/fib.py";
const SOURCE = [
  "def fibonacci(n: int) -> int:",
  '    """Return the n-th Fibonacci number."""',
  "    ",
  "",
].join("\n");
// Opening a dict at the end of a line: the small model lists entries for hundreds of tokens.
const LONG_URI = "file:///tmp/kode-vscode-test/http.py";
const LONG_SOURCE = ['"""HTTP helpers."""', "", "HTTP_STATUS_PHRASES = {", ""].join("\n");
const LONG_POSITION = { line: 2, character: 23 };
// Small and short: the test shares two slow cores with the server.
// engineIdleMinutes 0: the shared engine ends with the test's server, not 30 minutes later.
const INIT_OPTIONS = {
  model: "small",
  partialCompletions: true,
  maxTokens: 48,
  snippetTokens: 0,
  engineIdleMinutes: 0,
};

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new Error(`timed out after ${ms} ms: ${what}`));
    }, ms);
  });
  return Promise.race([promise, timeout]).finally(() => {
    clearTimeout(timer);
  });
}

async function until<T>(probe: () => Promise<T | undefined>, ms: number, what: string): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Partials of one request must name its document version and position, each extending the last. */
function checkPartials(
  partials: PartialParams[],
  uri: string,
  position: { line: number; character: number },
  version: number,
): void {
  for (const [i, partial] of partials.entries()) {
    assert.equal(partial.textDocument.uri, uri);
    assert.equal(partial.textDocument.version, version);
    assert.deepEqual(partial.position, position);
    const previous = partials[i - 1]?.text ?? "";
    assert.ok(partial.text.startsWith(previous), `partial ${i} does not extend the previous one`);
    assert.ok(partial.text.length > previous.length, `partial ${i} adds nothing`);
  }
}

describe("kode lsp over stdio", { timeout: 5 * STEP_MS }, () => {
  let child: cp.ChildProcessWithoutNullStreams;
  let connection: ProtocolConnection;
  const stderr: string[] = [];
  const messages: string[] = [];
  const partials: PartialParams[] = [];
  const sent: SentCompletionRequest[] = [];
  const version = 1;

  const stats = (): Promise<KodeStats> =>
    withTimeout(connection.sendRequest<KodeStats>(STATS_METHOD, {}), STEP_MS, STATS_METHOD);

  const complete = (line: number, character: number, token?: CancellationTokenSource, uri = URI) =>
    connection.sendRequest(
      InlineCompletionRequest.type,
      { textDocument: { uri }, position: { line, character }, context: { triggerKind: 1 } },
      token?.token,
    );

  before(async () => {
    const command = process.env.KODE_BIN ?? "kode";
    const executable = resolveExecutable(command, process.env, process.cwd());
    assert.ok(
      executable,
      `the Kode server "${command}" was not found: set KODE_BIN to the kode executable (e.g. .venv/bin/kode)`,
    );
    child = cp.spawn(executable, ["lsp"], { cwd: os.tmpdir(), env: process.env, stdio: "pipe" });
    child.stderr.on("data", (chunk: Buffer) => stderr.push(chunk.toString()));
    connection = createProtocolConnection(
      new StreamMessageReader(child.stdout),
      new TappedWriter(new StreamMessageWriter(child.stdin), (request) => sent.push(request)),
    );
    connection.onNotification(ShowMessageNotification.type, (params: ShowMessageParams) => {
      messages.push(params.message);
    });
    connection.onNotification(PARTIAL_METHOD, (params: unknown) => {
      assert.ok(isPartialParams(params), `malformed ${PARTIAL_METHOD}: ${JSON.stringify(params)}`);
      partials.push(params);
    });
    connection.listen();
    const result = await withTimeout(
      connection.sendRequest(InitializeRequest.type, {
        processId: process.pid,
        // eslint-disable-next-line @typescript-eslint/no-deprecated -- still a required field
        rootUri: null,
        capabilities: {},
        initializationOptions: INIT_OPTIONS,
      }),
      STEP_MS,
      "initialize",
    );
    assert.ok(result.capabilities.inlineCompletionProvider, "the server offers no inline completions");
    await connection.sendNotification(InitializedNotification.type, {});
    await connection.sendNotification(DidOpenTextDocumentNotification.type, {
      textDocument: { uri: URI, languageId: "python", version, text: SOURCE },
    });
    await connection.sendNotification(DidOpenTextDocumentNotification.type, {
      textDocument: { uri: LONG_URI, languageId: "python", version, text: LONG_SOURCE },
    });
  });

  after(async () => {
    try {
      await withTimeout(connection.sendRequest(ShutdownRequest.type), 10_000, "shutdown");
      await connection.sendNotification(ExitNotification.type);
    } catch {
      // the process is killed below anyway
    }
    const exited = new Promise((resolve) => child.once("exit", resolve));
    if (child.exitCode === null) {
      await withTimeout(exited, 5_000, "exit").catch(() => child.kill("SIGKILL"));
    }
    connection.dispose();
  });

  it("takes the initialization options as settings", async () => {
    const { settings } = await stats();
    assert.equal(settings.model, "small");
    assert.equal(settings.partialCompletions, true);
    assert.deepEqual(messages, [], `the server rejected a setting: ${messages.join("; ")}`);
  });

  it("has the defaults that package.json contributes", async () => {
    const { settings } = await stats();
    const defaults = contributedDefaults();
    for (const key of SERVER_KEYS) {
      if (key in INIT_OPTIONS) {
        continue;
      }
      assert.deepEqual(settings[key], defaults.get(`kode.${key}`), `default of kode.${key}`);
    }
    const remote = settings.remote as Record<string, unknown>;
    for (const [key, value] of Object.entries(remote)) {
      assert.deepEqual(value, defaults.get(`kode.remote.${key}`), `default of kode.remote.${key}`);
    }
  });

  it("completes with the small model", async () => {
    const result = (await withTimeout(complete(2, 4), STEP_MS, "inline completion")) as InlineCompletionList;
    const text = result.items[0]?.insertText;
    assert.equal(typeof text, "string", `no completion: ${JSON.stringify(result)}`);
    assert.ok((text as string).trim().length > 0, "empty completion");
    assert.deepEqual(result.items[0]?.range, {
      start: { line: 2, character: 4 },
      end: { line: 2, character: 4 },
    });
    // A multi-line completion streams its text first (partialCompletions is on).
    const id = sent.at(-1)?.id;
    assert.notEqual(id, undefined, "the tapped writer saw no inline-completion request");
    const mine = partials.filter((partial) => partial.requestId === id);
    if (process.env.KODE_EXPECT_PARTIALS === "1") {
      assert.ok(mine.length > 0, `no ${PARTIAL_METHOD} for request ${String(id)}`);
    }
    checkPartials(mine, URI, { line: 2, character: 4 }, version);
    const after = await stats();
    assert.equal(after.backend, "llama.cpp");
    assert.match(after.model ?? "", /0\.5b/i);
    assert.ok((after.counters?.last.completionTokens ?? 0) > 0);
  });

  it("answers a cancelled request with RequestCancelled (-32800)", async () => {
    await connection.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { kode: { ...INIT_OPTIONS, maxTokens: 512, maxLines: 200, multiline: "always" } },
    });
    const before = (await stats()).counters?.cancelled ?? 0;
    const token = new CancellationTokenSource();
    const request = complete(LONG_POSITION.line, LONG_POSITION.character, token, LONG_URI);
    setTimeout(() => {
      token.cancel();
    }, 300);
    const error = await withTimeout(
      request.then(
        (result) => assert.fail(`not cancelled, answered ${JSON.stringify(result)}`),
        (reason: unknown) => reason,
      ),
      STEP_MS,
      "the cancelled request's answer",
    );
    assert.ok(error instanceof ResponseError, `expected a ResponseError, got ${String(error)}`);
    assert.equal(error.code, REQUEST_CANCELLED);
    await until(
      async () => (((await stats()).counters?.cancelled ?? 0) > before ? true : undefined),
      10_000,
      "counters.cancelled to grow",
    );

    checkPartials(
      partials.filter((partial) => partial.requestId === sent.at(-1)?.id),
      LONG_URI,
      LONG_POSITION,
      version,
    );
  });

  it("still completes after a cancel", async () => {
    await connection.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { kode: { ...INIT_OPTIONS, maxTokens: 32 } },
    });
    const result = (await withTimeout(complete(2, 4), STEP_MS, "inline completion")) as InlineCompletionList;
    assert.ok(result.items.length > 0, "no completion after a cancel");
    assert.deepEqual(messages, [], `the server complained: ${messages.join("; ")}`);
  });
});
