/**
 * Streamed ("partial") inline completions on top of VS Code's pull-based provider API.
 *
 * VS Code asks `provideInlineCompletionItems(document, position, context, token)` and
 * shows what that call returns; it has no way to push more text later. The server, with
 * `partialCompletions` on, sends `kode/inlineCompletionPartial` while one request's
 * answer grows. To show that text growing:
 *
 * 1. One *session* per request: a key (uri, document version, position), the request's
 *    own cancellation source, and the newest partial text. A provide call for the same
 *    key joins the running session instead of sending a second request.
 * 2. A provide call answers with the newest partial text it has not handed out yet, or
 *    waits for the next partial or the final answer.
 * 3. When a partial arrives and no call is waiting, the extension asks VS Code to ask
 *    again; that call joins the session (2) and returns the longer text. At most one such
 *    re-ask is outstanding at a time. (How VS Code is made to ask again is the caller's
 *    business: `retrigger` in server.ts.)
 * 4. The final answer is authoritative: it is what later calls for the key get, and if a
 *    partial had been shown, one more re-ask replaces it.
 *
 * Cancellation: re-asking makes VS Code cancel the previous call's token, so that token
 * cannot be forwarded to the server as is. The request is cancelled ($/cancelRequest)
 * when the user has moved on instead: a provide call for another key, an edit of the
 * document, the cursor leaving the position, the editor losing focus, Escape, or a
 * waiting call cancelled with no call for the same key following within `graceMs`.
 *
 * Partials are drawn only when they name the session's request id (learnt from the
 * outgoing message, see tap.ts) and its document version.
 */

import type { PartialParams } from "./protocol";
import type { SentCompletionRequest } from "./tap";

/** What VS Code's `CancellationToken` offers (and what the tests fake). */
export interface CancellationLike {
  readonly isCancellationRequested: boolean;
  onCancellationRequested(listener: () => void): { dispose(): void };
}

/** A cancellation source whose token is passed to the language client's request. */
export interface SourceLike<T> {
  readonly token: T;
  cancel(): void;
  dispose(): void;
}

export interface CompletionKey {
  uri: string;
  version: number;
  line: number;
  character: number;
  /**
   * The item selected in the editor's suggest widget (VS Code's `selectedCompletionInfo`,
   * its range and text), if one is: the server completes as if it were accepted, so a
   * request for another item, or for none, is a different request.
   */
  selected?: string | undefined;
}

export type Outcome<R> =
  | { kind: "partial"; text: string }
  | { kind: "final"; result: R }
  | { kind: "none" };

export interface StreamingOptions<T> {
  createSource(): SourceLike<T>;
  /** Ask the editor to call `provide` again (VS Code: `editor.action.inlineSuggest.trigger`). */
  retrigger(uri: string): void;
  /** How long a request whose waiting call was cancelled lives on, awaiting a re-ask. */
  graceMs?: number;
  /** After this, a re-ask that brought no provide call no longer blocks the next one. */
  retriggerTimeoutMs?: number;
  /** Diagnostics (positions and reasons only, never document text). */
  log?(message: string): void;
}

const NONE = { kind: "none" } as const;

function sameKey(a: CompletionKey, b: CompletionKey): boolean {
  return (
    a.uri === b.uri &&
    a.version === b.version &&
    a.line === b.line &&
    a.character === b.character &&
    a.selected === b.selected
  );
}

class Session<R, T> {
  requestId: number | string | undefined;
  /** Newest partial text from the server. */
  latest: string | undefined;
  /** Newest text handed to the editor. */
  shown: string | undefined;
  /** Set once the request settled (or was cancelled). */
  outcome: Outcome<R> | undefined;
  /** Provide calls so far; the orphan timer checks that none came meanwhile. */
  asks = 0;
  retriggerPending = false;
  readonly waiters = new Set<(outcome: Outcome<R>) => void>();
  readonly timers = new Set<ReturnType<typeof setTimeout>>();

  constructor(
    readonly key: CompletionKey,
    readonly source: SourceLike<T>,
  ) {}

  resolveWaiters(outcome: Outcome<R>): void {
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const resolve of waiters) {
      resolve(outcome);
    }
  }

  clearTimers(): void {
    for (const timer of this.timers) {
      clearTimeout(timer);
    }
    this.timers.clear();
  }
}

export class StreamingCompletions<R, T> {
  private session: Session<R, T> | undefined;
  private readonly graceMs: number;
  private readonly retriggerTimeoutMs: number;

  constructor(private readonly options: StreamingOptions<T>) {
    this.graceMs = options.graceMs ?? 200;
    this.retriggerTimeoutMs = options.retriggerTimeoutMs ?? 1000;
  }

  /** The running request's key, if any (for tests and diagnostics). */
  get current(): CompletionKey | undefined {
    return this.session?.outcome === undefined ? this.session?.key : undefined;
  }

