/** What the status-bar item says, from `kode/stats` (pure, so it is unit-tested). */

import type { KodeStats } from "./protocol";

export type ServerState = "starting" | "running" | "stopped" | "failed";

export interface StatusView {
  text: string;
  tooltip: string;
}

/** A next edit drawn in the editor (`kode/inlineEdit`). */
export interface NextEditStatus {
  /** Its first line, 0-based. */
  line: number;
  /** The cursor is on its lines: Tab applies it (else Tab jumps there). */
  atCursor: boolean;
}

export interface NextEditsView {
  /** Whether `kode.nextEdits` is on. */
  on: boolean;
  waiting?: NextEditStatus | undefined;
}

export interface Latency {
  /** How long the last answer took. */
  totalMs: number;
  /** Its generation's decode speed after the first token; undefined when too few tokens to tell. */
  tokensPerSecond: number | undefined;
}

/**
 * The last answer's latency and speed (`lastCompletion` of `kode/stats`). Not the
 * backend's last generation (`counters.last`): that is often a one-token background
 * preparation, which showed as `176 ms · 10000 tok/s` after an answer of 13 s.
 */
export function lastLatency(stats: KodeStats | undefined): Latency | undefined {
  const last = stats?.lastCompletion;
  if (!last) {
    return undefined;
  }
  const speed = last.tokensPerS;
  return { totalMs: last.answerMs, tokensPerSecond: speed !== null && speed > 0 ? speed : undefined };
}

/** `qwen2.5-coder-0.5b-instruct.gguf` -> `qwen2.5-coder-0.5b-instruct`. */
export function shortModel(model: string | null | undefined): string | undefined {
  if (!model) {
    return undefined;
  }
  const base = model.split(/[\\/]/).pop() ?? model;
  return base.replace(/\.gguf$/i, "");
}

export function formatStatus(
  state: ServerState,
  enabled: boolean,
  stats: KodeStats | undefined,
  next: NextEditsView = { on: false },
): StatusView {
  if (state === "failed") {
    return { text: "$(error) Kode", tooltip: "Kode: the language server is not running (see the Kode output)" };
  }
  if (state === "starting") {
    return { text: "$(loading~spin) Kode", tooltip: "Kode: starting the language server" };
  }
  if (state === "stopped") {
    return { text: "$(debug-stop) Kode", tooltip: "Kode: the language server is stopped" };
  }
  if (!enabled) {
    return { text: "$(circle-slash) Kode", tooltip: "Kode: completions are off (click to turn on)" };
  }
  const backend = stats?.backend ?? undefined;
  const model = shortModel(stats?.model);
  const route = typeof stats?.settings.backend === "string" ? stats.settings.backend : undefined;
  const latency = lastLatency(stats);
  const parts: string[] = [];
  if (backend) {
    parts.push(model ? `${backend} ${model}` : backend);
  }
  if (latency) {
    parts.push(`${Math.round(latency.totalMs)} ms`);
    if (latency.tokensPerSecond !== undefined) {
      parts.push(`${latency.tokensPerSecond.toFixed(0)} tok/s`);
    }
  }
  const lines = [
    "Kode: completions are on (click to turn off)",
    `backend: ${backend ?? "not loaded yet"}${route ? ` (setting: ${route})` : ""}`,
    `model: ${model ?? "not loaded yet"}`,
  ];
  if (latency) {
    const tps = latency.tokensPerSecond === undefined ? "" : `, ${latency.tokensPerSecond.toFixed(1)} tokens/s`;
    lines.push(`last completion: ${latency.totalMs.toFixed(0)} ms${tps}`);
  }
  const waiting = next.on ? next.waiting : undefined;
  if (waiting) {
    // First, so a narrow status bar still shows it.
    parts.unshift(`$(arrow-right) next edit: line ${String(waiting.line + 1)}`);
    const tab = waiting.atCursor ? "Tab applies it" : "Tab jumps to it, Tab again applies it";
    lines.push(`next edit waiting at line ${String(waiting.line + 1)}: ${tab}, Escape dismisses it`);
  } else {
    lines.push(`next edits: ${next.on ? "on" : "off"} (Kode: Toggle Next Edits)`);
  }
  const text = parts.length > 0 ? `$(sparkle) Kode: ${parts.join(" · ")}` : "$(sparkle) Kode";
  return { text, tooltip: lines.join("\n") };
}
