// The latest-request guard and listeners with one cleanup: what every view that asks the kernel on a
// click needs. A click may be answered after a newer click (or after the view was closed): only the
// latest request's answer is drawn. `Listeners` remembers each `model.on` / `addEventListener` so that
// a view's cleanup is one `dispose()`.
import type { AnyModel } from "./rpc";

/** Only the latest request counts: `start()` begins one and returns whether it is still current. */
export class Latest {
  private n = 0;
  private closed = false;

  /** Begin a request; the returned function is true while no newer request began and the owner lives. */
  start(): () => boolean {
    const id = ++this.n;
    return () => id === this.n && !this.closed;
  }

  /** Supersede whatever is in flight (a cleared panel, a new selection). */
  cancel(): void {
    this.n++;
  }

  /** The owner is gone: every answer still in flight is dropped. */
  dispose(): void {
    this.closed = true;
    this.n++;
  }

  get disposed(): boolean {
    return this.closed;
  }

  /** Setting `disposed = true` is `dispose()` (the views' panels are closed this way). */
  set disposed(value: boolean) {
    if (value) this.dispose();
  }
}

type Handler = (...args: any[]) => void;

/** Model and DOM listeners registered through it are all removed by one `dispose()`. */
export class Listeners {
  private offs: (() => void)[] = [];

  /** `model.on(event, cb)`, undone by `dispose()`. */
  model(model: AnyModel, event: string, cb: Handler): void {
    model.on(event, cb);
    this.offs.push(() => model.off(event, cb));
  }

  /** `target.addEventListener(type, cb)`, undone by `dispose()`. */
  dom(target: EventTarget, type: string, cb: EventListener, options?: AddEventListenerOptions): void {
    target.addEventListener(type, cb, options);
    this.offs.push(() => target.removeEventListener(type, cb, options));
  }

  /** Any other cleanup to run with the listeners' (a timer, an observer). */
  add(off: () => void): void {
    this.offs.push(off);
  }

  /** Remove every listener (last registered first); a second call does nothing. */
  dispose(): void {
    for (const off of this.offs.splice(0).reverse()) off();
  }
}
