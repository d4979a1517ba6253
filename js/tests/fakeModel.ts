// A stand-in for the anywidget model: traits in a Map, change events, custom messages.
// `respond` decides how the "kernel" answers requests sent with rpc().
import type { AnyModel } from "../src/lib/rpc";
import { Emitter } from "../src/lib/events";


export interface Sent {
  content: any;
  buffers?: unknown;
}

export class FakeModel extends Emitter implements AnyModel {
  traits = new Map<string, any>();
  sent: Sent[] = [];
  saves = 0;
  respond: ((content: any) => { msg: any; buffers?: (DataView | ArrayBuffer)[] } | null) | null = null;

  constructor(initial: Record<string, any> = {}) {
    super();
    for (const [k, v] of Object.entries(initial)) this.traits.set(k, v);
  }
  get(name: string): any {
    return this.traits.get(name);
  }
  set(name: string, value: any): void {
    const old = this.traits.get(name);
    this.traits.set(name, value);
    if (old !== value) this.emit(`change:${name}`, value);
  }
  save_changes(): void {
    this.saves++;
  }
  listenerCount(): number {
    let n = 0;
    for (const cbs of this.handlers.values()) n += cbs.length;
    return n;
  }
  send(content: any, _callbacks?: any, buffers?: any): void {
    this.sent.push({ content, buffers });
    const answer = this.respond?.(content);
    if (answer) queueMicrotask(() => this.emit("msg:custom", answer.msg, answer.buffers));
  }
}

/** float32 values as a DataView at `at` bytes inside a larger buffer (like ipywidgets buffers). */
export function f32View(values: ArrayLike<number>, at = 0): DataView {
  const buf = new ArrayBuffer(at + values.length * 4 + 3);
  const dv = new DataView(buf, at, values.length * 4);
  for (let i = 0; i < values.length; i++) dv.setFloat32(i * 4, values[i], true);
  return dv;
}
