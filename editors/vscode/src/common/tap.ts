/**
 * A `MessageWriter` that reports each outgoing `textDocument/inlineCompletion` request.
 *
 * `kode/inlineCompletionPartial` names its request by JSON-RPC id, and the language
 * client does not expose the ids it assigns. The writer is the one place that sees them,
 * so the extension wraps the server's stdin writer with this and learns
 * "request 17 is the inline completion for file:///a.py at 3:8".
 */

import type { Event, Message, MessageWriter } from "vscode-languageserver-protocol";

import { INLINE_COMPLETION_METHOD, type LspPosition } from "./protocol";

export interface SentCompletionRequest {
  id: number | string;
  uri: string;
  position: LspPosition;
}

interface RequestLike {
  id?: unknown;
  method?: unknown;
  params?: unknown;
}

/** The inline-completion request in `message`, or undefined for anything else. */
export function inlineCompletionRequest(message: Message): SentCompletionRequest | undefined {
  const { id, method, params } = message as RequestLike;
  if (method !== INLINE_COMPLETION_METHOD || (typeof id !== "number" && typeof id !== "string")) {
    return undefined;
  }
  const p = params as { textDocument?: { uri?: unknown }; position?: Partial<LspPosition> } | undefined;
  const uri = p?.textDocument?.uri;
  const line = p?.position?.line;
  const character = p?.position?.character;
  if (typeof uri !== "string" || typeof line !== "number" || typeof character !== "number") {
    return undefined;
  }
  return { id, uri, position: { line, character } };
}

export class TappedWriter implements MessageWriter {
  constructor(
    private readonly inner: MessageWriter,
    private readonly onSent: (request: SentCompletionRequest) => void,
  ) {}

  get onError(): Event<[Error, Message | undefined, number | undefined]> {
    return this.inner.onError;
  }

  get onClose(): Event<void> {
    return this.inner.onClose;
  }

  write(message: Message): Promise<void> {
    const request = inlineCompletionRequest(message);
    if (request) {
      this.onSent(request);
    }
    return this.inner.write(message);
  }

  end(): void {
    this.inner.end();
  }

  dispose(): void {
    this.inner.dispose();
  }
}
