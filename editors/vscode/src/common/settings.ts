/**
 * Which `kode.*` settings go to the server, and in what shape.
 *
 * The server takes one camelCase object (`initializationOptions`, and the same object in
 * `workspace/didChangeConfiguration`) and rejects keys it does not know, so the client
 * sends only server settings: client-only ones (`serverPath`, `trace`) stay here.
 *
 * Only what the user set is sent: a key set nowhere is left out, so the server's own
 * default (completion/settings.py) applies, not the copy package.json shows in the
 * Settings UI. The server reads each object whole, so a key the user removes goes back
 * to the server's default. The one exception is CLIENT_DEFAULTS.
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
  "nextEdits",
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

/**
 * Server settings whose value in this client differs from the server's default, sent
 * when the user set nothing: this extension draws `kode/inlineCompletionPartial`, which
 * the server sends only when asked. package.json shows these values as the defaults;
 * tests/unit/test_setting_defaults.py checks every other default there against the
 * server's.
 */
export const CLIENT_DEFAULTS: Readonly<ServerSettings> = { partialCompletions: true };

/**
 * Where VS Code found a setting (`WorkspaceConfiguration.inspect`): the default and
 * language-specific values are not read, as the server gets one object for every
 * language (the section is read without a language scope).
 */
export interface Inspected {
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

/**
 * The value the user set, most specific first (folder, workspace, user settings);
 * `undefined` when set nowhere, so package.json's `default` is never taken. `null` is a
 * value the user set (`seed: null`), not a gap to fall through.
 */
export function userValue(info: Inspected | undefined): unknown {
  if (info === undefined) {
    return undefined;
  }
  for (const value of [info.workspaceFolderValue, info.workspaceValue, info.globalValue]) {
    if (value !== undefined) {
      return value;
    }
  }
  return undefined;
}

/** The value the user set for one key of the `kode` section, `undefined` if none. */
export type Reader = (key: string) => unknown;

/**
 * The object the server gets, from what the user set in the `kode` section.
 *
 * Unset (`undefined`) values are left out so the server applies its own default (or
 * CLIENT_DEFAULTS' value); a value equal to the default is sent (the user set it);
 * `null` is kept because it is a real value (`seed: null` means "no seed").
 */
export function toServerSettings(read: Reader): ServerSettings {
  const out: ServerSettings = {};
  for (const key of SERVER_KEYS) {
    const value = read(key);
    if (value !== undefined) {
      out[key] = value;
    } else if (key in CLIENT_DEFAULTS) {
      out[key] = CLIENT_DEFAULTS[key];
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
