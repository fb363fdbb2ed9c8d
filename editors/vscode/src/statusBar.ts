/**
 * The status-bar item: backend, model, last latency and speed, and a next edit waiting;
 * a click toggles Kode.
 */

import * as vscode from "vscode";

import type { KodeStats } from "./common/protocol";
import { formatStatus, type NextEditStatus, type ServerState } from "./common/status";

export class StatusBar implements vscode.Disposable {
  private readonly item: vscode.StatusBarItem;
  private state: ServerState = "starting";
  private stats: KodeStats | undefined;
  private enabled = true;
  private nextEdits = false;
  private nextEdit: NextEditStatus | undefined;

  constructor() {
    this.item = vscode.window.createStatusBarItem("kode.status", vscode.StatusBarAlignment.Right, 100);
    this.item.name = "Kode";
    this.item.command = "kode.toggle";
    this.render();
    this.item.show();
  }

  update(change: {
    state?: ServerState;
    stats?: KodeStats | undefined;
    enabled?: boolean;
    /** Whether `kode.nextEdits` is on. */
    nextEdits?: boolean;
    /** The next edit drawn (undefined: none). */
    nextEdit?: NextEditStatus | undefined;
  }): void {
    if (change.state !== undefined) {
      this.state = change.state;
    }
    if ("stats" in change) {
      this.stats = change.stats ?? this.stats;
    }
    if (change.enabled !== undefined) {
      this.enabled = change.enabled;
    }
    if (change.nextEdits !== undefined) {
      this.nextEdits = change.nextEdits;
    }
    if ("nextEdit" in change) {
      this.nextEdit = change.nextEdit;
    }
    this.render();
  }

  dispose(): void {
    this.item.dispose();
  }

  private render(): void {
    const view = formatStatus(this.state, this.enabled, this.stats, { on: this.nextEdits, waiting: this.nextEdit });
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
  }
}
