/**
 * Kode's additions to LSP, as plain types (no `vscode` import, so tests run under node).
 *
 * - `kode/stats` (request): backend, model, counters and active settings.
 * - `kode/inlineCompletionPartial` (notification): the suggestion so far while a
 *   multi-line completion grows; sent only when `partialCompletions` is on.
 * - `kode/inlineEdit` (request): the next edit, which may lie away from the cursor; answered
 *   only when `nextEdits` is on.
 */

export const INLINE_COMPLETION_METHOD = "textDocument/inlineCompletion";
export const STATS_METHOD = "kode/stats";
export const PARTIAL_METHOD = "kode/inlineCompletionPartial";
/** Client -> server notification: the cursor rests here (docs/protocol.md). */
export const CURSOR_METHOD = "kode/didMoveCursor";
/** Client -> server request: the next edit (docs/protocol.md, `kode/inlineEdit`). */
export const INLINE_EDIT_METHOD = "kode/inlineEdit";

/** JSON-RPC `RequestCancelled`: the answer to a request cancelled with `$/cancelRequest`. */
export const REQUEST_CANCELLED = -32800;

export interface LspPosition {
  line: number;
  character: number;
}

export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}

export interface InlineEditParams {
  textDocument: { uri: string; version: number };
  position: LspPosition;
}

/** One edit of a `kode/inlineEdit` answer: replace `range` of that version with `text`. */
export interface InlineEdit {
  textDocument: { uri: string; version: number };
  range: LspRange;
  text: string;
}

export interface PartialParams {
  /** The JSON-RPC id of the `textDocument/inlineCompletion` request this text belongs to. */
  requestId: number | string;
  textDocument: { uri: string; version: number };
  position: LspPosition;
  /** The whole suggestion so far; each notification extends the previous one. */
  text: string;
}

export interface LastGeneration {
  promptTokens: number;
  reusedPromptTokens: number;
  evaluatedPromptTokens: number;
  completionTokens: number;
  decodeSteps: number;
  stepsAfterCancel: number;
  finishReason: string | null;
  ttftMs: number;
  totalMs: number;
  speculation: { method: string; steps: number; drafted: number; acceptedMean: number };
}

export interface Counters {
  generations: number;
  cancelled: number;
  decodeCalls: number;
  generationSteps: number;
  stepsAfterCancel: number;
  promptTokens: number;
  promptTokensReused: number;
  promptTokensEvaluated: number;
  completionTokens: number;
  last: LastGeneration;
}

/** The last non-empty answer (docs/protocol.md, `kode/stats`). */
export interface LastCompletion {
  /** From the request to its answer (0 for one typed ahead). */
  answerMs: number;
  fromCache: boolean;
  /** The generation that made it. */
  completionTokens: number;
  ttftMs: number;
  generationMs: number;
  /** Decode speed after the first token; null with fewer than two tokens. */
  tokensPerS: number | null;
}

export interface KodeStats {
  backend: string | null;
  model: string | null;
  counters: Counters | null;
  /** Null until a completion was answered (absent from older servers). */
  lastCompletion?: LastCompletion | null;
  settings: Record<string, unknown>;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Checks a notification's shape at the edge; anything malformed is ignored, not drawn. */
export function isPartialParams(value: unknown): value is PartialParams {
  if (!isRecord(value)) {
    return false;
  }
  const { requestId, textDocument, position, text } = value;
  return (
    (typeof requestId === "number" || typeof requestId === "string") &&
    isRecord(textDocument) &&
    typeof textDocument.uri === "string" &&
    typeof textDocument.version === "number" &&
    isRecord(position) &&
    typeof position.line === "number" &&
    typeof position.character === "number" &&
    typeof text === "string"
  );
}

function isPosition(value: unknown): value is LspPosition {
  return (
    isRecord(value) &&
    Number.isInteger(value.line) &&
    Number.isInteger(value.character) &&
    (value.line as number) >= 0 &&
    (value.character as number) >= 0
  );
}

function isRange(value: unknown): value is LspRange {
  if (!isRecord(value) || !isPosition(value.start) || !isPosition(value.end)) {
    return false;
  }
  const { start, end } = value;
  return start.line < end.line || (start.line === end.line && start.character <= end.character);
}

function isInlineEdit(value: unknown): value is InlineEdit {
  if (!isRecord(value)) {
    return false;
  }
  const { textDocument, range, text } = value;
  return (
    isRecord(textDocument) &&
    typeof textDocument.uri === "string" &&
    typeof textDocument.version === "number" &&
    isRange(range) &&
    typeof text === "string"
  );
}

/**
 * The well-formed edits of a `kode/inlineEdit` answer (`{"edits": [...]}`); a malformed
 * edit is left out, a malformed answer gives none: nothing is drawn from it.
 */
export function inlineEdits(value: unknown): InlineEdit[] {
  if (!isRecord(value) || !Array.isArray(value.edits)) {
    return [];
  }
  return (value.edits as unknown[]).filter(isInlineEdit);
}
