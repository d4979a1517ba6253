// Mounting a view's `render` on a fake model in happy-dom, and undoing it (shared by the view tests).
import type { FakeModel } from "./fakeModel";

type Render = (a: { model: FakeModel; el: HTMLElement }) => () => void;

let cleanups: (() => void)[] = [];

/** A macrotask: lets queued RPC answers (microtasks) and their follow-ups run. */
export const tick = () => new Promise((r) => setTimeout(r, 0));

/** Render into a fresh element attached to the document; `unmountAll` runs the view's cleanup. */
export function mount(render: Render, m: FakeModel): HTMLElement {
  const el = document.createElement("div");
  document.body.appendChild(el);
  cleanups.push(render({ model: m, el }));
  return el;
}

/** Run every mounted view's cleanup function and empty the document (use in `afterEach`). */
export function unmountAll(): void {
  const pending = cleanups;
  cleanups = [];
  pending.forEach((c) => c());
  document.body.replaceChildren();
}
