/**
 * Which `kode.*` settings go to the server, and in what shape.
 *
 * The server takes one camelCase object (`initializationOptions`, and the same object in
 * `workspace/didChangeConfiguration`) and rejects keys it does not know, so the client
 * sends exactly the server's settings: client-only ones (`serverPath`, `trace`) stay here.
 */

/** Top-level server settings, in the order of the table in editors/README.md. */
export const SERVER_KEYS = [
  "enabled",
  "backend",
  "localEngine",
  "engine",
  "engineIdleMinutes",
  "model",
  "draftModel",
  "template",
  "maxTokens",
  "temperature",
  "topP",
  "seed",
  "speculation",
  "multiline",
  "maxLines",
  "structuralStops",
  "prefixTokens",
  "suffixTokens",
  "movedSuffixDrift",
  "snippetTokens",
  "retrievalTokens",
  "workspaceIndex",
  "indexMaxFiles",
  "indexMaxFileBytes",
  "contextSize",
  "threads",
  "logPrompts",
  "partialCompletions",
  "timeBudgetMs",
  "prefetch",
  "readAhead",
  "tokenHealing",
  "namesMonitor",
  "firstAnswerMs",
  "kvMemoryMb",
  "chunkMemoryMb",
] as const;

/** Keys of the nested `remote` object. */
export const REMOTE_KEYS = ["url", "api", "apiKey", "model", "timeoutMs", "latencyBudgetMs"] as const;

/** Settings read by the extension itself, never sent. */
export const CLIENT_KEYS = ["serverPath", "trace"] as const;

export const BACKENDS = ["local", "remote", "auto"] as const;
export type Backend = (typeof BACKENDS)[number];

export type ServerSettings = Partial<Record<(typeof SERVER_KEYS)[number], unknown>> & {
  remote?: Partial<Record<(typeof REMOTE_KEYS)[number], unknown>>;
};

/** Reads one key of the `kode` section (`WorkspaceConfiguration.get` fits). */
export type Reader = (key: string) => unknown;

/**
 * The object the server gets, from the `kode` configuration section.
 *
 * Unset (`undefined`) values are left out so the server applies its own default;
 * `null` is kept because it is a real value (`seed: null` means "no seed").
 */
export function toServerSettings(read: Reader): ServerSettings {
  const out: ServerSettings = {};
  for (const key of SERVER_KEYS) {
    const value = read(key);
    if (value !== undefined) {
      out[key] = value;
    }
  }
  const remote: NonNullable<ServerSettings["remote"]> = {};
  for (const key of REMOTE_KEYS) {
    const value = read(`remote.${key}`);
    if (value !== undefined) {
      remote[key] = value;
    }
  }
  if (Object.keys(remote).length > 0) {
    out.remote = remote;
  }
  return out;
}

export function isBackend(value: unknown): value is Backend {
  return typeof value === "string" && (BACKENDS as readonly string[]).includes(value);
}
