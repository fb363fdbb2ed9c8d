/** Fakes and helpers shared by the tests (no `vscode` module under node). */

import * as fs from "node:fs";
import * as path from "node:path";

import type { CancellationLike, SourceLike } from "../common/streaming";

export class FakeSource implements SourceLike<FakeSource> {
  cancelled = false;
  disposed = false;
  private readonly listeners = new Set<() => void>();

  get token(): this {
    return this;
  }

  get isCancellationRequested(): boolean {
    return this.cancelled;
  }

  onCancellationRequested(listener: () => void): { dispose(): void } {
    this.listeners.add(listener);
    return {
      dispose: () => {
        this.listeners.delete(listener);
      },
    };
  }

  cancel(): void {
    if (!this.cancelled) {
      this.cancelled = true;
      for (const listener of [...this.listeners]) {
        listener();
      }
    }
  }

  dispose(): void {
    this.disposed = true;
  }
}

export const NEVER: CancellationLike = new FakeSource();

export interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** package.json's `kode.*` settings with their defaults. */
export function contributedDefaults(): Map<string, unknown> {
  const file = path.join(__dirname, "..", "..", "package.json");
  const manifest = JSON.parse(fs.readFileSync(file, "utf8")) as {
    contributes: { configuration: { properties: Record<string, { default?: unknown }> } };
  };
  const out = new Map<string, unknown>();
  for (const [name, schema] of Object.entries(manifest.contributes.configuration.properties)) {
    out.set(name, schema.default);
  }
  return out;
}

interface Keybinding {
  command: string;
  key: string;
  when: string;
}

/** package.json's keybindings. */
export function keybindings(): Keybinding[] {
  const file = path.join(__dirname, "..", "..", "package.json");
  const manifest = JSON.parse(fs.readFileSync(file, "utf8")) as { contributes: { keybindings: Keybinding[] } };
  return manifest.contributes.keybindings;
}

/**
 * The command package.json binds to `key` when the context keys in `context` are true
 * and all others false (its `when` clauses are plain `&&`s of keys and `!key`s).
 */
export function boundCommand(key: string, context: Set<string>): string | undefined {
  const holds = (term: string): boolean =>
    term.startsWith("!") ? !context.has(term.slice(1)) : context.has(term);
  return keybindings().find(
    (binding) => binding.key === key && binding.when.split("&&").every((term) => holds(term.trim())),
  )?.command;
}
