// Navigation keys pressed in a control of ours are ours. JupyterLab and Notebook 7 match their
// command-mode shortcuts (ArrowDown selects the next cell, Enter edits it) starting at the focused
// element, before the widget sees the key, unless that element carries
// `data-lm-suppress-shortcuts`. A static marker would also swallow Shift+Enter, Ctrl+S, Esc, A/B…
// while a row has focus, so the marker is set only for the one keydown we handle (plain arrows,
// Home/End, PageUp/PageDown, Enter, Space) by a window-level capture listener (it runs before
// lumino's document-level one) and removed right after the event.

const MARK = "data-nbd-keys";
const SUPPRESS = "data-lm-suppress-shortcuts";
const OWN = new Set(["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Home", "End", "PageUp", "PageDown", "Enter", " "]);
const FLAG = "__nbdebugKeyGuard";

/** The element's plain navigation keys go to it, not to the notebook's shortcuts. */
export function ownKeys(el: Element): void {
  el.setAttribute(MARK, "");
  install();
}

/** Whether a keydown on `target` is one of ours (exported for tests). */
export function isOwnKey(target: EventTarget | null, ev: Pick<KeyboardEvent, "key" | "ctrlKey" | "metaKey" | "altKey" | "shiftKey">): boolean {
  if (!target || typeof (target as Element).hasAttribute !== "function" || !(target as Element).hasAttribute(MARK)) return false;
  return !(ev.ctrlKey || ev.metaKey || ev.altKey || ev.shiftKey) && OWN.has(ev.key);
}

function install(): void {
  if (typeof window === "undefined") return;
  const d = document as unknown as Record<string, boolean>;
  if (d[FLAG]) return; // one listener per page, however many views (each bundle has its own module)
  d[FLAG] = true;
  window.addEventListener("keydown", (ev: KeyboardEvent) => {
    const t = ev.target as Element | null;
    if (t && isOwnKey(t, ev)) {
      t.setAttribute(SUPPRESS, "true");
      setTimeout(() => t.removeAttribute(SUPPRESS), 0);
    } else if (t && typeof t.removeAttribute === "function" && t.hasAttribute(SUPPRESS) && t.hasAttribute(MARK)) {
      t.removeAttribute(SUPPRESS); // a key of the notebook's right after one of ours
    }
  }, true);
}