  /**
   * Answer one provide call: join the session for `key` or start one with `start`
   * (which sends the request with the given token and resolves to its final result).
   */
  provide(
    key: CompletionKey,
    token: CancellationLike,
    start: (token: T) => PromiseLike<R | null | undefined>,
  ): Promise<Outcome<R>> {
    if (token.isCancellationRequested) {
      return Promise.resolve(NONE);
    }
    let session = this.session;
    if (!session || !sameKey(session.key, key)) {
      this.cancel("another place");
      session = this.begin(key, start);
    }
    session.asks += 1;
    session.retriggerPending = false;
    if (session.outcome) {
      return Promise.resolve(session.outcome);
    }
    if (session.latest !== undefined && session.latest !== session.shown) {
      session.shown = session.latest;
      return Promise.resolve({ kind: "partial", text: session.latest });
    }
    return this.wait(session, token);
  }

  /** The writer saw an inline-completion request go out: bind its id to the session. */
  requestSent(request: SentCompletionRequest): void {
    const session = this.session;
    if (
      session &&
      session.requestId === undefined &&
      session.outcome === undefined &&
      session.key.uri === request.uri &&
      session.key.line === request.position.line &&
      session.key.character === request.position.character
    ) {
      session.requestId = request.id;
    }
  }

  /** A `kode/inlineCompletionPartial` notification. Returns whether it was taken. */
  partial(params: PartialParams): boolean {
    const session = this.session;
    if (
      !session ||
      session.outcome !== undefined ||
      session.requestId === undefined ||
      params.requestId !== session.requestId ||
      params.textDocument.uri !== session.key.uri ||
      params.textDocument.version !== session.key.version ||
      params.text === "" ||
      params.text === session.latest
    ) {
      return false;
    }
    session.latest = params.text;
    if (session.waiters.size > 0) {
      session.shown = params.text;
      session.resolveWaiters({ kind: "partial", text: params.text });
    } else {
      this.retrigger(session);
    }
    return true;
  }

  /** The document was edited: its running request is stale. */
  documentChanged(uri: string): void {
    if (this.session?.key.uri === uri) {
      this.cancel("document changed");
    }
  }

  /** The cursor is now at `line:character` in `uri` (VS Code: the primary selection). */
  cursorMoved(uri: string, line: number, character: number): void {
    const key = this.session?.key;
    if (key && (key.uri !== uri || key.line !== line || key.character !== character)) {
      this.cancel("cursor moved");
    }
  }

  /** Cancel the running request (Escape, focus change, disable, shutdown). */
  cancel(reason = "cancelled"): void {
    const session = this.session;
    if (!session) {
      return;
    }
    this.session = undefined;
    session.clearTimers();
    if (session.outcome === undefined) {
      this.options.log?.(`request ${String(session.requestId)} cancelled: ${reason}`);
      session.outcome = NONE;
      session.source.cancel();
    }
    session.resolveWaiters(NONE);
    session.source.dispose();
  }

  dispose(): void {
    this.cancel("disposed");
  }

  private begin(key: CompletionKey, start: (token: T) => PromiseLike<R | null | undefined>): Session<R, T> {
    const session = new Session<R, T>(key, this.options.createSource());
    this.session = session;
    const settle = (outcome: Outcome<R>): void => {
      if (session.outcome !== undefined) {
        return; // cancelled meanwhile
      }
      session.outcome = outcome;
      session.clearTimers();
      if (session.waiters.size > 0) {
        session.resolveWaiters(outcome);
      } else if (session.shown !== undefined && this.session === session) {
        this.options.retrigger(key.uri); // replace the partial with the final answer
      }
    };
    start(session.source.token).then(
      (result) => {
        settle(result === null || result === undefined ? NONE : { kind: "final", result });
      },
      () => {
        settle(NONE);
      },
    );
    return session;
  }

  private wait(session: Session<R, T>, token: CancellationLike): Promise<Outcome<R>> {
    return new Promise<Outcome<R>>((resolve) => {
      const subscriptions: { dispose(): void }[] = [];
      const finish = (outcome: Outcome<R>): void => {
        for (const subscription of subscriptions) {
          subscription.dispose();
        }
        resolve(outcome);
      };
      session.waiters.add(finish);
      subscriptions.push(
        token.onCancellationRequested(() => {
          if (session.waiters.delete(finish)) {
            finish(NONE);
            this.orphanCheck(session);
          }
        }),
      );
    });
  }

  /** A waiting call was cancelled: unless someone asks again soon, stop the request. */
  private orphanCheck(session: Session<R, T>): void {
    if (session.waiters.size > 0 || session.outcome !== undefined) {
      return;
    }
    const asks = session.asks;
    const timer = setTimeout(() => {
      session.timers.delete(timer);
      if (this.session === session && session.asks === asks && session.waiters.size === 0) {
        this.cancel("no re-ask");
      }
    }, this.graceMs);
    session.timers.add(timer);
  }

  private retrigger(session: Session<R, T>): void {
    if (session.retriggerPending) {
      return;
    }
    session.retriggerPending = true;
    const timer = setTimeout(() => {
      session.timers.delete(timer);
      session.retriggerPending = false;
    }, this.retriggerTimeoutMs);
    session.timers.add(timer);
    this.options.retrigger(session.key.uri);
  }
}
