// The event half of an anywidget model (`on`/`off`/`emit`, space-separated event names), shared by
// browser-side models (run/local.ts: one rank's thermometer) and the test fake model.

export type Cb = (...args: any[]) => void;

export class Emitter {
  handlers = new Map<string, Cb[]>();

  on(event: string, cb: Cb): void {
    for (const ev of event.split(/\s+/)) this.handlers.set(ev, [...(this.handlers.get(ev) ?? []), cb]);
  }

  off(event?: string | null, cb?: Cb | null): void {
    if (!event) {
      this.handlers.clear();
      return;
    }
    for (const ev of event.split(/\s+/)) {
      if (!cb) this.handlers.delete(ev);
      else this.handlers.set(ev, (this.handlers.get(ev) ?? []).filter((f) => f !== cb));
    }
  }

  emit(event: string, ...args: any[]): void {
    for (const cb of [...(this.handlers.get(event) ?? [])]) cb(...args);
  }
}
