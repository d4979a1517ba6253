// Request/response over the widget's custom messages (the Python side is NBWidget in
// nbdebug/widgets/_base.py). Heavy payloads are fetched on demand with `rpc(model, method, params)`;
// the answer carries JSON in `result` and named binary arrays in `arrays`.
import { decode, type DType, type NdArray } from "./ndarray";

export interface AnyModel {
  get(name: string): any;
  set(name: string, value: any): void;
  save_changes(): void;
  on(event: string, cb: (...args: any[]) => void): void;
  off(event?: string | null, cb?: ((...args: any[]) => void) | null): void;
  send(content: any, callbacks?: any, buffers?: ArrayBuffer[] | ArrayBufferView[]): void;
}

export interface RpcAnswer<R = any> {
  result: R;
  arrays: Record<string, NdArray>;
}

interface ArrayMeta {
  dtype: DType;
  shape: number[];
  buffer: number;
}

let counter = 0;

/** Send `method(params)` to the kernel and resolve with its answer (rejects with its error). */
export function rpc<R = any>(
  model: AnyModel,
  method: string,
  params: Record<string, unknown> = {},
  timeoutMs = 60_000,
): Promise<RpcAnswer<R>> {
  const id = `${Date.now().toString(36)}-${++counter}`;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      model.off("msg:custom", onMsg);
      reject(new Error(`nbdebug: no answer to ${method} after ${timeoutMs / 1000} s (is the kernel running?)`));
    }, timeoutMs);
    function onMsg(msg: any, buffers?: (DataView | ArrayBuffer)[]) {
      if (!msg || msg.type !== "response" || msg.id !== id) return;
      clearTimeout(timer);
      model.off("msg:custom", onMsg);
      if (!msg.ok) {
        reject(new Error(msg.error || `nbdebug: ${method} failed`));
        return;
      }
      const arrays: Record<string, NdArray> = {};
      const meta: Record<string, ArrayMeta> = msg.arrays || {};
      for (const [name, m] of Object.entries(meta)) {
        const buf = buffers?.[m.buffer];
        if (!buf) {
          reject(new Error(`nbdebug: answer to ${method} lacks buffer ${m.buffer}`));
          return;
        }
        try {
          arrays[name] = decode({ view: buf, dtype: m.dtype, shape: m.shape });
        } catch (err) {
          // A malformed answer must reject, not throw inside the message handler and hang.
          reject(err instanceof Error ? err : new Error(String(err)));
          return;
        }
      }
      resolve({ result: msg.result, arrays });
    }
    model.on("msg:custom", onMsg);
    model.send({ type: "request", id, method, params });
  });
}
